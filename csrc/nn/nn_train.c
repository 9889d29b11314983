/*
 * nn_train.c - the loops over in-memory data: one training batch (gather ->
 * forward -> loss -> backward -> optimizer, or backward with plain SGD folded
 * in), runs of steps, evaluation and prediction, and the OpenMP thread
 * count. Pure C: the Python binding calls these with the GIL released.
 */
#include "nn/nn_model_impl.h"

#include <float.h>
#include <math.h>
#include <omp.h>
#include <stddef.h>
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

/* 1 if every v[n] is finite (its exponent bits not all ones): an integer
 * test that vectorises for the CPU it runs on (target_clones: AVX-512, AVX2
 * or the baseline), so checking every gathered row costs next to nothing. */
__attribute__((target_clones("avx512f", "avx2", "default"))) static int all_finite(const float *v,
                                                                                   size_t n)
{
    uint32_t bad = 0;
    for (size_t j = 0; j < n; j++) {
        uint32_t u;
        memcpy(&u, v + j, sizeof u);
        bad |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
    }
    return bad == 0;
}

/* The first of v[n] that is NaN or infinite, or -1. */
static ptrdiff_t first_nonfinite(const float *v, size_t n)
{
    if (all_finite(v, n))
        return -1;
    for (size_t j = 0; j < n; j++)
        if (!isfinite(v[j]))
            return (ptrdiff_t)j;
    return -1;
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

/* Gathers rows order[start..start+B) (or start..start+B) of d into the plan:
 * inputs, targets (checked against the loss) and sample weights. */
static int gather(Model *m, Plan *p, const NnData *d, const int64_t *order, size_t start, int B,
                  SgError *err)
{
    const size_t row = d->row, K = (size_t)m->classes;
    for (int i = 0; i < B; i++) {
        int64_t r = order ? order[start + i] : (int64_t)(start + i);
        if (r < 0 || (size_t)r >= d->n)
            return sg_fail(err, SG_EINVAL, "row index %lld out of range [0, %zu)", (long long)r,
                           d->n);
        const float *in;
        if (!p->input16) {
            gather_row(d, r, p->act[0] + (size_t)i * row);
            in = p->act[0] + (size_t)i * row;
        } else {
            /* the first layer's bf16 input, rounded as its reorder would */
            in = p->rowbuf;
            if (!d->transform && d->x)
                in = d->x + (size_t)r * row;
            else
                gather_row(d, r, p->rowbuf);
            optim_f32_to_bf16(in, (uint16_t *)p->act[0] + (size_t)i * row, row);
        }
        /* a NaN would pass a ReLU as 0 and reach the weights through the
         * kernel's gradient: refused where it enters (uint8 rows cannot hold one) */
        ptrdiff_t j = d->x ? first_nonfinite(in, row) : -1;
        if (j >= 0)
            return sg_fail(err, SG_EINVAL, "input value %g of row %lld (feature %td) is not finite",
                           (double)in[j], (long long)r, j);
        if (d->labels || d->labels64) {
            int64_t y = d->labels ? (int64_t)d->labels[r] : d->labels64[r];
            if (y < 0 || (uint64_t)y >= K)
                return sg_fail(err, SG_EINVAL, "label %lld of row %lld is outside [0, %zu)",
                               (long long)y, (long long)r, K);
            p->labels[i] = (int32_t)y;
        } else if (d->targets) {
            const float *t = d->targets + (size_t)r * K;
            int at;
            if (nn_loss_bad_target(&m->loss, t, (int)K, &at))
                return sg_fail(
                    err, SG_EINVAL, "target %g (output %d) of row %lld is outside what %s takes%s",
                    (double)t[at], at, (long long)r, nn_loss_ops(m->loss.kind)->name,
                    m->loss.kind == NN_LOSS_BINARY_CE ? " ([0, 1])" : " (finite values)");
            memcpy(p->targets + (size_t)i * K, t, K * sizeof(float));
        }
        if (d->weights) {
            const float w = d->weights[r];
            if (!(w >= 0.0f) || isinf(w))
                return sg_fail(err, SG_EINVAL,
                               "sample weight %g of row %lld must be finite and >= 0", (double)w,
                               (long long)r);
            p->weights[i] = w;
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
    if (!need_targets)
        return 0;
    const NnLossOps *ops = nn_loss_ops(m->loss.kind);
    const int sparse = d->labels || d->labels64;
    if (!sparse && !d->targets)
        return sg_fail(err, SG_EINVAL, "no targets given");
    if (sparse != ops->sparse)
        return sg_fail(err, SG_EINVAL, "%s takes %s; %s given", ops->name,
                       ops->sparse ? "integer labels [n]" : "float targets [n, outputs]",
                       sparse ? "integer labels" : "float targets");
    return 0;
}

/* The loss (and, with dz, its gradient) and the metrics of the batch in the
 * plan, into st. A non-finite loss in training is an error: nothing of the
 * batch is applied. */
static int batch_loss(Model *m, Plan *p, const NnData *d, float *dz, NnStats *st, SgError *err)
{
    const int B = p->B, K = m->classes, L = m->nlayers;
    const int sparse = d->labels || d->labels64;
    /* without a head the outputs are z itself: no copy */
    NnOutputs o = {B,
                   K,
                   m->head,
                   p->act[L],
                   m->head == NN_ACT_NONE ? p->act[L] : p->out,
                   sparse ? p->labels : NULL,
                   sparse ? NULL : p->targets,
                   d->weights ? p->weights : NULL};
    double loss_sum = 0.0;
    int bad = -1;
    int rc = nn_loss_run(&m->loss, &o, dz, &loss_sum, &bad);
    if (rc == -1)
        return sg_fail(err, SG_EINVAL, "label of batch row %d is outside [0, %d)", bad, K);
    if (rc == -2 && dz != NULL)
        return sg_fail(err, SG_ENONFINITE,
                       "the %s loss is not finite at batch row %d (outputs or targets hold NaN or "
                       "inf, or training diverged: lower the learning rate, clip gradients, check "
                       "the inputs)",
                       nn_loss_ops(m->loss.kind)->name, bad);
    if (rc == -2)
        loss_sum = NAN; /* evaluation reports it */
    st->loss_sum += loss_sum;
    st->seen += B;
    st->steps += 1;
    if (st->metrics != NULL) {
        double *state = st->metrics;
        for (int i = 0; i < m->nmetrics; i++) {
            nn_metric_update(&m->metrics[i], state, &o);
            state += nn_metric_state_size(&m->metrics[i]);
        }
    }
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
    if (rc < 0 || (rc = batch_loss(m, p, d, p->dact[m->nlayers], st, err)) < 0)
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
        const long long at = step ? (long long)*step + 1 : (long long)s + 1;
        int rc = train_batch(m, opt, d, order, start, B, hook, step, st, 1, err);
        if (rc < 0) {
            m->w16_fresh = NULL;
            return sg_context(err, "training step %lld (the batch at row %zu of the epoch): ", at,
                              start);
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
            (rc = model_forward(m, p, 0, err)) < 0 || (rc = batch_loss(m, p, d, NULL, st, err)) < 0)
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
    const int K = m->classes;
    for (size_t start = 0; start < n; start += (size_t)batch) {
        int B = n - start < (size_t)batch ? (int)(n - start) : batch;
        Plan *p;
        if ((rc = model_plan(m, B, &p, err)) < 0 ||
            (rc = gather(m, p, d, NULL, start, B, err)) < 0 ||
            (rc = model_forward(m, p, 0, err)) < 0)
            return sg_context(err, "predicting rows from %zu: ", start);
        NnOutputs o = {B,    K,    m->head, p->act[m->nlayers], out + start * (size_t)K,
                       NULL, NULL, NULL};
        nn_head_forward(&o);
    }
    return 0;
}
