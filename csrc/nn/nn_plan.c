/*
 * nn_plan.c - the execution plan of a model for one batch size: buffers for
 * every activation and its gradient, and every oneDNN primitive with its
 * arguments bound, built once and replayed each step (see nn_model_impl.h).
 */
#include "nn/nn_model_impl.h"

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

static int plan_mem(Model *m, Plan *p, dnnl_memory_t *out, const_dnnl_memory_desc_t md, void *data,
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

static int plan_prim(Plan *p, dnnl_primitive_t *out, const_dnnl_primitive_desc_t pd, SgError *err)
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
static int plan_copy(Plan *p, const OptimBf16Copy *c, SgError *err)
{
    OptimBf16Copy *n = realloc(p->copies, (size_t)(p->ncopies + 1) * sizeof *n);
    if (n == NULL)
        return sg_fail(err, SG_ENOMEM, "model plan: out of memory");
    p->copies = n;
    p->copies[p->ncopies++] = *c;
    return 0;
}

/* A reorder src_mem -> a new library-owned memory of md dst, appended to e. */
static int plan_reorder(Model *m, Plan *p, NnExec *e, dnnl_memory_t from, dnnl_memory_t to,
                        SgError *err)
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

/* ---- Dense and Conv2D --------------------------------------------------- */

/* If md (a Dense layer's bf16 weights, dims [OC, C]) is AB8b<ablk>a2b, the
 * copy the optimizer can write into data (OptimBf16Copy); else 0. */
static int pair_layout(const_dnnl_memory_desc_t md, int oc, int c, OptimBf16Copy *out)
{
    dnnl_format_kind_t fk;
    const dnnl_dims_t *strides, *blks, *idxs;
    dnnl_dim_t off0;
    int nd, nb;
    if (dnnl_memory_desc_query(md, dnnl_query_format_kind, &fk) != dnnl_success ||
        dnnl_memory_desc_query(md, dnnl_query_ndims_s32, &nd) != dnnl_success ||
        dnnl_memory_desc_query(md, dnnl_query_inner_nblks_s32, &nb) != dnnl_success ||
        dnnl_memory_desc_query(md, dnnl_query_strides, &strides) != dnnl_success ||
        dnnl_memory_desc_query(md, dnnl_query_inner_blks, &blks) != dnnl_success ||
        dnnl_memory_desc_query(md, dnnl_query_inner_idxs, &idxs) != dnnl_success ||
        dnnl_memory_desc_query(md, dnnl_query_submemory_offset_s64, &off0) != dnnl_success)
        return 0;
    if (fk != dnnl_blocked || nd != 2 || nb != 3 || off0 != 0 || (*idxs)[0] != 1 ||
        (*idxs)[1] != 0 || (*idxs)[2] != 1 || (*blks)[0] != 8 || (*blks)[2] != 2 ||
        (*blks)[1] % 16 || c % 2)
        return 0;
    /* the columns padded to the block width, and the rows to 16 */
    const dnnl_dims_t *pd;
    if (dnnl_memory_desc_query(md, dnnl_query_padded_dims, &pd) != dnnl_success ||
        (*pd)[0] < (oc + 15) / 16 * 16 || (*pd)[0] % (*blks)[1] || (*pd)[1] % 16)
        return 0;
    out->rows = c;
    out->cols = oc;
    out->ablk = (int)(*blks)[1];
    out->stride_a = (size_t)(*strides)[0];
    out->stride_b = (size_t)(*strides)[1];
    return 1;
}

static dnnl_alg_kind_t act_alg(NnAct a, int use_dst)
{
    switch (a) {
    case NN_ACT_RELU:
        return use_dst ? dnnl_eltwise_relu_use_dst_for_bwd : dnnl_eltwise_relu;
    case NN_ACT_TANH:
        return use_dst ? dnnl_eltwise_tanh_use_dst_for_bwd : dnnl_eltwise_tanh;
    case NN_ACT_SIGMOID:
        return use_dst ? dnnl_eltwise_logistic_use_dst_for_bwd : dnnl_eltwise_logistic;
    default:
        return dnnl_alg_kind_undef;
    }
}

/* Picks, among the memories have[0..n) (NULL entries skipped), the one whose
 * descriptor is want; else a new memory of want filled by a reorder from
 * `from`, appended to the layer's backward list. */
static int bind_as(Model *m, Plan *p, LayerPlan *lp, const_dnnl_memory_desc_t want,
                   dnnl_memory_t *have, int n, dnnl_memory_t from, dnnl_memory_t *out, SgError *err)
{
    for (int i = 0; i < n; i++) {
        const_dnnl_memory_desc_t md;
        int rc;
        if (have[i] == NULL)
            continue;
        if ((rc = DNNL(err, dnnl_memory_get_memory_desc, have[i], &md)) < 0)
            return rc;
        if (dnnl_memory_desc_equal(md, want)) {
            *out = have[i];
            return 0;
        }
    }
    int rc = plan_mem(m, p, out, want, DNNL_MEMORY_ALLOCATE, err);
    if (rc < 0)
        return rc;
    return plan_reorder(m, p, &lp->bwd[lp->nbwd++], from, *out, err);
}

/* A Dense or Conv2D layer. The parameters and their gradients are f32
 * buffers of the model; the activations and their gradients f32 buffers of
 * the plan, except between two bf16 layers (below). With bf16 (the model's
 * precision), the primitives take bf16 copies of their inputs, made by
 * reorders: the layer input and the f32 master weights before the forward (so
 * the weights are converted once per step, and the backward data reuses that
 * copy), the output gradient after the activation backward; they accumulate
 * in f32 and write f32 diff weights and bias.
 *
 * in16 / out16 (see chain16): the layer's input / output is an activation
 * between two bf16 layers, kept in bf16 in its plan buffer: the producer's
 * forward writes it in bf16 (activation fused, rounded once, as the reorder
 * would), the consumer's backward data writes its gradient in bf16, and the
 * producer's activation backward runs in bf16 on it (for ReLU exactly the
 * rounded f32 result), so neither direction needs a conversion reorder. */
static int build_weighted(Model *m, Plan *p, int l, int bf16, int in16, int out16, SgError *err)
{
    const LayerSpec *sp = &m->specs[l];
    const LayerShape *s = &m->shapes[l];
    LayerPlan *lp = &p->lp[l];
    const int conv = sp->kind == LAYER_CONV2D, B = p->B;
    const int fused = act_alg(sp->act, 0) != dnnl_alg_kind_undef;
    const dnnl_data_type_t lt = bf16 ? dnnl_bf16 : dnnl_f32; /* the primitives' input type */
    const ParamInfo *kt = &m->tensors[m->kernel_t[l]], *bt = &m->tensors[m->bias_t[l]];
    dnnl_memory_desc_t src_md = NULL, dst_md = NULL, w_md = NULL, w_any = NULL, b_md = NULL,
                       src_any = NULL, dst_any = NULL, dw_any = NULL, src16_md = NULL,
                       dst16_md = NULL;
    dnnl_primitive_desc_t fwd_pd = NULL, efwd_pd = NULL, ebwd_pd = NULL, bww_pd = NULL,
                          bwd_pd = NULL;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_memory_t src_m, dst_m, w_m, fw_m, b_m, ddst_m, g_m, dw_m, db_m, dsrc_m, tmp;
    dnnl_memory_t src16_m = NULL, g16_m = NULL;
    /* the memory descriptors of this layer's input and output buffers */
    const_dnnl_memory_desc_t in_md, out_md;
    const dnnl_dims_t strides = {sp->stride, sp->stride}, dil = {0, 0}, pl = {s->pt, s->pl},
                      pr = {s->pb, s->pr};
    int rc;

    in16 = in16 && bf16;
    out16 = out16 && bf16;
    lp->bf16 = bf16;
    lp->in16 = in16;
    lp->out16 = out16;
    if (conv) {
        dnnl_dims_t sd = {B, s->c, s->h, s->w}, dd = {B, s->oc, s->oh, s->ow},
                    wd = {s->oc, s->c, sp->kh, sp->kw};
        if ((rc = nn_md(&src_md, 4, sd, dnnl_nhwc, err)) < 0 ||
            (rc = nn_md(&dst_md, 4, dd, dnnl_nhwc, err)) < 0 ||
            (rc = nn_md(&w_md, 4, wd, dnnl_hwio, err)) < 0 ||
            (rc = nn_md_dt(&w_any, 4, wd, lt, dnnl_format_tag_any, err)) < 0 ||
            (rc = nn_md(&dw_any, 4, wd, dnnl_format_tag_any, err)) < 0 ||
            (rc = nn_md_dt(&src_any, 4, sd, lt, dnnl_format_tag_any, err)) < 0 ||
            (rc = nn_md_dt(&dst_any, 4, dd, lt, dnnl_format_tag_any, err)) < 0 ||
            (rc = nn_md_dt(&src16_md, 4, sd, lt, dnnl_nhwc, err)) < 0 ||
            (rc = nn_md_dt(&dst16_md, 4, dd, lt, dnnl_nhwc, err)) < 0)
            goto cleanup;
    } else {
        dnnl_dims_t sd = {B, s->c}, dd = {B, s->oc}, wd = {s->oc, s->c};
        /* f32: the weights stay in the flat buffer's layout (io); bf16: the
         * conversion reorder writes the layout oneDNN prefers */
        dnnl_format_tag_t wt = bf16 ? dnnl_format_tag_any : dnnl_io;
        if ((rc = nn_md(&src_md, 2, sd, dnnl_ab, err)) < 0 ||
            (rc = nn_md(&dst_md, 2, dd, dnnl_ab, err)) < 0 ||
            (rc = nn_md(&w_md, 2, wd, dnnl_io, err)) < 0 ||
            (rc = nn_md_dt(&w_any, 2, wd, lt, wt, err)) < 0 ||
            (rc = nn_md(&dw_any, 2, wd, dnnl_io, err)) < 0 ||
            (rc = nn_md_dt(&src16_md, 2, sd, lt, dnnl_ab, err)) < 0 ||
            (rc = nn_md_dt(&dst16_md, 2, dd, lt, dnnl_ab, err)) < 0)
            goto cleanup;
    }
    {
        dnnl_dims_t bd = {s->oc};
        if ((rc = nn_md(&b_md, 1, bd, dnnl_a, err)) < 0)
            goto cleanup;
    }
    in_md = in16 ? src16_md : src_md;
    out_md = out16 ? dst16_md : dst_md;
    if (fused) {
        if ((rc = DNNL(err, dnnl_post_ops_create, &po)) < 0 ||
            (rc = DNNL(err, dnnl_post_ops_append_eltwise, po, act_alg(sp->act, 0), 0.0f, 0.0f)) <
                0 ||
            (rc = DNNL(err, dnnl_primitive_attr_create, &attr)) < 0 ||
            (rc = DNNL(err, dnnl_primitive_attr_set_post_ops, attr, po)) < 0)
            goto cleanup;
    }
    rc = conv ? DNNL(err, dnnl_convolution_forward_primitive_desc_create, &fwd_pd, m->eng,
                     dnnl_forward_training, dnnl_convolution_direct, src16_md, w_any, b_md, out_md,
                     strides, dil, pl, pr, attr)
              : DNNL(err, dnnl_inner_product_forward_primitive_desc_create, &fwd_pd, m->eng,
                     dnnl_forward_training, src16_md, w_any, b_md, out_md, attr);
    if (rc < 0)
        goto cleanup;

    float *W = m->params + kt->offset, *dW = m->grads + kt->offset;
    if ((rc = plan_mem(m, p, &src_m, in_md, p->act[l], err)) < 0 ||
        (rc = plan_mem(m, p, &dst_m, out_md, p->act[l + 1], err)) < 0 ||
        (rc = plan_mem(m, p, &ddst_m, out_md, p->dact[l + 1], err)) < 0 ||
        (rc = plan_mem(m, p, &w_m, w_md, W, err)) < 0 ||
        (rc = plan_mem(m, p, &dw_m, w_md, dW, err)) < 0 ||
        (rc = plan_mem(m, p, &b_m, b_md, m->params + bt->offset, err)) < 0 ||
        (rc = plan_mem(m, p, &db_m, b_md, m->grads + bt->offset, err)) < 0)
        goto cleanup;

    /* forward: [input to bf16,] [weights to the preferred layout (and bf16),] compute */
    if (in16) {
        src16_m = src_m; /* already bf16: there is no f32 copy */
        src_m = NULL;
    } else if (bf16 && ((rc = plan_mem(m, p, &src16_m, src16_md, DNNL_MEMORY_ALLOCATE, err)) < 0 ||
                        (rc = plan_reorder(m, p, &lp->fwd[lp->nfwd++], src_m, src16_m, err)) < 0))
        goto cleanup;
    dnnl_memory_t fsrc_m = bf16 ? src16_m : src_m;
    const_dnnl_memory_desc_t fw_md = dnnl_primitive_desc_query_md(fwd_pd, dnnl_query_weights_md, 0);
    fw_m = w_m;
    lp->iwr = -1;
    if (!dnnl_memory_desc_equal(fw_md, w_md)) {
        OptimBf16Copy cp = {kt->offset, 0, 0, 0, 0, 0, NULL};
        void *h = NULL;
        if ((rc = plan_mem(m, p, &fw_m, fw_md, DNNL_MEMORY_ALLOCATE, err)) < 0 ||
            (rc = DNNL(err, dnnl_memory_get_data_handle, fw_m, &h)) < 0)
            goto cleanup;
        /* a bf16 Dense copy the optimizer can write (a layout pair_layout
         * knows) is still converted by the reorder where the optimizer did not */
        if (bf16 && !conv && optim_bf16_copy_supported() && pair_layout(fw_md, s->oc, s->c, &cp)) {
            cp.dst = h;
            if ((rc = plan_copy(p, &cp, err)) < 0)
                goto cleanup;
            lp->iwr = lp->nfwd;
        }
        if ((rc = plan_reorder(m, p, &lp->fwd[lp->nfwd++], w_m, fw_m, err)) < 0)
            goto cleanup;
    }
    NnExec *e = &lp->fwd[lp->nfwd++];
    if ((rc = plan_prim(p, &e->prim, fwd_pd, err)) < 0)
        goto cleanup;
    nn_exec_arg(e, DNNL_ARG_SRC, fsrc_m);
    nn_exec_arg(e, DNNL_ARG_WEIGHTS, fw_m);
    nn_exec_arg(e, DNNL_ARG_BIAS, b_m);
    nn_exec_arg(e, DNNL_ARG_DST, dst_m);

    /* backward: activation (from dst), [output gradient to bf16,] weights + bias, data */
    g_m = ddst_m;
    if (fused) {
        if ((rc = DNNL(err, dnnl_eltwise_forward_primitive_desc_create, &efwd_pd, m->eng,
                       dnnl_forward_training, act_alg(sp->act, 1), out_md, out_md, 0.0f, 0.0f,
                       NULL)) < 0 ||
            (rc = DNNL(err, dnnl_eltwise_backward_primitive_desc_create, &ebwd_pd, m->eng,
                       act_alg(sp->act, 1), out_md, out_md, out_md, 0.0f, 0.0f, efwd_pd, NULL)) < 0)
            goto cleanup;
        /* in place: the gradient before the activation overwrites dact[l+1] */
        e = &lp->bwd[lp->nbwd++];
        if ((rc = plan_prim(p, &e->prim, ebwd_pd, err)) < 0)
            goto cleanup;
        nn_exec_arg(e, DNNL_ARG_DST, dst_m);
        nn_exec_arg(e, DNNL_ARG_DIFF_DST, ddst_m);
        nn_exec_arg(e, DNNL_ARG_DIFF_SRC, ddst_m);
    }
    if (out16) {
        g16_m = g_m; /* already bf16 */
        g_m = NULL;
    } else if (bf16 && ((rc = plan_mem(m, p, &g16_m, dst16_md, DNNL_MEMORY_ALLOCATE, err)) < 0 ||
                        (rc = plan_reorder(m, p, &lp->bwd[lp->nbwd++], g_m, g16_m, err)) < 0))
        goto cleanup;
    /* weight gradients (f32): oneDNN may prefer blocked activations; reorder to
     * them. A bf16 convolution first tries the NHWC copies it already has (its
     * bf16 weights backward runs on them at least as fast as on blocked ones,
     * and the two reorders a step cost more than the difference) */
    rc = dnnl_unimplemented;
    if (conv && bf16)
        rc = dnnl_convolution_backward_weights_primitive_desc_create(
            &bww_pd, m->eng, dnnl_convolution_direct, src16_md, dw_any, b_md, dst16_md, strides,
            dil, pl, pr, fwd_pd, NULL);
    if (rc != dnnl_success)
        rc = conv ? DNNL(err, dnnl_convolution_backward_weights_primitive_desc_create, &bww_pd,
                         m->eng, dnnl_convolution_direct, src_any, dw_any, b_md, dst_any, strides,
                         dil, pl, pr, fwd_pd, NULL)
                  : DNNL(err, dnnl_inner_product_backward_weights_primitive_desc_create, &bww_pd,
                         m->eng, src16_md, dw_any, b_md, dst16_md, fwd_pd, NULL);
    if (rc < 0)
        goto cleanup;
    const_dnnl_memory_desc_t dw_md =
        dnnl_primitive_desc_query_md(bww_pd, dnnl_query_diff_weights_md, 0);
    tmp = dw_m;
    if (!dnnl_memory_desc_equal(dw_md, w_md) &&
        (rc = plan_mem(m, p, &tmp, dw_md, DNNL_MEMORY_ALLOCATE, err)) < 0)
        goto cleanup;
    dnnl_memory_t wsrc_m, wdd_m;
    dnnl_memory_t srcs[2] = {src_m, src16_m}, grads[2] = {g_m, g16_m};
    if ((rc = bind_as(m, p, lp, dnnl_primitive_desc_query_md(bww_pd, dnnl_query_src_md, 0), srcs, 2,
                      in16 ? src16_m : src_m, &wsrc_m, err)) < 0 ||
        (rc = bind_as(m, p, lp, dnnl_primitive_desc_query_md(bww_pd, dnnl_query_diff_dst_md, 0),
                      grads, 2, out16 ? g16_m : g_m, &wdd_m, err)) < 0)
        goto cleanup;
    lp->iww = lp->nbwd;
    e = &lp->bwd[lp->nbwd++];
    if ((rc = plan_prim(p, &e->prim, bww_pd, err)) < 0)
        goto cleanup;
    nn_exec_arg(e, DNNL_ARG_SRC, wsrc_m);
    nn_exec_arg(e, DNNL_ARG_DIFF_DST, wdd_m);
    nn_exec_arg(e, DNNL_ARG_DIFF_WEIGHTS, tmp);
    nn_exec_arg(e, DNNL_ARG_DIFF_BIAS, db_m);
    if (tmp != dw_m && (rc = plan_reorder(m, p, &lp->bwd[lp->nbwd++], tmp, dw_m, err)) < 0)
        goto cleanup;
    lp->nww = lp->nbwd - lp->iww;

    if (l > 0) {
        rc = conv ? DNNL(err, dnnl_convolution_backward_data_primitive_desc_create, &bwd_pd, m->eng,
                         dnnl_convolution_direct, in_md, w_any, dst16_md, strides, dil, pl, pr,
                         fwd_pd, NULL)
                  : DNNL(err, dnnl_inner_product_backward_data_primitive_desc_create, &bwd_pd,
                         m->eng, in_md, w_any, dst16_md, fwd_pd, NULL);
        if (rc < 0)
            goto cleanup;
        const_dnnl_memory_desc_t bw_md =
            dnnl_primitive_desc_query_md(bwd_pd, dnnl_query_weights_md, 0);
        dnnl_memory_t bw_m, ws[2] = {fw_m, w_m};
        if ((rc = bind_as(m, p, lp, bw_md, ws, 2, w_m, &bw_m, err)) < 0 ||
            (rc = plan_mem(m, p, &dsrc_m, in_md, p->dact[l], err)) < 0)
            goto cleanup;
        e = &lp->bwd[lp->nbwd++];
        if ((rc = plan_prim(p, &e->prim, bwd_pd, err)) < 0)
            goto cleanup;
        nn_exec_arg(e, DNNL_ARG_DIFF_DST, bf16 ? g16_m : g_m);
        nn_exec_arg(e, DNNL_ARG_WEIGHTS, bw_m);
        nn_exec_arg(e, DNNL_ARG_DIFF_SRC, dsrc_m);
    }
    rc = 0;
cleanup:
    if (rc < 0)
        sg_context(err, "building layer %d (%s, batch %d, %s%s%s): ", l, conv ? "Conv2D" : "Dense",
                   B, bf16 ? "bf16" : "f32", in16 ? ", bf16 input" : "",
                   out16 ? ", bf16 output" : "");
    dnnl_primitive_desc_destroy(fwd_pd);
    dnnl_primitive_desc_destroy(efwd_pd);
    dnnl_primitive_desc_destroy(ebwd_pd);
    dnnl_primitive_desc_destroy(bww_pd);
    dnnl_primitive_desc_destroy(bwd_pd);
    dnnl_primitive_attr_destroy(attr);
    dnnl_post_ops_destroy(po);
    dnnl_memory_desc_destroy(src_md);
    dnnl_memory_desc_destroy(dst_md);
    dnnl_memory_desc_destroy(w_md);
    dnnl_memory_desc_destroy(w_any);
    dnnl_memory_desc_destroy(b_md);
    dnnl_memory_desc_destroy(src_any);
    dnnl_memory_desc_destroy(dst_any);
    dnnl_memory_desc_destroy(dw_any);
    dnnl_memory_desc_destroy(src16_md);
    dnnl_memory_desc_destroy(dst16_md);
    return rc;
}

/* ---- pooling ------------------------------------------------------------ */

static int build_pool(Model *m, Plan *p, int l, SgError *err)
{
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
        (rc = plan_mem(m, p, &src_m, src_md, p->act[l], err)) < 0 ||
        (rc = plan_mem(m, p, &dst_m, dst_md, p->act[l + 1], err)) < 0)
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
    if (l > 0) {
        if ((rc = DNNL(err, dnnl_pooling_backward_primitive_desc_create, &bwd_pd, m->eng, alg,
                       src_md, dst_md, strides, kernel, dil, pl, pr, fwd_pd, NULL)) < 0 ||
            (rc = plan_mem(m, p, &ddst_m, dst_md, p->dact[l + 1], err)) < 0 ||
            (rc = plan_mem(m, p, &dsrc_m, src_md, p->dact[l], err)) < 0)
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

static int build_logsoftmax(Model *m, Plan *p, SgError *err)
{
    dnnl_memory_desc_t md = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_memory_t src_m, dst_m;
    dnnl_dims_t d = {p->B, m->classes};
    int rc;
    if ((rc = nn_md(&md, 2, d, dnnl_ab, err)) < 0 ||
        (rc = DNNL(err, dnnl_softmax_forward_primitive_desc_create, &pd, m->eng,
                   dnnl_forward_inference, dnnl_softmax_log, md, md, 1, NULL)) < 0 ||
        (rc = plan_mem(m, p, &src_m, md, p->act[m->nlayers], err)) < 0 ||
        (rc = plan_mem(m, p, &dst_m, md, p->logprob, err)) < 0 ||
        (rc = plan_prim(p, &p->logsoftmax.prim, pd, err)) < 0)
        goto cleanup;
    nn_exec_arg(&p->logsoftmax, DNNL_ARG_SRC, src_m);
    nn_exec_arg(&p->logsoftmax, DNNL_ARG_DST, dst_m);
cleanup:
    dnnl_primitive_desc_destroy(pd);
    dnnl_memory_desc_destroy(md);
    return rc;
}

/* ---- the plan ----------------------------------------------------------- */

static size_t round16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

static size_t layer_out(const Model *m, int l)
{
    const LayerShape *s = &m->shapes[l];
    return (size_t)s->oh * s->ow * s->oc;
}

static int weighted(const Model *m, int l)
{
    return m->specs[l].kind == LAYER_DENSE || m->specs[l].kind == LAYER_CONV2D;
}

/* 1 if layer l's output is the input of a weighted layer, l being one too
 * (Flatten, an alias, in between): with chain, an activation kept in bf16. */
static int chain16(const Model *m, int l)
{
    if (!weighted(m, l))
        return 0;
    for (int k = l + 1; k < m->nlayers; k++)
        if (m->specs[k].kind != LAYER_FLATTEN)
            return weighted(m, k);
    return 0;
}

static int chain16_in(const Model *m, int l)
{
    if (!weighted(m, l))
        return 0;
    for (int k = l - 1; k >= 0; k--)
        if (m->specs[k].kind != LAYER_FLATTEN)
            return chain16(m, k);
    return 0;
}

/* Builds the plan for batch B; chain: bf16 layers hand bf16 activations to
 * each other (build_weighted's in16/out16). *fell_back is set when a layer
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
        p->lp[l].iwr = -1;
    int rc = 0;
    if (!p->act || !p->dact || !p->lp) {
        rc = sg_fail(err, SG_ENOMEM, "model plan: out of memory");
        goto fail;
    }
    /* arena: act/dact per distinct buffer, masks, dpre, logprob, onehot, labels */
    size_t total = 2 * round16((size_t)B * model_input_size(m)), max_width = 0;
    for (int l = 0; l < L; l++) {
        size_t o = (size_t)B * layer_out(m, l);
        max_width = layer_out(m, l) > max_width ? layer_out(m, l) : max_width;
        if (m->specs[l].kind != LAYER_FLATTEN)
            total += 2 * round16(o);
        if (m->specs[l].kind == LAYER_DROPOUT)
            total += round16(o);
    }
    size_t bk = round16((size_t)B * m->classes);
    total += round16(max_width) + 2 * bk + round16((size_t)B);
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
        size_t o = round16((size_t)B * layer_out(m, l));
        if (m->specs[l].kind == LAYER_FLATTEN) {
            p->act[l + 1] = p->act[l];
            p->dact[l + 1] = p->dact[l];
            continue;
        }
        p->act[l + 1] = cur, cur += o;
        p->dact[l + 1] = cur, cur += o;
        if (m->specs[l].kind == LAYER_DROPOUT)
            p->lp[l].mask = cur, cur += o;
    }
    p->dpre = cur, cur += round16(max_width);
    p->logprob = cur, cur += bk;
    p->onehot = cur, cur += bk;
    p->labels = (int32_t *)cur;

    for (int l = 0; l < L; l++) {
        switch (m->specs[l].kind) {
        case LAYER_DENSE:
        case LAYER_CONV2D:
            if (m->precision == NN_BF16) {
                const int ncopies0 = p->ncopies;
                /* the first layer reads bf16 inputs that gather() converts */
                rc = build_weighted(m, p, l, 1, l == 0 || (chain && chain16_in(m, l)),
                                    chain && chain16(m, l), err);
                if (rc == 0) {
                    p->nbf16++;
                    p->input16 |= l == 0;
                    break;
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
                p->lp[l].iwr = -1;
                p->ncopies = ncopies0;
            }
            rc = build_weighted(m, p, l, 0, 0, 0, err);
            break;
        case LAYER_MAXPOOL:
        case LAYER_AVGPOOL:
            rc = build_pool(m, p, l, err);
            break;
        default:
            rc = 0;
            break;
        }
        if (rc < 0)
            goto fail;
    }
    if ((rc = build_logsoftmax(m, p, err)) < 0)
        goto fail;
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
    int rc;
    for (int l = 0; l < m->nlayers; l++) {
        const LayerSpec *sp = &m->specs[l];
        LayerPlan *lp = &p->lp[l];
        if (sp->kind == LAYER_FLATTEN)
            continue;
        if (sp->kind == LAYER_DROPOUT) {
            size_t n = (size_t)p->B * layer_out(m, l);
            if ((rc = DNNL(err, dnnl_stream_wait, m->stream)) < 0)
                return rc;
            if (training && sp->rate > 0.0f) {
                dropout_forward(p->act[l + 1], lp->mask, p->act[l], n, sp->rate, m->rng_seed,
                                m->rng_counter);
                m->rng_counter += n;
            } else {
                memcpy(p->act[l + 1], p->act[l], n * sizeof(float));
            }
            continue;
        }
        for (int i = 0; i < lp->nfwd; i++) {
            /* the optimizer wrote this step's bf16 weights already */
            if (i == lp->iwr && m->w16_fresh == p)
                continue;
            if ((rc = nn_exec(&lp->fwd[i], m->stream, err)) < 0)
                return sg_context(err, "forward of layer %d: ", l);
        }
    }
    return DNNL(err, dnnl_stream_wait, m->stream);
}

int model_logprob(Model *m, Plan *p, SgError *err)
{
    int rc = nn_exec(&p->logsoftmax, m->stream, err);
    if (rc < 0)
        return rc;
    return DNNL(err, dnnl_stream_wait, m->stream);
}

/* Dropout's backward, in C (oneDNN 3.2 has none): the gradient of layer l's
 * input from its output's, through the layer's mask. The first layer's input
 * gradient is never needed. */
static void dropout_layer_backward(Model *m, Plan *p, int l)
{
    if (l == 0)
        return;
    size_t n = (size_t)p->B * layer_out(m, l);
    if (m->specs[l].rate > 0.0f)
        dropout_backward(p->dact[l], p->dact[l + 1], p->lp[l].mask, n);
    else
        memcpy(p->dact[l], p->dact[l + 1], n * sizeof(float));
}

/* ---- backward with plain SGD folded in ---------------------------------- */

int model_dense_only(const Model *m)
{
    for (int l = 0; l < m->nlayers; l++) {
        LayerKind k = m->specs[l].kind;
        if (k != LAYER_DENSE && k != LAYER_DROPOUT && k != LAYER_FLATTEN)
            return 0;
    }
    return 1;
}

/* W[C,OC] -= lr * src[B,C]^T @ dY[B,OC]; b[OC] -= lr * sum_b dY[b,:]
 * (colsum[OC] is scratch). Row-major GEMM with beta 1: the update is the
 * weight-gradient product itself, so no gradient buffer is written or read. */
static int dense_sgd_update(float *W, float *bias, float *colsum, const float *src, const float *dy,
                            int B, int C, int OC, float lr, SgError *err)
{
    int rc = DNNL(err, dnnl_sgemm, 'T', 'N', (dnnl_dim_t)C, (dnnl_dim_t)OC, (dnnl_dim_t)B, -lr, src,
                  (dnnl_dim_t)C, dy, (dnnl_dim_t)OC, 1.0f, W, (dnnl_dim_t)OC);
    if (rc < 0)
        return rc;
    memcpy(colsum, dy, (size_t)OC * sizeof(float));
    for (int b = 1; b < B; b++) {
        const float *row = dy + (size_t)b * OC;
#pragma omp simd
        for (int j = 0; j < OC; j++)
            colsum[j] += row[j];
    }
#pragma omp simd
    for (int j = 0; j < OC; j++)
        bias[j] -= lr * colsum[j];
    return 0;
}

/* One walk backward over the layers. With ``sgd_lr`` (plain SGD on a
 * model_dense_only model) each Dense layer skips its weight-gradient
 * primitives and applies the update in one GEMM instead, after its data
 * gradient, which needs the weights before their update. */
static int backward_pass(Model *m, Plan *p, const float *sgd_lr, const NnGradHook *hook,
                         SgError *err)
{
    const int tell = hook != NULL && hook->ready != NULL;
    int rc;
    for (int l = m->nlayers - 1; l >= 0; l--) {
        const LayerSpec *sp = &m->specs[l];
        LayerPlan *lp = &p->lp[l];
        if (sp->kind == LAYER_FLATTEN)
            continue;
        if (sp->kind == LAYER_DROPOUT) {
            /* the CPU reads what the preceding primitives wrote */
            if ((rc = DNNL(err, dnnl_stream_wait, m->stream)) < 0)
                return rc;
            dropout_layer_backward(m, p, l);
            continue;
        }
        for (int i = 0; i < lp->nbwd; i++) {
            if (sgd_lr != NULL && i >= lp->iww && i < lp->iww + lp->nww)
                continue;
            if ((rc = nn_exec(&lp->bwd[i], m->stream, err)) < 0)
                return sg_context(err, "backward of layer %d: ", l);
            if (tell && i == lp->iww + lp->nww - 1) {
                /* this layer's kernel and bias gradients (adjacent in the flat
                 * buffer) are final: hand them over before the data gradient */
                const ParamInfo *kt = &m->tensors[m->kernel_t[l]];
                const ParamInfo *bt = &m->tensors[m->bias_t[l]];
                if ((rc = DNNL(err, dnnl_stream_wait, m->stream)) < 0)
                    return rc;
                if ((rc = hook->ready(hook->ctx, m->grads, kt->offset, kt->size + bt->size, err)) <
                    0)
                    return sg_context(err, "gradient hook on layer %d: ", l);
            }
        }
        if (sgd_lr == NULL)
            continue;
        if ((rc = DNNL(err, dnnl_stream_wait, m->stream)) < 0)
            return rc;
        const LayerShape *s = &m->shapes[l];
        const ParamInfo *kt = &m->tensors[m->kernel_t[l]], *bt = &m->tensors[m->bias_t[l]];
        if ((rc = dense_sgd_update(m->params + kt->offset, m->params + bt->offset, p->dpre,
                                   p->act[l], p->dact[l + 1], p->B, s->c, s->oc, *sgd_lr, err)) < 0)
            return sg_context(err, "SGD update of layer %d: ", l);
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
