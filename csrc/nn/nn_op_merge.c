/*
 * nn_op_merge.c - the ops that read several tensors (NN_OP_MERGE) and keep
 * their shape or join them: the elementwise merges of inputs of one shape,
 * Add, Subtract (exactly 2), Multiply, Average, Maximum and Minimum, and
 * Concatenate (along the last axis, the channels, of inputs alike in every
 * other), with Keras 3's semantics. Plain C loops over the batch: no
 * parameters, so plain SGD folds around them. No broadcasting between
 * shapes (Keras' merges broadcast a size-1 axis; here the shapes must be
 * equal). Dot, which reduces, is in nn_op_dot.c.
 */
#include "nn/nn_op.h"

#include <stdio.h>
#include <string.h>

/* Elementwise loops parallelize beyond this many floats. */
#define MERGE_OMP_MIN 65536

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

/* ---- the elementwise merges ------------------------------------------------- */

/* Inputs of one shape, the output's. */
static int elementwise_infer(Model *m, int l, SgError *err)
{
    LayerShape *s = &m->shapes[l];
    for (int k = 1; k < m->nodes[l].ninputs; k++) {
        const NnShape *b = op_in_shape(m, l, k);
        if (b->h != s->h || b->w != s->w || b->c != s->c) {
            char rule[64];
            snprintf(rule, sizeof rule, "%s needs inputs of one shape", nn_op_of(m, l)->name);
            return shape_mismatch(m, l, k, rule, err);
        }
    }
    s->oh = s->h, s->ow = s->w, s->oc = s->c;
    return 0;
}

static int subtract_infer(Model *m, int l, SgError *err)
{
    if (m->nodes[l].ninputs != 2)
        return sg_fail(err, SG_EMODEL, "layer %d (Subtract) reads exactly 2 tensors, not %d", l,
                       m->nodes[l].ninputs);
    return elementwise_infer(m, l, err);
}

/* Floats in layer l's output for the plan's batch, once the primitives
 * before it are done (the CPU reads what they wrote); 0 on an error. */
static size_t merge_begin(Model *m, const Plan *p, int l, SgError *err, int *rc)
{
    *rc = DNNL(err, dnnl_stream_wait, m->stream);
    return *rc < 0 ? 0 : (size_t)p->B * nn_op_out_size(m, l);
}

/* Add and Average: the sum of the inputs (Average: divided by their number,
 * as Keras divides). */
static int sum_forward(Model *m, Plan *p, int l, int average, SgError *err)
{
    int rc;
    const size_t n = merge_begin(m, p, l, err, &rc);
    const int nin = m->nodes[l].ninputs;
    float *dst = op_dst(m, p, l);
    if (rc < 0)
        return rc;
    memcpy(dst, op_src(m, p, l, 0), n * sizeof(float));
    for (int k = 1; k < nin; k++) {
        const float *src = op_src(m, p, l, k);
#pragma omp parallel for simd schedule(static) if (n > MERGE_OMP_MIN)
        for (size_t i = 0; i < n; i++)
            dst[i] += src[i];
    }
    if (average) {
        const float count = (float)nin;
#pragma omp parallel for simd schedule(static) if (n > MERGE_OMP_MIN)
        for (size_t i = 0; i < n; i++)
            dst[i] /= count;
    }
    return 0;
}

/* Add: each input's gradient is the output's; Average: the output's over
 * the number of inputs. */
static int sum_backward(Model *m, Plan *p, int l, int average, SgError *err)
{
    int rc;
    const size_t n = merge_begin(m, p, l, err, &rc);
    const int nin = m->nodes[l].ninputs;
    const float *ddst = op_ddst(m, p, l), count = (float)nin;
    if (rc < 0)
        return rc;
    for (int k = 0; k < nin; k++) {
        float *dsrc = op_dsrc(p, l, k);
        if (dsrc == NULL)
            continue;
        if (!average) {
            memcpy(dsrc, ddst, n * sizeof(float));
            continue;
        }
#pragma omp parallel for simd schedule(static) if (n > MERGE_OMP_MIN)
        for (size_t i = 0; i < n; i++)
            dsrc[i] = ddst[i] / count;
    }
    return 0;
}

