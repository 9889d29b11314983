/*
 * nn_plan.c - the execution plan of a model for one batch size: buffers for
 * every activation and its gradient and the ops' scratch, every op's oneDNN
 * primitives with their arguments bound (each op builds its own, nn_op.h),
 * built once and replayed each step; the forward and backward walks over the
 * op table (see nn_model_impl.h).
 */
#include "nn/nn_op.h"

#include <stdlib.h>
#include <string.h>

/* ---- bookkeeping of created oneDNN objects ------------------------------ */

static int grow(void **arr, int *cap, size_t elem, SgError *err)
{
    int ncap = *cap ? 2 * *cap : 32;
    void *n = realloc(*arr, (size_t)ncap * elem);
    if (n == NULL)
        return sg_fail(err, SG_ENOMEM, "model plan: out of memory");
    *arr = n;
    *cap = ncap;
    return 0;
}

int plan_mem(Model *m, Plan *p, dnnl_memory_t *out, const_dnnl_memory_desc_t md, void *data,
             SgError *err)
{
    int rc;
    if (p->nmems == p->capmems &&
        (rc = grow((void **)&p->mems, &p->capmems, sizeof *p->mems, err)) < 0)
        return rc;
    if ((rc = nn_mem(out, md, m->eng, data, err)) < 0)
        return rc;
    p->mems[p->nmems++] = *out;
    return 0;
}

int plan_prim(Plan *p, dnnl_primitive_t *out, const_dnnl_primitive_desc_t pd, SgError *err)
{
    int rc;
    if (p->nprims == p->capprims &&
        (rc = grow((void **)&p->prims, &p->capprims, sizeof *p->prims, err)) < 0)
        return rc;
    if ((rc = nn_prim(out, pd, err)) < 0)
        return rc;
    p->prims[p->nprims++] = *out;
    return 0;
}

void plan_free(Plan *p)
{
    if (p == NULL)
        return;
    for (int i = 0; i < p->nprims; i++)
        dnnl_primitive_destroy(p->prims[i]);
    for (int i = 0; i < p->nmems; i++)
        dnnl_memory_destroy(p->mems[i]);
    free(p->prims);
    free(p->mems);
    free(p->rowbuf);
    free(p->copies);
    free(p->arena);
    free(p->act);
    free(p->dact);
    free(p->lp);
    free(p);
}

/* Appends c to the plan's optimizer copies. */
int plan_copy(Plan *p, const OptimBf16Copy *c, SgError *err)
{
    OptimBf16Copy *n = realloc(p->copies, (size_t)(p->ncopies + 1) * sizeof *n);
    if (n == NULL)
        return sg_fail(err, SG_ENOMEM, "model plan: out of memory");
    p->copies = n;
    p->copies[p->ncopies++] = *c;
    return 0;
}

/* A reorder src_mem -> a new library-owned memory of md dst, appended to e. */
int plan_reorder(Model *m, Plan *p, NnExec *e, dnnl_memory_t from, dnnl_memory_t to, SgError *err)
{
    const_dnnl_memory_desc_t fmd, tmd;
    int rc;
    if ((rc = DNNL(err, dnnl_memory_get_memory_desc, from, &fmd)) < 0 ||
        (rc = DNNL(err, dnnl_memory_get_memory_desc, to, &tmd)) < 0)
        return rc;
    dnnl_primitive_desc_t pd = NULL;
    if ((rc = DNNL(err, dnnl_reorder_primitive_desc_create, &pd, fmd, m->eng, tmd, m->eng, NULL)) <
        0)
        return rc;
    memset(e, 0, sizeof *e);
    rc = plan_prim(p, &e->prim, pd, err);
    dnnl_primitive_desc_destroy(pd);
    nn_exec_arg(e, DNNL_ARG_FROM, from);
    nn_exec_arg(e, DNNL_ARG_TO, to);
    return rc;
}

/* ---- the plan ----------------------------------------------------------- */

static size_t round16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

static int weighted(const Model *m, int l)
{
    return (nn_op_of(m, l)->flags & NN_OP_WEIGHTED) != 0;
}

static int alias(const Model *m, int l)
{
    return (nn_op_of(m, l)->flags & NN_OP_ALIAS) != 0;
}

/* 1 if layer l's output is the input of a weighted layer, l being one too
 * (aliases such as Flatten in between): with chain, an activation kept in
 * bf16. */
