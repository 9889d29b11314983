/*
 * nn_op_activation.c - Activation: one activation applied elementwise
 * (Keras' Activation layer), on oneDNN eltwise primitives: forward in
 * training mode, backward from the input, so every activation works here,
 * including those Dense and Conv2D cannot fuse (their backward runs from the
 * output). SELU is oneDNN's ELU then a linear scale, through a scratch
 * buffer. Softmax is a loss head (a last Dense's activation), not this op.
 * The first op added after the op table: this file, its line in NN_OPS, its
 * Python class and its tests.
 */
#include "nn/nn_op.h"

#include <string.h>

/* The oneDNN algorithm and alpha of an activation (SELU: its ELU part). */
static dnnl_alg_kind_t eltwise_of(NnAct act, float *alpha)
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

static int activation_infer(Model *m, int l, SgError *err)
{
    LayerShape *s = &m->shapes[l];
    float alpha;
    const NnAct act = m->specs[l].act;
    if (act == NN_ACT_SOFTMAX)
        return sg_fail(
            err, SG_EMODEL,
            "layer %d (Activation): softmax is not an Activation layer here; give the last "
            "Dense activation=\"softmax\" (the loss applies it)",
            l);
    if ((unsigned)act >= NN_ACT_COUNT || eltwise_of(act, &alpha) == dnnl_alg_kind_undef)
        return sg_fail(err, SG_EMODEL, "layer %d (Activation): unknown activation %d", l, (int)act);
    s->oh = s->h, s->ow = s->w, s->oc = s->c;
    return 0;
}

/* SELU's ELU output, between its two primitives */
static size_t activation_scratch(const Model *m, int l, int B)
{
    return m->specs[l].act == NN_ACT_SELU ? (size_t)B * nn_op_out_size(m, l) : 0;
}

/* One eltwise primitive pair: forward src -> dst into lp->fwd; unless l is
 * the first layer, backward (src, diff_dst) -> diff_src into lp->bwd (at the
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

static int activation_build(Model *m, Plan *p, int l, const NnOpBuild *how, SgError *err)
{
    (void)how;
    const LayerShape *s = &m->shapes[l];
    const NnAct act = m->specs[l].act;
    dnnl_dims_t d = {p->B, s->c, s->h, s->w};
    dnnl_memory_desc_t md = NULL;
    float alpha;
    const dnnl_alg_kind_t alg = eltwise_of(act, &alpha);
    /* the first layer's input gradient is never needed */
    float *dsrc = l > 0 ? p->dact[l] : NULL;
    int rc = nn_md(&md, 4, d, dnnl_nhwc, err);
    if (rc < 0)
        goto cleanup;
    if (act != NN_ACT_SELU) {
        rc = eltwise_pair(m, p, l, alg, alpha, md, p->act[l], p->act[l + 1], dsrc, p->dact[l + 1],
                          err);
    } else {
        /* scale * elu(x): the ELU into the scratch, then the scale; backward
         * the scale's into dact[l] first, then the ELU's in place there */
        float *mid = p->lp[l].scratch;
        rc = eltwise_pair(m, p, l, alg, alpha, md, p->act[l], mid, dsrc, dsrc, err);
        if (rc == 0)
            rc = eltwise_pair(m, p, l, dnnl_eltwise_linear, NN_SELU_SCALE, md, mid, p->act[l + 1],
                              dsrc, p->dact[l + 1], err);
    }
cleanup:
    if (rc < 0)
        sg_context(err, "building layer %d (Activation, batch %d): ", l, p->B);
    dnnl_memory_desc_destroy(md);
    return rc;
}

/* No parameters, so plain SGD folds around it (NN_OP_FOLDS_SGD). */
const NnOpKind nn_op_activation = {
    "Activation",
    NN_OP_ACTIVATION | NN_OP_FOLDS_SGD,
    activation_infer,
    activation_scratch,
    activation_build,
    nn_op_forward_primitives,
    nn_op_backward_primitives,
};
