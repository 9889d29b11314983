/*
 * nn_op_merge.c - the ops that read several tensors (NN_OP_MERGE): Add (an
 * elementwise sum of inputs of one shape) and Concatenate (along the last
 * axis, the channels, of inputs alike in every other). Plain C loops over
 * the batch: no parameters, so plain SGD folds around them.
 */
#include "nn/nn_op.h"

#include <string.h>

/* SG_EMODEL naming the layer, its inputs k and 0 and their shapes. */
static int shape_mismatch(const Model *m, int l, int k, const char *rule, SgError *err)
{
    const NnShape *a = op_in_shape(m, l, 0), *b = op_in_shape(m, l, k);
    return sg_fail(err, SG_EMODEL,
                   "layer %d (%s): input %d (tensor %d) is %dx%dx%d and input 0 (tensor %d) "
                   "%dx%dx%d; %s",
                   l, nn_op_of(m, l)->name, k, node_in(m, l, k), b->h, b->w, b->c, node_in(m, l, 0),
                   a->h, a->w, a->c, rule);
}

static int add_infer(Model *m, int l, SgError *err)
{
    LayerShape *s = &m->shapes[l];
    for (int k = 1; k < m->nodes[l].ninputs; k++) {
        const NnShape *b = op_in_shape(m, l, k);
        if (b->h != s->h || b->w != s->w || b->c != s->c)
            return shape_mismatch(m, l, k, "Add needs inputs of one shape", err);
    }
    s->oh = s->h, s->ow = s->w, s->oc = s->c;
    return 0;
}

static int add_forward(Model *m, Plan *p, int l, int training, SgError *err)
{
    (void)training;
    const size_t n = (size_t)p->B * nn_op_out_size(m, l);
    float *dst = op_dst(m, p, l);
    int rc = DNNL(err, dnnl_stream_wait, m->stream); /* the CPU reads what primitives wrote */
    if (rc < 0)
        return rc;
    memcpy(dst, op_src(m, p, l, 0), n * sizeof(float));
    for (int k = 1; k < m->nodes[l].ninputs; k++) {
        const float *src = op_src(m, p, l, k);
#pragma omp parallel for simd schedule(static) if (n > 65536)
        for (size_t i = 0; i < n; i++)
            dst[i] += src[i];
    }
    return 0;
}

/* Each input's gradient is the output's. */
static int add_backward(Model *m, Plan *p, int l, const NnOpBackward *how, SgError *err)
{
    (void)how;
    const size_t n = (size_t)p->B * nn_op_out_size(m, l);
    int rc = DNNL(err, dnnl_stream_wait, m->stream);
    if (rc < 0)
        return rc;
    for (int k = 0; k < m->nodes[l].ninputs; k++)
        if (op_dsrc(p, l, k) != NULL)
            memcpy(op_dsrc(p, l, k), op_ddst(m, p, l), n * sizeof(float));
    return 0;
}

const NnOpKind nn_op_add = {
    "Add", NN_OP_MERGE | NN_OP_FOLDS_SGD, add_infer, NULL, NULL, add_forward, add_backward,
};

static int concatenate_infer(Model *m, int l, SgError *err)
{
    LayerShape *s = &m->shapes[l];
    int c = s->c;
    for (int k = 1; k < m->nodes[l].ninputs; k++) {
        const NnShape *b = op_in_shape(m, l, k);
        if (b->h != s->h || b->w != s->w)
            return shape_mismatch(
                m, l, k, "Concatenate joins the last axis of inputs alike in the others", err);
        c += b->c;
    }
    s->oh = s->h, s->ow = s->w, s->oc = c;
    return 0;
}

/* Copies between the output's rows [rows, oc] and each input's [rows, c_k]
 * at its column offset: into the output (forward) or out of it (backward,
 * into the inputs' gradients). */
static void concat_copy(Model *m, Plan *p, int l, int backward)
{
    const LayerShape *s = &m->shapes[l];
    const size_t rows = (size_t)p->B * s->oh * s->ow, oc = (size_t)s->oc;
    float *out = backward ? op_ddst(m, p, l) : op_dst(m, p, l);
    size_t at = 0;
    for (int k = 0; k < m->nodes[l].ninputs; k++) {
        const size_t c = (size_t)op_in_shape(m, l, k)->c;
        float *in = backward ? op_dsrc(p, l, k) : op_src(m, p, l, k);
        if (in != NULL) {
#pragma omp parallel for schedule(static) if (rows * c > 65536)
            for (size_t r = 0; r < rows; r++) {
                if (backward)
                    memcpy(in + r * c, out + r * oc + at, c * sizeof(float));
                else
                    memcpy(out + r * oc + at, in + r * c, c * sizeof(float));
            }
        }
        at += c;
    }
}

static int concatenate_forward(Model *m, Plan *p, int l, int training, SgError *err)
{
    (void)training;
    int rc = DNNL(err, dnnl_stream_wait, m->stream);
    if (rc == 0)
        concat_copy(m, p, l, 0);
    return rc;
}

static int concatenate_backward(Model *m, Plan *p, int l, const NnOpBackward *how, SgError *err)
{
    (void)how;
    int rc = DNNL(err, dnnl_stream_wait, m->stream);
    if (rc == 0)
        concat_copy(m, p, l, 1);
    return rc;
}

const NnOpKind nn_op_concatenate = {
    "Concatenate", NN_OP_MERGE | NN_OP_FOLDS_SGD, concatenate_infer,    NULL,
    NULL,          concatenate_forward,           concatenate_backward,
};
