/*
 * nn_train.c - the loops over in-memory data: one training batch (gather ->
 * forward -> loss -> backward -> optimizer, or backward with plain SGD folded
 * in), runs of steps, evaluation and prediction, and the OpenMP thread
 * count. Pure C: the Python binding calls these with the GIL released.
 */
#include "nn/nn_model_impl.h"
#include "nn/nn_prep.h"

#include <float.h>
#include <stdio.h>
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

NnData nn_data(NnDtype xtype, const void *x, size_t n, size_t row, NnDtype ytype, const void *y,
               size_t k)
{
    NnData d;
    memset(&d, 0, sizeof d);
    d.n = n;
    d.ninputs = 1;
    d.inputs[0] = (NnArray){xtype, x, row};
    if (y != NULL) {
        d.ntargets = 1;
        d.targets[0] = (NnArray){ytype, y, ytype == NN_F32 ? k : 1};
    }
    return d;
}

/* One input row into dst: copied, converted from uint8 or integers (ids:
 * exact below 2^24), then transformed. */
static void gather_row(const NnArray *a, const NnTransform *tf, int64_t r, float *dst)
{
    const size_t row = a->row, at = (size_t)r * row;
    switch (a->dtype) { /* one typed loop each, so that each vectorises */
    case NN_U8: {
        const uint8_t *x = (const uint8_t *)a->data + at;
        for (size_t j = 0; j < row; j++)
            dst[j] = (float)x[j];
        break;
    }
    case NN_I32: {
        const int32_t *x = (const int32_t *)a->data + at;
        for (size_t j = 0; j < row; j++)
            dst[j] = (float)x[j];
        break;
    }
    case NN_I64: {
        const int64_t *x = (const int64_t *)a->data + at;
        for (size_t j = 0; j < row; j++)
            dst[j] = (float)x[j];
        break;
    }
    default:
        memcpy(dst, (const float *)a->data + at, row * sizeof(float));
    }
    if (!tf->on)
        return;
    const float scale = tf->scale, *mean = tf->mean, *sd = tf->std;
    /* float32 arithmetic in the order the caller wrote it: (x * scale - mean) / std */
    for (size_t j = 0; j < row; j++) {
        float v = dst[j] * scale;
        if (mean)
            v -= mean[j];
        dst[j] = sd ? v / sd[j] : v;
    }
}

/* The name of input i or output j in a message: "" for a one-input
 * (one-output) model, else " of input 2". */
static const char *io_name(char *buf, size_t size, const char *what, int i, int count)
{
    if (count <= 1)
        return "";
    snprintf(buf, size, " of %s %d", what, i);
    return buf;
}

/* Gathers input i's rows through its preprocessing chain (nn_prep.h): the
 * chain writes the floats, bf16 inputs converted row by row. */
static int gather_prep_input(Model *m, Plan *p, const NnData *d, int i, const int64_t *order,
                             size_t start, int B, SgError *err)
{
    const NnPrep *prep = d->preps[i];
    const size_t row = nn_prep_out_row(prep);
    int rc = 0;
    if (!p->input16[i]) {
        rc = nn_prep_rows(prep, &d->inputs[i], order, start, B, p->act[i], err);
    } else {
        for (int b = 0; b < B && rc == 0; b++) {
            rc = nn_prep_rows(prep, &d->inputs[i], order, start + (size_t)b, 1, p->rowbuf, err);
            if (rc == 0)
                optim_f32_to_bf16(p->rowbuf, (uint16_t *)p->act[i] + (size_t)b * row, row);
        }
    }
    if (rc < 0 && m->ninputs > 1)
        return sg_context(err, "input %d: ", i);
    return rc;
}

/* Gathers input i's rows order[start..start+B) (or start..start+B) into its
 * plan buffer (bf16 where its one reader takes it so). */