static int add_forward(Model *m, Plan *p, int l, int training, SgError *err)
{
    (void)training;
    return sum_forward(m, p, l, 0, err);
}

static int add_backward(Model *m, Plan *p, int l, const NnOpBackward *how, SgError *err)
{
    (void)how;
    return sum_backward(m, p, l, 0, err);
}

static int average_forward(Model *m, Plan *p, int l, int training, SgError *err)
{
    (void)training;
    return sum_forward(m, p, l, 1, err);
}

static int average_backward(Model *m, Plan *p, int l, const NnOpBackward *how, SgError *err)
{
    (void)how;
    return sum_backward(m, p, l, 1, err);
}

/* input 0 - input 1 */
static int subtract_forward(Model *m, Plan *p, int l, int training, SgError *err)
{
    (void)training;
    int rc;
    const size_t n = merge_begin(m, p, l, err, &rc);
    const float *a = op_src(m, p, l, 0), *b = op_src(m, p, l, 1);
    float *dst = op_dst(m, p, l);
    if (rc < 0)
        return rc;
#pragma omp parallel for simd schedule(static) if (n > MERGE_OMP_MIN)
    for (size_t i = 0; i < n; i++)
        dst[i] = a[i] - b[i];
    return 0;
}

/* The output's gradient to input 0, its negation to input 1. */
static int subtract_backward(Model *m, Plan *p, int l, const NnOpBackward *how, SgError *err)
{
    (void)how;
    int rc;
    const size_t n = merge_begin(m, p, l, err, &rc);
    const float *ddst = op_ddst(m, p, l);
    float *da = op_dsrc(p, l, 0), *db = op_dsrc(p, l, 1);
    if (rc < 0)
        return rc;
    if (da != NULL)
        memcpy(da, ddst, n * sizeof(float));
    if (db != NULL) {
#pragma omp parallel for simd schedule(static) if (n > MERGE_OMP_MIN)
        for (size_t i = 0; i < n; i++)
            db[i] = -ddst[i];
    }
    return 0;
}

/* The product of the inputs, left to right. */
static int multiply_forward(Model *m, Plan *p, int l, int training, SgError *err)
{
    (void)training;
    int rc;
    const size_t n = merge_begin(m, p, l, err, &rc);
    float *dst = op_dst(m, p, l);
    if (rc < 0)
        return rc;
    memcpy(dst, op_src(m, p, l, 0), n * sizeof(float));
    for (int k = 1; k < m->nodes[l].ninputs; k++) {
        const float *src = op_src(m, p, l, k);
#pragma omp parallel for simd schedule(static) if (n > MERGE_OMP_MIN)
        for (size_t i = 0; i < n; i++)
            dst[i] *= src[i];
    }
    return 0;
}

/* Input k's gradient: the output's times the product of the other inputs
 * (multiplied out, not the output divided by input k, which a zero would
 * break). */
static int multiply_backward(Model *m, Plan *p, int l, const NnOpBackward *how, SgError *err)
{
    (void)how;
    int rc;
    const size_t n = merge_begin(m, p, l, err, &rc);
    const int nin = m->nodes[l].ninputs;
    const float *ddst = op_ddst(m, p, l);
    if (rc < 0)
        return rc;
    for (int k = 0; k < nin; k++) {
        float *dsrc = op_dsrc(p, l, k);
        if (dsrc == NULL)
            continue;
        memcpy(dsrc, ddst, n * sizeof(float));
        for (int j = 0; j < nin; j++) {
            const float *src = op_src(m, p, l, j);
            if (j == k)
                continue;
#pragma omp parallel for simd schedule(static) if (n > MERGE_OMP_MIN)
            for (size_t i = 0; i < n; i++)
                dsrc[i] *= src[i];
        }
    }
    return 0;
}

