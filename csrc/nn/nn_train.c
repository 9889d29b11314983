/*
 * nn_train.c - the loops over in-memory data: one training batch (gather ->
 * forward -> loss -> backward -> optimizer, or backward with plain SGD folded
 * in), runs of steps, evaluation and prediction, and the OpenMP thread
 * count. Pure C: the Python binding calls these with the GIL released.
 */
#include "nn/nn_loss.h"
#include "nn/nn_model_impl.h"

#include <math.h>
#include <omp.h>
#include <string.h>

void nn_set_num_threads(int n)
{
    if (n > 0)
        omp_set_num_threads(n);
}

int nn_get_num_threads(void)
{
    return omp_get_max_threads();
}

/* One input row into dst: copied, converted from uint8, or transformed. */
static void gather_row(const NnData *d, int64_t r, float *dst)
{
    const size_t row = d->row;
    if (!d->transform && d->x) {
        memcpy(dst, d->x + (size_t)r * row, row * sizeof(float));
        return;
    }
    if (!d->transform) {
        const uint8_t *src = d->x_u8 + (size_t)r * row;
        for (size_t j = 0; j < row; j++)
            dst[j] = (float)src[j];
        return;
    }
    const float scale = d->scale, *mean = d->mean, *sd = d->std;
    /* float32 arithmetic in the order the caller wrote it: (x * scale - mean) / std */
    if (d->x_u8) {
        const uint8_t *src = d->x_u8 + (size_t)r * row;
        for (size_t j = 0; j < row; j++) {
            float v = (float)src[j] * scale;
            if (mean)
                v -= mean[j];
            dst[j] = sd ? v / sd[j] : v;
        }
    } else {
        const float *src = d->x + (size_t)r * row;
        for (size_t j = 0; j < row; j++) {
            float v = src[j] * scale;
            if (mean)
                v -= mean[j];
            dst[j] = sd ? v / sd[j] : v;
        }
    }
}

/* Gathers rows order[start..start+B) (or start..start+B) of d into the plan. */
static int gather(Model *m, Plan *p, const NnData *d, const int64_t *order, size_t start, int B,
                  SgError *err)
{
    const size_t row = d->row, K = (size_t)m->classes;
    for (int i = 0; i < B; i++) {
        int64_t r = order ? order[start + i] : (int64_t)(start + i);
        if (r < 0 || (size_t)r >= d->n)
            return sg_fail(err, SG_EINVAL, "row index %lld out of range [0, %zu)", (long long)r,
                           d->n);
        if (!p->input16) {
            gather_row(d, r, p->act[0] + (size_t)i * row);
        } else {
            /* the first layer's bf16 input, rounded as its reorder would */
            const float *src = p->rowbuf;
            if (!d->transform && d->x)
                src = d->x + (size_t)r * row;
            else
                gather_row(d, r, p->rowbuf);
            optim_f32_to_bf16(src, (uint16_t *)p->act[0] + (size_t)i * row, row);
        }
        if (d->labels || d->labels64) {
            int64_t y = d->labels ? (int64_t)d->labels[r] : d->labels64[r];
            if (y < 0 || (uint64_t)y >= K)
                return sg_fail(err, SG_EINVAL, "label %lld of row %lld is outside [0, %zu)",
                               (long long)y, (long long)r, K);
            p->labels[i] = (int32_t)y;
        } else if (d->onehot) {
            memcpy(p->onehot + (size_t)i * K, d->onehot + (size_t)r * K, K * sizeof(float));
        }
    }
    return 0;
}

static int check_data(const Model *m, const NnData *d, int need_targets, SgError *err)
{
    if (d->row != model_input_size(m))
        return sg_fail(err, SG_EINVAL, "input rows have %zu values, the model takes %zu", d->row,
                       model_input_size(m));
    if (!d->x == !d->x_u8)
        return sg_fail(err, SG_EINVAL, "inputs must be given as float32 or as uint8 rows");
    if (need_targets && !d->labels && !d->labels64 && !d->onehot)
        return sg_fail(err, SG_EINVAL, "no targets given");
    return 0;
}

