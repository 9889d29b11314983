/*
 * nn_op_pool.c - MaxPool2D (oneDNN pooling with a workspace) and
 * AveragePooling2D (padding excluded from the average, as Keras), NHWC.
 */
#include "nn/nn_op.h"

static int pool_infer(Model *m, int l, SgError *err)
{
    return nn_op_infer_window(m, l, m->specs[l].kh, 0, err);
}

static int pool_build(Model *m, Plan *p, int l, const NnOpBuild *how, SgError *err)
{
    (void)how;
    const LayerSpec *sp = &m->specs[l];
    const LayerShape *s = &m->shapes[l];
    LayerPlan *lp = &p->lp[l];
    const int B = p->B;
    dnnl_alg_kind_t alg =
        sp->kind == LAYER_MAXPOOL ? dnnl_pooling_max : dnnl_pooling_avg_exclude_padding;
    dnnl_memory_desc_t src_md = NULL, dst_md = NULL;
    dnnl_primitive_desc_t fwd_pd = NULL, bwd_pd = NULL;
    dnnl_memory_t src_m, dst_m, ws_m = NULL, ddst_m, dsrc_m;
    const dnnl_dims_t strides = {sp->stride, sp->stride}, kernel = {sp->kh, sp->kw}, dil = {0, 0},
                      pl = {s->pt, s->pl}, pr = {s->pb, s->pr};
    dnnl_dims_t sd = {B, s->c, s->h, s->w}, dd = {B, s->oc, s->oh, s->ow};
    int rc;
    if ((rc = nn_md(&src_md, 4, sd, dnnl_nhwc, err)) < 0 ||
        (rc = nn_md(&dst_md, 4, dd, dnnl_nhwc, err)) < 0 ||
        (rc = DNNL(err, dnnl_pooling_forward_primitive_desc_create, &fwd_pd, m->eng,
                   dnnl_forward_training, alg, src_md, dst_md, strides, kernel, dil, pl, pr,
                   NULL)) < 0 ||
        (rc = plan_mem(m, p, &src_m, src_md, op_src(m, p, l, 0), err)) < 0 ||
        (rc = plan_mem(m, p, &dst_m, dst_md, op_dst(m, p, l), err)) < 0)
        goto cleanup;
    const_dnnl_memory_desc_t ws_md =
        dnnl_primitive_desc_query_md(fwd_pd, dnnl_query_workspace_md, 0);
    if (ws_md != NULL && dnnl_memory_desc_get_size(ws_md) > 0 &&
        (rc = plan_mem(m, p, &ws_m, ws_md, DNNL_MEMORY_ALLOCATE, err)) < 0)
        goto cleanup;
    NnExec *e = &lp->fwd[lp->nfwd++];
    if ((rc = plan_prim(p, &e->prim, fwd_pd, err)) < 0)
        goto cleanup;
    nn_exec_arg(e, DNNL_ARG_SRC, src_m);
    nn_exec_arg(e, DNNL_ARG_DST, dst_m);
    if (ws_m)
        nn_exec_arg(e, DNNL_ARG_WORKSPACE, ws_m);
    if (op_dsrc(p, l, 0) != NULL) {
        if ((rc = DNNL(err, dnnl_pooling_backward_primitive_desc_create, &bwd_pd, m->eng, alg,
                       src_md, dst_md, strides, kernel, dil, pl, pr, fwd_pd, NULL)) < 0 ||
            (rc = plan_mem(m, p, &ddst_m, dst_md, op_ddst(m, p, l), err)) < 0 ||
            (rc = plan_mem(m, p, &dsrc_m, src_md, op_dsrc(p, l, 0), err)) < 0)
            goto cleanup;
        e = &lp->bwd[lp->nbwd++];
        if ((rc = plan_prim(p, &e->prim, bwd_pd, err)) < 0)
            goto cleanup;
        nn_exec_arg(e, DNNL_ARG_DIFF_DST, ddst_m);
        nn_exec_arg(e, DNNL_ARG_DIFF_SRC, dsrc_m);
        if (ws_m)
            nn_exec_arg(e, DNNL_ARG_WORKSPACE, ws_m);
    }
    rc = 0;
cleanup:
    if (rc < 0)
        sg_context(err, "building layer %d (pooling, batch %d): ", l, B);
    dnnl_primitive_desc_destroy(fwd_pd);
    dnnl_primitive_desc_destroy(bwd_pd);
    dnnl_memory_desc_destroy(src_md);
    dnnl_memory_desc_destroy(dst_md);
    return rc;
}

const NnOpKind nn_op_maxpool = {
    "MaxPool2D",
    0,
    pool_infer,
    NULL,
    pool_build,
    nn_op_forward_primitives,
    nn_op_backward_primitives,
};

const NnOpKind nn_op_avgpool = {
    "AveragePooling2D",        0, pool_infer, NULL, pool_build, nn_op_forward_primitives,
    nn_op_backward_primitives,
};
