/* nn_op.c - the op table and what the ops share (see nn_op.h). */
#include "nn/nn_op.h"

#include <string.h>

static const NnOpKind *const OPS[LAYER_KIND_COUNT] = {
#define NN_OP_ENTRY(kind, name) [LAYER_##kind] = &nn_op_##name,
    NN_OPS(NN_OP_ENTRY)
#undef NN_OP_ENTRY
};

const NnOpKind *nn_op_kind(LayerKind kind)
{
    return (unsigned)kind < LAYER_KIND_COUNT ? OPS[kind] : NULL;
}

const char *nn_layer_kind_name(LayerKind kind)
{
    const NnOpKind *op = nn_op_kind(kind);
    return op ? op->name : NULL;
}

const NnOpKind *nn_op_of(const Model *m, int l)
{
    return nn_op_kind(m->specs[l].kind);
}

int nn_op_window(int in, int k, int s, int same, int *pad_lo, int *pad_hi)
{
    if (same) {
        int o = (in + s - 1) / s;
        int total = (o - 1) * s + k - in;
        total = total > 0 ? total : 0;
        *pad_lo = total / 2;
        *pad_hi = total - *pad_lo;
        return o;
    }
    *pad_lo = *pad_hi = 0;
    return in >= k ? (in - k) / s + 1 : 0;
}

size_t nn_op_out_size(const Model *m, int l)
{
    const LayerShape *s = &m->shapes[l];
    return (size_t)s->oh * s->ow * s->oc;
}

int nn_op_params_done(Model *m, int l, const NnOpBackward *how, size_t offset, size_t n,
                      const float *mine, SgError *err)
{
    const int tell = how->hook != NULL && how->hook->ready != NULL && m->tells[l];
    if (!m->accumulate[l] && !tell)
        return 0;
    int rc = DNNL(err, dnnl_stream_wait, m->stream); /* the CPU reads what primitives wrote */
    if (rc < 0)
        return rc;
    if (m->accumulate[l]) {
        float *dst = m->grads + offset;
#pragma omp parallel for simd schedule(static) if (n > 65536)
        for (size_t i = 0; i < n; i++)
            dst[i] += mine[i];
    }
    if (tell && (rc = how->hook->ready(how->hook->ctx, m->grads, offset, n, err)) < 0)
        return sg_context(err, "gradient hook on layer %d: ", l);
    return 0;
}

int nn_op_run(Model *m, NnExec *list, int n, int skip, int l, const char *what, SgError *err)
{
    for (int i = 0; i < n; i++) {
        if (i == skip)
            continue;
        int rc = nn_exec(&list[i], m->stream, err);
        if (rc < 0)
            return sg_context(err, "%s of layer %d: ", what, l);
    }
    return 0;
}

int nn_op_infer_window(Model *m, int l, int default_stride, int filters, SgError *err)
{
    LayerSpec *sp = &m->specs[l];
    LayerShape *s = &m->shapes[l];
    const char *name = nn_op_of(m, l)->name;
    const int stride = sp->stride > 0 ? sp->stride : default_stride;
    if (sp->kh <= 0 || sp->kw <= 0 || stride <= 0 || (filters && sp->units <= 0))
        return sg_fail(err, SG_EMODEL,
                       "layer %d (%s): kernel %dx%d, stride %d, filters %d must be > 0", l, name,
                       sp->kh, sp->kw, stride, sp->units);
    sp->stride = stride;
    s->oh = nn_op_window(s->h, sp->kh, stride, sp->same, &s->pt, &s->pb);
    s->ow = nn_op_window(s->w, sp->kw, stride, sp->same, &s->pl, &s->pr);
    s->oc = filters ? sp->units : s->c;
    if (s->oh <= 0 || s->ow <= 0)
        return sg_fail(
            err, SG_EMODEL,
            "layer %d (%s): window %dx%d does not fit the %dx%d input with valid padding", l, name,
            sp->kh, sp->kw, s->h, s->w);
    return 0;
}

int nn_op_forward_primitives(Model *m, Plan *p, int l, int training, SgError *err)
{
    (void)training;
    return nn_op_run(m, p->lp[l].fwd, p->lp[l].nfwd, -1, l, "forward", err);
}

int nn_op_backward_primitives(Model *m, Plan *p, int l, const NnOpBackward *how, SgError *err)
{
    (void)how;
    return nn_op_run(m, p->lp[l].bwd, p->lp[l].nbwd, -1, l, "backward", err);
}