/* Loss and accuracy of the batch in the plan (evaluation), through the
 * oneDNN log-softmax. */
static int batch_loss(Model *m, Plan *p, const NnData *d, NnStats *st, SgError *err)
{
    int rc = model_logprob(m, p, err);
    if (rc < 0)
        return rc;
    const int B = p->B, K = m->classes;
    const int sparse = d->labels || d->labels64;
    const int32_t *labels = sparse ? p->labels : NULL;
    const float *onehot = sparse ? NULL : p->onehot;
    int bad = -1;
    double loss = xent_forward(p->logprob, labels, onehot, B, K, &bad);
    if (bad >= 0)
        return sg_fail(err, SG_EINVAL, "label of batch row %d is outside [0, %d)", bad, K);
    st->loss_sum += loss * B;
    st->correct += accuracy_count(p->logprob, labels, onehot, B, K);
    st->seen += B;
    st->steps += 1;
    return 0;
}

/* Training loss of the batch in the plan, from the logits in one pass
 * (nn_loss.h): the logits gradient into dact[L], loss and hits into st. */
static int train_loss(Model *m, Plan *p, const NnData *d, NnStats *st, SgError *err)
{
    const int B = p->B, K = m->classes, L = m->nlayers;
    double loss_sum;
    int correct, bad = -1;
    const int sparse = d->labels || d->labels64;
    if (softmax_xent_train(p->dact[L], &loss_sum, &correct, p->act[L], sparse ? p->labels : NULL,
                           sparse ? NULL : p->onehot, B, K, &bad) < 0)
        return sg_fail(err, SG_EINVAL, "label of batch row %d is outside [0, %d)", bad, K);
    st->loss_sum += loss_sum;
    st->correct += correct;
    st->seen += B;
    st->steps += 1;
    return 0;
}

/* One training batch. keep16 (within model_fit_steps, where nothing else
 * touches the parameters between two steps): the optimizer also writes the
 * plan's bf16 weights (optim_step_bf16), and the next step's forward skips
 * converting them (m->w16_fresh). */
static int train_batch(Model *m, Optimizer *opt, const NnData *d, const int64_t *order,
                       size_t start, int B, const NnGradHook *hook, int64_t *step, NnStats *st,
                       int keep16, SgError *err)
{
    Plan *p;
    float lr;
    int rc;
    if ((rc = check_data(m, d, 1, err)) < 0 || (rc = model_plan(m, B, &p, err)) < 0)
        return rc;
    if (m->w16_fresh != p)
        m->w16_fresh = NULL;
    rc = gather(m, p, d, order, start, B, err);
    if (rc == 0)
        rc = model_forward(m, p, 1, err);
    /* from here on the bf16 weights are stale until an optimizer step rewrites them */
    m->w16_fresh = NULL;
    if (rc < 0 || (rc = train_loss(m, p, d, st, err)) < 0)
        return rc;
    int64_t next = (step ? *step : 0) + 1;
    /* plain SGD on a Dense stack: the update happens inside the weight-gradient
     * GEMMs, with no gradient buffer pass and no optimizer pass; never with a
     * hook, which needs the gradients, nor in bf16 (the f32 GEMM would undo it) */
    if (opt && !hook && model_dense_only(m) && m->precision == NN_FP32) {
        if ((rc = optim_take_plain_sgd_step(opt, m->nparams, &lr, err)) < 0)
            return rc;
        if (rc == 1) {
            if ((rc = model_backward_sgd(m, p, lr, err)) < 0)
                return rc;
            if (step)
                *step = next;
            return 0;
        }
    }
    if ((rc = model_backward(m, p, hook, err)) < 0)
        return rc;
    int applied = 0;
    if (hook) {
        if ((rc = hook->step(hook->ctx, m->params, m->grads, m->nparams, &next, err)) < 0)
            return sg_context(err, "gradient hook: ");
        applied = rc == 1;
    }
    if (opt && !applied) {
        if (keep16 && p->ncopies > 0) {
            if ((rc = optim_step_bf16(opt, m->params, m->grads, m->nparams, p->copies, p->ncopies,
                                      err)) < 0)
                return rc;
            m->w16_fresh = p;
        } else if ((rc = optim_step(opt, m->params, m->grads, m->nparams, err)) < 0) {
            return rc;
        }
    }
    if (step)
        *step = next;
    return 0;
}

