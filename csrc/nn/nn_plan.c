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
    free(p->din);
    free(p->edge_first);
    free(p->edges);
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

/* The one node that reads tensor t, or -1 (none, several, or an output's
 * loss among its readers). */
static int sole_reader(const Model *m, int t)
{
    if (m->readers[t] != 1)
        return -1;
    for (int l = 0; l < m->nlayers; l++)
        if (node_in(m, l, 0) == t && m->nodes[l].ninputs == 1)
            return l;
    return -1; /* an output's loss, or a merge */
}

/* 1 if weighted layer l's output is read by one weighted layer alone (aliases
 * such as Flatten in between): with chain, an activation kept in bf16. */
static int chain16(const Model *m, int l)
{
    if (!weighted(m, l) || nn_weighted_unfused(m, l))
        return 0;
    for (int k = sole_reader(m, node_out(m, l)); k >= 0; k = sole_reader(m, node_out(m, k)))
        if (!alias(m, k))
            return weighted(m, k);
    return 0;
}

static int chain16_in(const Model *m, int l)
{
    if (!weighted(m, l))
        return 0;
    for (int t = node_in(m, l, 0); t >= m->ninputs; t = node_in(m, t - m->ninputs, 0)) {
        const int k = t - m->ninputs;
        if (!alias(m, k))
            return chain16(m, k);
    }
    return 0;
}

/* Input i of the model whose only reader is weighted layer l (gather() then
 * hands l its input in bf16), or -1. */
static int bf16_input(const Model *m, int l)
{
    const int t = node_in(m, l, 0);
    return weighted(m, l) && t < m->ninputs && sole_reader(m, t) == l ? t : -1;
}

/* Floats of one sample of tensor t. */
static size_t tensor_size(const Model *m, int t)
{
    const NnShape *s = &m->tshape[t];
    return (size_t)s->h * s->w * s->c;
}

/* Whether tensor t owns its buffers (an alias's output shares its input's). */
static int owns_buffers(const Model *m, int t)
{
    return t < m->ninputs || !alias(m, t - m->ninputs);
}

/* Where node l writes the gradient of its input k (see Plan). */
static float **din_slot(Plan *p, int l, int k)
{
    return &p->din[(size_t)l * NN_MAX_NODE_INPUTS + k];
}

/* Lays the plan's buffers out in the arena (cur NULL: only counts floats,
 * into *total): per tensor its values and gradient, the gradient edges of
 * tensors with several readers, the ops' scratch, then the outputs' and the
 * batch's buffers. */
static void lay_out(const Model *m, Plan *p, float *cur, size_t *total, int *edge_count)
{
    const int B = p->B, T = m->ntensors_graph;
    size_t n = 0, max_width = 0;
#define TAKE(ptr, floats)                                                                          \
    do {                                                                                           \
        size_t f_ = round16(floats);                                                               \
        if (cur)                                                                                   \
            (ptr) = cur + n;                                                                       \
        n += f_;                                                                                   \
    } while (0)
    int nedges = 0;
    for (int t = 0; t < T; t++) {
        const size_t size = (size_t)B * tensor_size(m, t);
        max_width = tensor_size(m, t) > max_width ? tensor_size(m, t) : max_width;
        float *a = NULL, *d = NULL;
        if (owns_buffers(m, t)) {
            TAKE(a, size);
            if (m->needs_grad[t])
                TAKE(d, size);
        } else if (cur) {
            const int l = t - m->ninputs;
            a = p->act[node_in(m, l, 0)];
            d = *din_slot(p, l, 0);
        }
        if (cur) {
            p->act[t] = a;
            p->dact[t] = d;
            p->edge_first[t] = nedges;
        }
        /* the readers' gradient buffers: dact itself for one reader, else
         * one edge each, summed into dact (slot: where the reader finds it) */
        const int several = m->readers[t] > 1 && m->needs_grad[t];
#define EDGE(slot)                                                                                 \
    do {                                                                                           \
        float *e_ = d;                                                                             \
        if (several) {                                                                             \
            TAKE(e_, size);                                                                        \
            if (cur)                                                                               \
                p->edges[nedges] = e_;                                                             \
            nedges++;                                                                              \
        }                                                                                          \
        if (cur)                                                                                   \
            *(slot) = e_;                                                                          \
    } while (0)
        for (int l = 0; l < m->nlayers; l++)
            for (int k = 0; k < m->nodes[l].ninputs; k++)
                if (node_in(m, l, k) == t)
                    EDGE(din_slot(p, l, k));
        for (int j = 0; j < m->noutputs; j++)
            if (m->outputs[j].tensor == t)
                EDGE(&p->outputs[j].dz);
#undef EDGE
    }
    if (cur)
        p->edge_first[T] = nedges;
    for (int l = 0; l < m->nlayers; l++) {
        const NnOpKind *op = nn_op_of(m, l);
        if (op->scratch)
            TAKE(p->lp[l].scratch, op->scratch(m, l, B));
    }
    TAKE(p->colsum, max_width);
    for (int j = 0; j < m->noutputs; j++) {
        const size_t bk = (size_t)B * m->outputs[j].width;
        TAKE(p->outputs[j].out, bk);
        TAKE(p->outputs[j].targets, bk);
        float *labels = NULL;
        TAKE(labels, B);
        if (cur)
            p->outputs[j].labels = (int32_t *)labels;
    }
    TAKE(p->weights, B);
    float *rows = NULL;
    TAKE(rows, 2 * (size_t)B); /* int64 each */
    if (cur)
        p->rows = (int64_t *)rows;
#undef TAKE
    *total = n;
    *edge_count = nedges;
}