static int chain16(const Model *m, int l)
{
    if (!weighted(m, l))
        return 0;
    for (int k = l + 1; k < m->nlayers; k++)
        if (!alias(m, k))
            return weighted(m, k);
    return 0;
}

static int chain16_in(const Model *m, int l)
{
    if (!weighted(m, l))
        return 0;
    for (int k = l - 1; k >= 0; k--)
        if (!alias(m, k))
            return chain16(m, k);
    return 0;
}

/* Builds the plan for batch B; chain: bf16 layers hand bf16 activations to
 * each other (NnOpBuild's input_bf16 / output_bf16). *fell_back is set when a layer
 * had no bf16 implementation and was built in f32. */
static int plan_build(Model *m, int B, int chain, int *fell_back, Plan **out, SgError *err)
{
    const int L = m->nlayers;
    Plan *p = calloc(1, sizeof *p);
    if (p == NULL)
        return sg_fail(err, SG_ENOMEM, "model plan: out of memory");
    p->B = B;
    p->act = calloc(L + 1, sizeof *p->act);
    p->dact = calloc(L + 1, sizeof *p->dact);
    p->lp = calloc(L, sizeof *p->lp);
    for (int l = 0; p->lp && l < L; l++)
        p->lp[l].weights_convert = -1;
    int rc = 0;
    if (!p->act || !p->dact || !p->lp) {
        rc = sg_fail(err, SG_ENOMEM, "model plan: out of memory");
        goto fail;
    }
    /* arena: act/dact per distinct buffer, the ops' scratch, colsum, out,
     * targets, weights, labels */
    size_t total = 2 * round16((size_t)B * model_input_size(m)), max_width = 0;
    for (int l = 0; l < L; l++) {
        const NnOpKind *op = nn_op_of(m, l);
        size_t o = (size_t)B * nn_op_out_size(m, l);
        max_width = nn_op_out_size(m, l) > max_width ? nn_op_out_size(m, l) : max_width;
        if (!(op->flags & NN_OP_ALIAS))
            total += 2 * round16(o);
        if (op->scratch)
            total += round16(op->scratch(m, l, B));
    }
    size_t bk = round16((size_t)B * m->classes);
    total += round16(max_width) + 2 * bk + 2 * round16((size_t)B);
    p->arena = aligned_alloc(64, ((total * sizeof(float) + 63) / 64) * 64);
    if (p->arena == NULL) {
        rc = sg_fail(err, SG_ENOMEM, "model plan: cannot allocate %zu floats for batch %d", total,
                     B);
        goto fail;
    }
    memset(p->arena, 0, total * sizeof(float));
    float *cur = p->arena;
    size_t in = round16((size_t)B * model_input_size(m));
    p->act[0] = cur, cur += in;
    p->dact[0] = cur, cur += in;
    for (int l = 0; l < L; l++) {
        const NnOpKind *op = nn_op_of(m, l);
        size_t o = round16((size_t)B * nn_op_out_size(m, l));
        if (op->flags & NN_OP_ALIAS) {
            p->act[l + 1] = p->act[l];
            p->dact[l + 1] = p->dact[l];
        } else {
            p->act[l + 1] = cur, cur += o;
            p->dact[l + 1] = cur, cur += o;
        }
        if (op->scratch)
            p->lp[l].scratch = cur, cur += round16(op->scratch(m, l, B));
    }
    p->colsum = cur, cur += round16(max_width);
    p->out = cur, cur += bk;
    p->targets = cur, cur += bk;
    p->weights = cur, cur += round16((size_t)B);
    p->labels = (int32_t *)cur;

    for (int l = 0; l < L; l++) {
        const NnOpKind *op = nn_op_of(m, l);
        if (op->build == NULL)
            continue;
        if ((op->flags & NN_OP_WEIGHTED) && m->precision == NN_BF16) {
            const int ncopies0 = p->ncopies;
            /* the first layer reads bf16 inputs that gather() converts */
            NnOpBuild how = {1, l == 0 || (chain && chain16_in(m, l)), chain && chain16(m, l)};
            rc = op->build(m, p, l, &how, err);
            if (rc == 0) {
                p->nbf16++;
                p->input16 |= l == 0;
                continue;
            }
            /* no bf16 implementation for this layer's shapes: f32 (what
             * the failed attempt created stays listed in p, freed with it) */
            if (rc != SG_EDNNL)
                goto fail;
            *fell_back = 1;
            if (chain) /* its neighbours would hand it bf16: rebuild unchained */
                goto fail;
            sg_error_clear(err);
            memset(&p->lp[l], 0, sizeof p->lp[l]);
            p->lp[l].weights_convert = -1;
            p->ncopies = ncopies0;
        }
        NnOpBuild f32 = {0, 0, 0};
        if ((rc = op->build(m, p, l, &f32, err)) < 0)
            goto fail;
    }
    if (p->input16 && (p->rowbuf = malloc(model_input_size(m) * sizeof(float))) == NULL) {
        rc = sg_fail(err, SG_ENOMEM, "model plan: out of memory");
        goto fail;
    }
    *out = p;
    return 0;
fail:
    plan_free(p);
    return rc;
}