/* 1 if x beats the best so far: larger for Maximum, smaller for Minimum. */
static inline int beats(float x, float best, int largest)
{
    return largest ? x > best : x < best;
}

/* Maximum (largest) or Minimum: the extreme of the inputs, elementwise,
 * folded left to right as Keras does (maximum(maximum(x0, x1), x2), ...). */
static int extreme_forward(Model *m, Plan *p, int l, int largest, SgError *err)
{
    int rc;
    const size_t n = merge_begin(m, p, l, err, &rc);
    float *dst = op_dst(m, p, l);
    if (rc < 0)
        return rc;
    memcpy(dst, op_src(m, p, l, 0), n * sizeof(float));
    for (int k = 1; k < m->nodes[l].ninputs; k++) {
        const float *src = op_src(m, p, l, k);
#pragma omp parallel for simd schedule(static) if (n > MERGE_OMP_MIN)
        for (size_t i = 0; i < n; i++)
            dst[i] = beats(src[i], dst[i], largest) ? src[i] : dst[i];
    }
    return 0;
}

/* The output's gradient goes to the input that won, the others get 0. On
 * a tie the first of the tied inputs wins, as TensorFlow's gradient of
 * maximum(x, y) goes to x where x >= y (minimum: x <= y), folded left to
 * right. */
static int extreme_backward(Model *m, Plan *p, int l, int largest, SgError *err)
{
    int rc;
    const size_t n = merge_begin(m, p, l, err, &rc);
    const int nin = m->nodes[l].ninputs;
    const float *ddst = op_ddst(m, p, l);
    const float *src[NN_MAX_NODE_INPUTS];
    float *dsrc[NN_MAX_NODE_INPUTS];
    if (rc < 0)
        return rc;
    for (int k = 0; k < nin; k++)
        src[k] = op_src(m, p, l, k), dsrc[k] = op_dsrc(p, l, k);
#pragma omp parallel for schedule(static) if (n > MERGE_OMP_MIN)
    for (size_t i = 0; i < n; i++) {
        int won = 0;
        for (int k = 1; k < nin; k++)
            if (beats(src[k][i], src[won][i], largest))
                won = k;
        for (int k = 0; k < nin; k++)
            if (dsrc[k] != NULL)
                dsrc[k][i] = k == won ? ddst[i] : 0.0f;
    }
    return 0;
}

static int maximum_forward(Model *m, Plan *p, int l, int training, SgError *err)
{
    (void)training;
    return extreme_forward(m, p, l, 1, err);
}

static int maximum_backward(Model *m, Plan *p, int l, const NnOpBackward *how, SgError *err)
{
    (void)how;
    return extreme_backward(m, p, l, 1, err);
}

static int minimum_forward(Model *m, Plan *p, int l, int training, SgError *err)
{
    (void)training;
    return extreme_forward(m, p, l, 0, err);
}

static int minimum_backward(Model *m, Plan *p, int l, const NnOpBackward *how, SgError *err)
{
    (void)how;
    return extreme_backward(m, p, l, 0, err);
}

/* Keras' class name, the op's functions' prefix, its shape check */
#define ELEMENTWISE(Name, name, infer)                                                             \
    const NnOpKind nn_op_##name = {                                                                \
        #Name, NN_OP_MERGE | NN_OP_FOLDS_SGD, infer, NULL, NULL, name##_forward, name##_backward,  \
    }
ELEMENTWISE(Add, add, elementwise_infer);
ELEMENTWISE(Subtract, subtract, subtract_infer);
ELEMENTWISE(Multiply, multiply, elementwise_infer);
ELEMENTWISE(Average, average, elementwise_infer);
ELEMENTWISE(Maximum, maximum, elementwise_infer);
ELEMENTWISE(Minimum, minimum, elementwise_infer);
#undef ELEMENTWISE

/* ---- Concatenate ------------------------------------------------------------ */

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
#pragma omp parallel for schedule(static) if (rows * c > MERGE_OMP_MIN)
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