/* Builds the plan for batch B; chain: bf16 layers hand bf16 activations to
 * each other (NnOpBuild's input_bf16 / output_bf16). *fell_back is set when a layer
 * had no bf16 implementation and was built in f32. */
static int plan_build(Model *m, int B, int chain, int *fell_back, Plan **out, SgError *err)
{
    const int L = m->nlayers, T = m->ntensors_graph;
    Plan *p = calloc(1, sizeof *p);
    if (p == NULL)
        return sg_fail(err, SG_ENOMEM, "model plan: out of memory");
    p->B = B;
    size_t total = 0;
    int nedges = 0;
    lay_out(m, p, NULL, &total, &nedges);
    p->act = calloc(T, sizeof *p->act);
    p->dact = calloc(T, sizeof *p->dact);
    p->din = calloc((size_t)L * NN_MAX_NODE_INPUTS, sizeof *p->din);
    p->edge_first = calloc(T + 1, sizeof *p->edge_first);
    p->edges = calloc(nedges ? nedges : 1, sizeof *p->edges);
    p->lp = calloc(L, sizeof *p->lp);
    for (int l = 0; p->lp && l < L; l++)
        p->lp[l].weights_convert = -1;
    int rc = 0;
    if (!p->act || !p->dact || !p->din || !p->edge_first || !p->edges || !p->lp) {
        rc = sg_fail(err, SG_ENOMEM, "model plan: out of memory");
        goto fail;
    }
    p->arena = aligned_alloc(64, ((total * sizeof(float) + 63) / 64) * 64);
    if (p->arena == NULL) {
        rc = sg_fail(err, SG_ENOMEM, "model plan: cannot allocate %zu floats for batch %d", total,
                     B);
        goto fail;
    }
    memset(p->arena, 0, total * sizeof(float));
    lay_out(m, p, p->arena, &total, &nedges);

    size_t max_row = 0;
    for (int l = 0; l < L; l++) {
        const NnOpKind *op = nn_op_of(m, l);
        if (op->build == NULL)
            continue;
        if ((op->flags & NN_OP_WEIGHTED) && m->precision == NN_BF16) {
            const int ncopies0 = p->ncopies;
            /* a layer whose input is the model's reads bf16 inputs that gather() converts */
            const int in16 = bf16_input(m, l);
            NnOpBuild how = {1, in16 >= 0 || (chain && chain16_in(m, l)), chain && chain16(m, l)};
            rc = op->build(m, p, l, &how, err);
            if (rc == 0) {
                p->nbf16++;
                if (in16 >= 0) {
                    p->input16[in16] = 1;
                    max_row = tensor_size(m, in16) > max_row ? tensor_size(m, in16) : max_row;
                }
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
            float *scratch = p->lp[l].scratch;
            memset(&p->lp[l], 0, sizeof p->lp[l]);
            p->lp[l].scratch = scratch;
            p->lp[l].weights_convert = -1;
            p->ncopies = ncopies0;
        }
        NnOpBuild f32 = {0, 0, 0};
        if ((rc = op->build(m, p, l, &f32, err)) < 0)
            goto fail;
    }
    if (max_row > 0 && (p->rowbuf = malloc(max_row * sizeof(float))) == NULL) {
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
        if (!(nn_op_of(m, l)->flags & NN_OP_FOLDS_SGD) || m->accumulate[l] ||
            (m->kernel_t[l] >= 0 && !m->tells[l]))
            return 0; /* shared weights: an update between two uses would change the second */
    return 1;
}

/* dact[t] = the sum of its readers' edge buffers, when it has several. */
static void sum_edges(const Model *m, Plan *p, int t)
{
    const int first = p->edge_first[t], last = p->edge_first[t + 1];
    if (last - first < 2 || p->dact[t] == NULL)
        return;
    const size_t n = (size_t)p->B * tensor_size(m, t);
    float *d = p->dact[t];
    memcpy(d, p->edges[first], n * sizeof(float));
    for (int e = first + 1; e < last; e++) {
        const float *src = p->edges[e];
#pragma omp parallel for simd schedule(static) if (n > 65536)
        for (size_t i = 0; i < n; i++)
            d[i] += src[i];
    }
}

/* One walk backward over the nodes, last first (see NnOpBackward): each
 * node's output gradient summed from its readers', then its backward. */
static int backward_pass(Model *m, Plan *p, const float *sgd_lr, const NnGradHook *hook,
                         SgError *err)
{
    const NnOpBackward how = {hook, sgd_lr};
    for (int l = m->nlayers - 1; l >= 0; l--) {
        const NnOpKind *op = nn_op_of(m, l);
        if (p->edge_first[node_out(m, l) + 1] - p->edge_first[node_out(m, l)] > 1) {
            int rc = DNNL(err, dnnl_stream_wait, m->stream);
            if (rc < 0)
                return rc;
            sum_edges(m, p, node_out(m, l));
        }
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