static int gather_input(Model *m, Plan *p, const NnData *d, int i, const int64_t *order,
                        size_t start, int B, SgError *err)
{
    if (d->preps[i] != NULL)
        return gather_prep_input(m, p, d, i, order, start, B, err);
    const NnArray *a = &d->inputs[i];
    const NnTransform *tf = &d->transforms[i];
    const size_t row = a->row;
    char nb[32];
    for (int b = 0; b < B; b++) {
        const int64_t r = order ? order[start + b] : (int64_t)(start + b);
        const float *in;
        if (!p->input16[i]) {
            gather_row(a, tf, r, p->act[i] + (size_t)b * row);
            in = p->act[i] + (size_t)b * row;
        } else {
            /* the first layer's bf16 input, rounded as its reorder would */
            in = p->rowbuf;
            if (!tf->on && a->dtype == NN_F32)
                in = (const float *)a->data + (size_t)r * row;
            else
                gather_row(a, tf, r, p->rowbuf);
            optim_f32_to_bf16(in, (uint16_t *)p->act[i] + (size_t)b * row, row);
        }
        /* a NaN would pass a ReLU as 0 and reach the weights through the
         * kernel's gradient: refused where it enters (uint8 rows cannot hold one) */
        ptrdiff_t j = a->dtype == NN_F32 ? first_nonfinite(in, row) : -1;
        if (j >= 0)
            return sg_fail(
                err, SG_EINVAL, "input value %g of row %lld (feature %td%s) is not finite",
                (double)in[j], (long long)r, j, io_name(nb, sizeof nb, "input", i, m->ninputs));
    }
    return 0;
}

/* Gathers output j's targets of the batch, checked against its loss. */
static int gather_targets(Model *m, Plan *p, const NnData *d, int j, const int64_t *order,
                          size_t start, int B, SgError *err)
{
    const ModelOutput *o = &m->outputs[j];
    const NnArray *a = &d->targets[j];
    const size_t K = (size_t)o->width;
    PlanOutput *po = &p->outputs[j];
    char nb[32];
    const char *of = io_name(nb, sizeof nb, "output", j, m->noutputs);
    for (int b = 0; b < B; b++) {
        const int64_t r = order ? order[start + b] : (int64_t)(start + b);
        if (a->dtype == NN_I32 || a->dtype == NN_I64) {
            const int64_t y = a->dtype == NN_I32 ? (int64_t)((const int32_t *)a->data)[r]
                                                 : ((const int64_t *)a->data)[r];
            if (y < 0 || (uint64_t)y >= K)
                return sg_fail(err, SG_EINVAL, "label %lld of row %lld%s is outside [0, %zu)",
                               (long long)y, (long long)r, of, K);
            po->labels[b] = (int32_t)y;
        } else {
            const float *t = (const float *)a->data + (size_t)r * K;
            int at;
            if (nn_loss_bad_target(&o->loss, t, (int)K, &at))
                return sg_fail(err, SG_EINVAL,
                               "target %g (output %d) of row %lld%s is outside what %s takes%s",
                               (double)t[at], at, (long long)r, of, nn_loss_ops(o->loss.kind)->name,
                               o->loss.kind == NN_LOSS_BINARY_CE ? " ([0, 1])"
                                                                 : " (finite values)");
            memcpy(po->targets + (size_t)b * K, t, K * sizeof(float));
        }
    }
    return 0;
}

/* Gathers rows order[start..start+B) (or start..start+B) of d into the plan:
 * every input, every output's targets (with_targets) and sample weights.
 * The one place every source's rows enter a step. */
static int gather(Model *m, Plan *p, const NnData *d, const int64_t *order, size_t start, int B,
                  int with_targets, SgError *err)
{
    for (int b = 0; b < B; b++) {
        const int64_t r = order ? order[start + b] : (int64_t)(start + b);
        if (r < 0 || (size_t)r >= d->n)
            return sg_fail(err, SG_EINVAL, "row index %lld out of range [0, %zu)", (long long)r,
                           d->n);
        p->rows[b] = r; /* for the ops' messages (an Embedding's bad id) */
    }
    int rc;
    for (int i = 0; i < m->ninputs; i++)
        if ((rc = gather_input(m, p, d, i, order, start, B, err)) < 0)
            return rc;
    for (int j = 0; with_targets && j < m->noutputs; j++)
        if ((rc = gather_targets(m, p, d, j, order, start, B, err)) < 0)
            return rc;
    if (d->weights) {
        for (int b = 0; b < B; b++) {
            const int64_t r = order ? order[start + b] : (int64_t)(start + b);
            const float w = d->weights[r];
            if (!(w >= 0.0f) || isinf(w))
                return sg_fail(err, SG_EINVAL,
                               "sample weight %g of row %lld must be finite and >= 0", (double)w,
                               (long long)r);
            p->weights[b] = w;
        }
    }
    return 0;
}

/* Input i's raw column against its preprocessing chain (its output must be
 * the model's input row); without one, a string column is refused. */