int model_train_batch(Model *m, Optimizer *opt, const NnData *d, const int64_t *order, size_t start,
                      int B, const NnGradHook *hook, int64_t *step, NnStats *st, SgError *err)
{
    m->w16_fresh = NULL;
    return train_batch(m, opt, d, order, start, B, hook, step, st, 0, err);
}

int model_fit_steps(Model *m, Optimizer *opt, const NnData *d, const int64_t *order, size_t start,
                    int batch, int64_t nsteps, const NnGradHook *hook, int64_t *step, NnStats *st,
                    SgError *err)
{
    if (batch <= 0)
        return sg_fail(err, SG_EINVAL, "batch size must be > 0, not %d", batch);
    m->w16_fresh = NULL;
    for (int64_t s = 0; s < nsteps && start < d->n; s++) {
        int B = d->n - start < (size_t)batch ? (int)(d->n - start) : batch;
        int rc = train_batch(m, opt, d, order, start, B, hook, step, st, 1, err);
        if (rc < 0) {
            m->w16_fresh = NULL;
            return sg_context(err, "training step at row %zu: ", start);
        }
        start += (size_t)B;
    }
    /* the caller may change the parameters before the next run */
    m->w16_fresh = NULL;
    return 0;
}

int model_evaluate(Model *m, const NnData *d, int batch, NnStats *st, SgError *err)
{
    int rc = check_data(m, d, 1, err);
    if (rc < 0)
        return rc;
    if (batch <= 0)
        return sg_fail(err, SG_EINVAL, "batch size must be > 0, not %d", batch);
    for (size_t start = 0; start < d->n; start += (size_t)batch) {
        int B = d->n - start < (size_t)batch ? (int)(d->n - start) : batch;
        Plan *p;
        if ((rc = model_plan(m, B, &p, err)) < 0 ||
            (rc = gather(m, p, d, NULL, start, B, err)) < 0 ||
            (rc = model_forward(m, p, 0, err)) < 0 || (rc = batch_loss(m, p, d, st, err)) < 0)
            return sg_context(err, "evaluating rows from %zu: ", start);
    }
    return 0;
}

int model_predict(Model *m, const NnData *d, int batch, float *out, SgError *err)
{
    int rc = check_data(m, d, 0, err);
    if (rc < 0)
        return rc;
    const size_t n = d->n;
    if (batch <= 0)
        return sg_fail(err, SG_EINVAL, "batch size must be > 0, not %d", batch);
    const size_t K = (size_t)m->classes;
    const int softmax = m->specs[m->nlayers - 1].act == NN_ACT_SOFTMAX;
    for (size_t start = 0; start < n; start += (size_t)batch) {
        int B = n - start < (size_t)batch ? (int)(n - start) : batch;
        Plan *p;
        if ((rc = model_plan(m, B, &p, err)) < 0 ||
            (rc = gather(m, p, d, NULL, start, B, err)) < 0 ||
            (rc = model_forward(m, p, 0, err)) < 0)
            return sg_context(err, "predicting rows from %zu: ", start);
        float *dst = out + start * K;
        if (softmax) {
            if ((rc = model_logprob(m, p, err)) < 0)
                return rc;
            for (size_t i = 0; i < (size_t)B * K; i++)
                dst[i] = expf(p->logprob[i]);
        } else {
            memcpy(dst, p->act[m->nlayers], (size_t)B * K * sizeof(float));
        }
    }
    return 0;
}
