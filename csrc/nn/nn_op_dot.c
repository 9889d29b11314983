/*
 * nn_op_dot.c - Dot: the dot product of two inputs along their last axis,
 * the two-tower score. Each input is [B, C] (a [B, 1, C] sample is stored
 * so too); the output is [B, 1]: o[b] = sum_c x[b, c] * y[b, c]. With
 * `normalize` (LayerSpec.normalize) each input is first L2-normalized along
 * that axis as Keras does it: x * min(1 / sqrt(sum_c x^2), 1 / eps) with
 * Keras' epsilon 1e-7 (keras.ops.normalize), so o is the cosine similarity
 * and an all-zero row gives 0. Plain C loops over the batch.
 *
 * Not done: Keras' Dot on other axes or on inputs with more than one
 * non-batch axis of size > 1 (a batched matrix product), which the flat
 * outputs of this engine do not need.
 */
#include "nn/nn_op.h"

#include <math.h>
#include <string.h>

/* 1 / Keras' epsilon (keras.config.epsilon(), 1e-7): the largest inverse
 * norm normalize uses. */
#define DOT_MAX_INV_NORM 1e7f

static int dot_infer(Model *m, int l, SgError *err)
{
    LayerShape *s = &m->shapes[l];
    if (m->nodes[l].ninputs != 2)
        return sg_fail(err, SG_EMODEL, "layer %d (Dot) reads exactly 2 tensors, not %d", l,
                       m->nodes[l].ninputs);
    for (int k = 0; k < 2; k++) {
        const NnShape *x = op_in_shape(m, l, k);
        if (x->h != 1 || x->w != 1)
            return sg_fail(err, SG_EMODEL,
                           "layer %d (Dot): input %d (tensor %d) is %dx%dx%d; Dot takes inputs of "
                           "shape [batch, d] (or [batch, 1, d]) and contracts their last axis",
                           l, k, node_in(m, l, k), x->h, x->w, x->c);
    }
    const NnShape *y = op_in_shape(m, l, 1);
    if (y->c != s->c)
        return sg_fail(err, SG_EMODEL,
                       "layer %d (Dot): input 1 (tensor %d) has %d values on the contracted last "
                       "axis and input 0 (tensor %d) %d; they must be equal",
                       l, node_in(m, l, 1), y->c, node_in(m, l, 0), s->c);
    s->oh = 1, s->ow = 1, s->oc = 1;
    return 0;
}

/* The inverse norm normalize multiplies row x[C] by; *clamped: 1 where
 * it is 1 / eps, a constant (no gradient through the norm). As Keras, the
 * norm's inverse is taken unless it exceeds 1 / eps (TensorFlow's gradient
 * of minimum(a, b) goes to a where a <= b). */
static float inv_norm(const float *x, int C, int *clamped)
{
    double ss = 0.0;
    for (int c = 0; c < C; c++)
        ss += (double)x[c] * x[c];
    const float r = 1.0f / sqrtf((float)ss);
    *clamped = !(r <= DOT_MAX_INV_NORM);
    return *clamped ? DOT_MAX_INV_NORM : r;
}

static double dot_row(const float *x, const float *y, int C)
{
    double s = 0.0;
    for (int c = 0; c < C; c++)
        s += (double)x[c] * y[c];
    return s;
}

/* dst[B] = (x[B, C] * ix) . (y[B, C] * iy), ix, iy the inverse norms (1
 * without normalize). */
static int dot_forward(Model *m, Plan *p, int l, int training, SgError *err)
{
    (void)training;
    const int C = m->shapes[l].c, normalize = m->specs[l].normalize;
    const float *x = op_src(m, p, l, 0), *y = op_src(m, p, l, 1);
    float *dst = op_dst(m, p, l);
    int rc = DNNL(err, dnnl_stream_wait, m->stream);
    if (rc < 0)
        return rc;
#pragma omp parallel for schedule(static) if ((size_t)p->B * C > 65536)
    for (int b = 0; b < p->B; b++) {
        const float *xb = x + (size_t)b * C, *yb = y + (size_t)b * C;
        int cx, cy;
        const float ix = normalize ? inv_norm(xb, C, &cx) : 1.0f;
        const float iy = normalize ? inv_norm(yb, C, &cy) : 1.0f;
        dst[b] = (float)((double)ix * iy * dot_row(xb, yb, C));
    }
    return 0;
}

/* Without normalize: dx = g * y, dy = g * x. With it, x^ = x * ix and
 * o = x^ . y^: dx = ix * g * (y^ - x^ * o), the second term only where the
 * norm was not clamped; dy likewise. */
static int dot_backward(Model *m, Plan *p, int l, const NnOpBackward *how, SgError *err)
{
    (void)how;
    const int C = m->shapes[l].c, normalize = m->specs[l].normalize;
    const float *x = op_src(m, p, l, 0), *y = op_src(m, p, l, 1), *ddst = op_ddst(m, p, l);
    float *dx = op_dsrc(p, l, 0), *dy = op_dsrc(p, l, 1);
    int rc = DNNL(err, dnnl_stream_wait, m->stream);
    if (rc < 0)
        return rc;
#pragma omp parallel for schedule(static) if ((size_t)p->B * C > 65536)
    for (int b = 0; b < p->B; b++) {
        const size_t at = (size_t)b * C;
        const float *xb = x + at, *yb = y + at, g = ddst[b];
        int cx = 1, cy = 1;
        const float ix = normalize ? inv_norm(xb, C, &cx) : 1.0f;
        const float iy = normalize ? inv_norm(yb, C, &cy) : 1.0f;
        /* o: the normalized rows' product (only read where a norm is not clamped) */
        const float o = (float)((double)ix * iy * dot_row(xb, yb, C));
        for (int c = 0; c < C; c++) {
            const float xh = xb[c] * ix, yh = yb[c] * iy;
            if (dx != NULL)
                dx[at + c] = ix * g * (yh - (cx ? 0.0f : xh * o));
            if (dy != NULL)
                dy[at + c] = iy * g * (xh - (cy ? 0.0f : yh * o));
        }
    }
    return 0;
}

const NnOpKind nn_op_dot = {
    "Dot", NN_OP_MERGE | NN_OP_FOLDS_SGD, dot_infer, NULL, NULL, dot_forward, dot_backward,
};