int nn_bf16_supported(void)
{
    return nn_bf16_native();
}

NnPrecision model_set_precision(Model *m, NnPrecision prec)
{
    NnPrecision use = prec == NN_BF16 && nn_bf16_native() ? NN_BF16 : NN_FP32;
    if (use != m->precision) {
        m->w16_fresh = NULL;
        for (int i = 0; i < PLAN_CACHE; i++) {
            plan_free(m->plans[i]);
            m->plans[i] = NULL;
        }
        m->precision = use;
    }
    return use;
}

NnPrecision model_precision(const Model *m)
{
    return m->precision;
}

int model_bf16_layers(Model *m, int B, int *count, SgError *err)
{
    Plan *p = NULL;
    int rc = model_plan(m, B, &p, err);
    if (rc < 0)
        return rc;
    *count = p->nbf16;
    return 0;
}

int model_plan(Model *m, int B, Plan **out, SgError *err)
{
    if (B <= 0)
        return sg_fail(err, SG_EINVAL, "batch size must be > 0, not %d", B);
    int slot = 0;
    for (int i = 0; i < PLAN_CACHE; i++) {
        if (m->plans[i] && m->plans[i]->B == B) {
            m->plans[i]->last_use = ++m->use_clock;
            *out = m->plans[i];
            return 0;
        }
        if (m->plans[slot] && (!m->plans[i] || m->plans[i]->last_use < m->plans[slot]->last_use))
            slot = i;
    }
    if (m->w16_fresh == m->plans[slot])
        m->w16_fresh = NULL;
    plan_free(m->plans[slot]);
    m->plans[slot] = NULL;
    int fell_back = 0;
    int rc = plan_build(m, B, 1, &fell_back, &m->plans[slot], err);
    if (rc < 0 && fell_back) {
        sg_error_clear(err);
        rc = plan_build(m, B, 0, &fell_back, &m->plans[slot], err);
    }
    if (rc < 0)
        return rc;
    m->plans[slot]->last_use = ++m->use_clock;
    *out = m->plans[slot];
    return 0;
}

/* ---- passes ------------------------------------------------------------- */

int model_forward(Model *m, Plan *p, int training, SgError *err)
{
    for (int l = 0; l < m->nlayers; l++) {
        const NnOpKind *op = nn_op_of(m, l);
        int rc = op->forward ? op->forward(m, p, l, training, err) : 0;
        if (rc < 0)
            return rc;
    }
    return DNNL(err, dnnl_stream_wait, m->stream);
}

int model_dense_only(const Model *m)
{
    for (int l = 0; l < m->nlayers; l++)
        if (!(nn_op_of(m, l)->flags & NN_OP_FOLDS_SGD))
            return 0;
    return 1;
}

/* One walk backward over the layers, last first (see NnOpBackward). */
static int backward_pass(Model *m, Plan *p, const float *sgd_lr, const NnGradHook *hook,
                         SgError *err)
{
    const NnOpBackward how = {hook, sgd_lr};
    for (int l = m->nlayers - 1; l >= 0; l--) {
        const NnOpKind *op = nn_op_of(m, l);
        int rc = op->backward ? op->backward(m, p, l, &how, err) : 0;
        if (rc < 0)
            return rc;
    }
    return DNNL(err, dnnl_stream_wait, m->stream);
}

int model_backward(Model *m, Plan *p, const NnGradHook *hook, SgError *err)
{
    return backward_pass(m, p, NULL, hook, err);
}

int model_backward_sgd(Model *m, Plan *p, float lr, SgError *err)
{
    return backward_pass(m, p, &lr, NULL, err);
}