static int check_prep_input(const Model *m, const NnData *d, int i, const char *of, SgError *err)
{
    const NnPrep *prep = d->preps[i];
    const NnArray *a = &d->inputs[i];
    if (prep == NULL && (a->dtype == NN_STR32 || a->dtype == NN_STR64))
        return sg_fail(err, SG_EINVAL,
                       "input%s takes numbers, but a string column was given (strings go through "
                       "a StringLookup or Hashing layer on the Input)",
                       of);
    if (prep == NULL)
        return 0;
    if (nn_prep_out_row(prep) != model_input_row(m, i))
        return sg_fail(err, SG_EINVAL, "%s%s gives rows of %zu values, the model takes %zu",
                       nn_prep_layer(prep), of, nn_prep_out_row(prep), model_input_row(m, i));
    if (a->data == NULL && d->n > 0)
        return sg_fail(err, SG_EINVAL, "input%s has no data", of);
    int rc = nn_prep_check(prep, a, err);
    return rc < 0 && m->ninputs > 1 ? sg_context(err, "input %d: ", i) : rc;
}

static int check_data(const Model *m, const NnData *d, int need_targets, SgError *err)
{
    if (d->ninputs != m->ninputs)
        return sg_fail(err, SG_EINVAL, "%d input arrays given, the model has %d inputs", d->ninputs,
                       m->ninputs);
    char nb[32];
    for (int i = 0; i < m->ninputs; i++) {
        const NnArray *a = &d->inputs[i];
        const char *of = io_name(nb, sizeof nb, "input", i, m->ninputs);
        int rc = check_prep_input(m, d, i, of, err);
        if (rc < 0)
            return rc;
        if (d->preps[i] != NULL)
            continue;
        if (a->row != model_input_row(m, i))
            return sg_fail(err, SG_EINVAL, "input rows%s have %zu values, the model takes %zu", of,
                           a->row, model_input_row(m, i));
        if ((a->dtype != NN_F32 && a->dtype != NN_U8 && a->dtype != NN_I32 && a->dtype != NN_I64) ||
            (a->data == NULL && d->n > 0))
            return sg_fail(err, SG_EINVAL,
                           "inputs%s must be given as float32, uint8, int32 or int64 rows", of);
    }
    if (!need_targets)
        return 0;
    if (d->ntargets != m->noutputs)
        return sg_fail(err, SG_EINVAL, "%s: %d target arrays given, the model has %d outputs",
                       d->ntargets ? "targets" : "no targets given", d->ntargets, m->noutputs);
    for (int j = 0; j < m->noutputs; j++) {
        const NnArray *a = &d->targets[j];
        const NnLossOps *ops = nn_loss_ops(m->outputs[j].loss.kind);
        const int sparse = a->dtype == NN_I32 || a->dtype == NN_I64;
        const char *of = io_name(nb, sizeof nb, "output", j, m->noutputs);
        if (a->data == NULL && d->n > 0)
            return sg_fail(err, SG_EINVAL, "no targets given%s", of);
        if (sparse != ops->sparse || (!sparse && a->dtype != NN_F32))
            return sg_fail(err, SG_EINVAL, "%s%s takes %s; %s given", ops->name, of,
                           ops->sparse ? "integer labels [n]" : "float targets [n, outputs]",
                           sparse ? "integer labels" : "another type");
        if (!sparse && a->row != (size_t)m->outputs[j].width)
            return sg_fail(err, SG_EINVAL, "targets%s have %zu values per row, the output %d", of,
                           a->row, m->outputs[j].width);
    }
    return 0;
}

/* The loss (and, in training, its gradient into each output's dz, scaled by
 * its loss weight) and the metrics of the batch in the plan, into st. A
 * non-finite loss in training is an error: nothing of the batch is applied. */