/* The oneDNN algorithm and alpha of an activation (SELU: its ELU part). */
dnnl_alg_kind_t nn_op_eltwise(NnAct act, float *alpha)
{
    *alpha = 0.0f;
    switch (act) {
    case NN_ACT_NONE:
        *alpha = 1.0f; /* linear: 1 * x + 0 */
        return dnnl_eltwise_linear;
    case NN_ACT_RELU:
        return dnnl_eltwise_relu;
    case NN_ACT_LEAKY_RELU:
        *alpha = NN_LEAKY_RELU_SLOPE;
        return dnnl_eltwise_relu;
    case NN_ACT_TANH:
        return dnnl_eltwise_tanh;
    case NN_ACT_SIGMOID:
        return dnnl_eltwise_logistic;
    case NN_ACT_ELU:
        *alpha = 1.0f;
        return dnnl_eltwise_elu;
    case NN_ACT_SELU:
        *alpha = NN_SELU_ALPHA;
        return dnnl_eltwise_elu;
    case NN_ACT_GELU:
        return dnnl_eltwise_gelu_erf;
    case NN_ACT_SWISH:
        *alpha = 1.0f; /* x * sigmoid(1 * x) */
        return dnnl_eltwise_swish;
    case NN_ACT_SOFTPLUS:
        *alpha = 1.0f; /* log(1 + exp(1 * x)) / 1 */
        return dnnl_eltwise_soft_relu;
    default:
        return dnnl_alg_kind_undef;
    }
}

/* One eltwise primitive pair: forward src -> dst into lp->fwd; unless dsrc
 * is NULL (a model input's gradient), backward (src, diff_dst) -> diff_src into lp->bwd (at the
 * front when `first`: a chain's backward runs in reverse). */
static int eltwise_pair(Model *m, Plan *p, int l, dnnl_alg_kind_t alg, float alpha,
                        const_dnnl_memory_desc_t md, float *src, float *dst, float *dsrc,
                        float *ddst, SgError *err)
{
    LayerPlan *lp = &p->lp[l];
    dnnl_primitive_desc_t fwd_pd = NULL, bwd_pd = NULL;
    dnnl_memory_t src_m, dst_m, dsrc_m, ddst_m;
    int rc;
    if ((rc = DNNL(err, dnnl_eltwise_forward_primitive_desc_create, &fwd_pd, m->eng,
                   dnnl_forward_training, alg, md, md, alpha, 0.0f, NULL)) < 0 ||
        (rc = plan_mem(m, p, &src_m, md, src, err)) < 0 ||
        (rc = plan_mem(m, p, &dst_m, md, dst, err)) < 0)
        goto cleanup;
    NnExec *e = &lp->fwd[lp->nfwd++];
    if ((rc = plan_prim(p, &e->prim, fwd_pd, err)) < 0)
        goto cleanup;
    nn_exec_arg(e, DNNL_ARG_SRC, src_m);
    nn_exec_arg(e, DNNL_ARG_DST, dst_m);
    if (dsrc == NULL)
        goto cleanup;
    if ((rc = DNNL(err, dnnl_eltwise_backward_primitive_desc_create, &bwd_pd, m->eng, alg, md, md,
                   md, alpha, 0.0f, fwd_pd, NULL)) < 0 ||
        (rc = plan_mem(m, p, &dsrc_m, md, dsrc, err)) < 0 ||
        (rc = plan_mem(m, p, &ddst_m, md, ddst, err)) < 0)
        goto cleanup;
    /* backward runs in reverse: the later pair's primitive goes first */
    for (int i = lp->nbwd; i > 0; i--)
        lp->bwd[i] = lp->bwd[i - 1];
    lp->nbwd++;
    e = &lp->bwd[0];
    memset(e, 0, sizeof *e);
    if ((rc = plan_prim(p, &e->prim, bwd_pd, err)) < 0)
        goto cleanup;
    nn_exec_arg(e, DNNL_ARG_SRC, src_m);
    nn_exec_arg(e, DNNL_ARG_DIFF_DST, ddst_m);
    nn_exec_arg(e, DNNL_ARG_DIFF_SRC, dsrc_m);
cleanup:
    dnnl_primitive_desc_destroy(fwd_pd);
    dnnl_primitive_desc_destroy(bwd_pd);
    return rc;
}

int nn_op_eltwise_chain(Model *m, Plan *p, int l, NnAct act, const_dnnl_memory_desc_t md,
                        float *src, float *mid, float *dst, float *dsrc, float *ddst, SgError *err)
{
    float alpha;
    const dnnl_alg_kind_t alg = nn_op_eltwise(act, &alpha);
    if (alg == dnnl_alg_kind_undef)
        return sg_fail(err, SG_EMODEL, "layer %d: activation %d has no eltwise form", l, (int)act);
    if (act != NN_ACT_SELU)
        return eltwise_pair(m, p, l, alg, alpha, md, src, dst, dsrc, ddst, err);
    /* scale * elu(x): the ELU into mid, then the scale; backward the scale's
     * into dsrc first, then the ELU's in place there */
    int rc = eltwise_pair(m, p, l, alg, alpha, md, src, mid, dsrc, dsrc, err);
    if (rc == 0)
        rc = eltwise_pair(m, p, l, dnnl_eltwise_linear, NN_SELU_SCALE, md, mid, dst, dsrc, ddst,
                          err);
    return rc;
}