static int batch_loss(Model *m, Plan *p, const NnData *d, int training, NnStats *st, SgError *err)
{
    const int B = p->B;
    double total = 0.0;
    double *state = st->metrics;
    char nb[32];
    for (int j = 0; j < m->noutputs; j++) {
        const ModelOutput *mo = &m->outputs[j];
        PlanOutput *po = &p->outputs[j];
        const int K = mo->width, sparse = nn_loss_ops(mo->loss.kind)->sparse;
        float *z = p->act[mo->tensor];
        /* without a head the outputs are z itself: no copy */
        NnOutputs o = {B,
                       K,
                       mo->head,
                       z,
                       mo->head == NN_ACT_NONE ? z : po->out,
                       sparse ? po->labels : NULL,
                       sparse ? NULL : po->targets,
                       d->weights ? p->weights : NULL};
        double loss_sum = 0.0;
        int bad = -1;
        float *dz = training ? po->dz : NULL;
        int rc = nn_loss_run(&mo->loss, &o, dz, &loss_sum, &bad);
        const char *of = io_name(nb, sizeof nb, "output", j, m->noutputs);
        if (rc == -1)
            return sg_fail(err, SG_EINVAL, "label of batch row %d%s is outside [0, %d)", bad, of,
                           K);
        if (rc == -2 && training)
            return sg_fail(err, SG_ENONFINITE,
                           "the %s loss%s is not finite at batch row %d (outputs or targets hold "
                           "NaN or inf, or training diverged: lower the learning rate, clip "
                           "gradients, check the inputs)",
                           nn_loss_ops(mo->loss.kind)->name, of, bad);
        if (rc == -2)
            loss_sum = NAN; /* evaluation reports it */
        if (dz != NULL && mo->loss_weight != 1.0f) {
            const size_t n = (size_t)B * K;
            const float w = mo->loss_weight;
            for (size_t i = 0; i < n; i++)
                dz[i] *= w;
        }
        st->output_loss[j] += loss_sum;
        total += (double)mo->loss_weight * loss_sum;
        if (state != NULL) {
            for (int i = 0; i < mo->nmetrics; i++) {
                nn_metric_update(&mo->metrics[i], state, &o);
                state += nn_metric_state_size(&mo->metrics[i]);
            }
        }
    }
    st->loss_sum += total;
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
    rc = gather(m, p, d, order, start, B, 1, err);
    if (rc == 0) {
        m->hook = hook; /* an Embedding may ask it for its rows (hook->rows) */
        rc = model_forward(m, p, 1, err);
        m->hook = NULL;
    }
    /* from here on the bf16 weights are stale until an optimizer step rewrites them */
    m->w16_fresh = NULL;
    if (rc < 0 || (rc = batch_loss(m, p, d, 1, st, err)) < 0)
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
    /* the Embedding tables stay rows, unless a hook takes them densely */
    const int ntables = hook && !hook->sparse ? 0 : m->ntables;
    if (hook) {
        rc = hook->step(hook->ctx, m->params, m->grads, m->nparams, ntables ? m->touched : NULL,
                        ntables, &next, err);
        /* a dense hook may have written any row of the tables' gradients (an average over ranks) */
        if (!hook->sparse)
            model_tables_written(m);
        if (rc < 0)
            return sg_context(err, "gradient hook: ");
        applied = rc == 1;
        if (hook->sparse && (rc = model_tables_keep_ids(m, err)) < 0)
            return rc;
    }
    if (opt && !applied) {
        const int ncopies = keep16 ? p->ncopies : 0;
        if ((rc = optim_step_rows(opt, m->params, m->grads, m->nparams, m->touched, ntables,
                                  p->copies, ncopies, err)) < 0)
            return rc;
        if (ncopies > 0)
            m->w16_fresh = p;
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
            (rc = gather(m, p, d, NULL, start, B, 1, err)) < 0 ||
            (rc = model_forward(m, p, 0, err)) < 0 || (rc = batch_loss(m, p, d, 0, st, err)) < 0)
            return sg_context(err, "evaluating rows from %zu: ", start);
    }
    return 0;
}

int model_predict(Model *m, const NnData *d, int batch, float *const *out, SgError *err)
{
    int rc = check_data(m, d, 0, err);
    if (rc < 0)
        return rc;
    const size_t n = d->n;
    if (batch <= 0)
        return sg_fail(err, SG_EINVAL, "batch size must be > 0, not %d", batch);
    for (size_t start = 0; start < n; start += (size_t)batch) {
        int B = n - start < (size_t)batch ? (int)(n - start) : batch;
        Plan *p;
        if ((rc = model_plan(m, B, &p, err)) < 0 ||
            (rc = gather(m, p, d, NULL, start, B, 0, err)) < 0 ||
            (rc = model_forward(m, p, 0, err)) < 0)
            return sg_context(err, "predicting rows from %zu: ", start);
        for (int j = 0; j < m->noutputs; j++) {
            const ModelOutput *mo = &m->outputs[j];
            NnOutputs o = {
                B,    mo->width, mo->head, p->act[mo->tensor], out[j] + start * (size_t)mo->width,
                NULL, NULL,      NULL};
            nn_head_forward(&o);
        }
    }
    return 0;
}
