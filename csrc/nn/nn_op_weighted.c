/*
 * nn_op_weighted.c - the ops with a kernel and a bias: Dense (oneDNN inner
 * product) and Conv2D (convolution), the activation fused as an eltwise
 * post-op (backward from the output), f32 or bf16 primitives (see
 * weighted_build), and plain SGD folded into Dense's weight-gradient GEMM.
 */
#include "nn/nn_op.h"

#include <stdlib.h>
#include <string.h>

/* ---- shapes and parameters ----------------------------------------------- */

/* The eltwise algorithm (and its alpha) of an activation the layer fuses:
 * those whose backward runs from the output (use_dst), or undef. */
static dnnl_alg_kind_t act_alg(NnAct a, int use_dst, float *alpha)
{
    *alpha = 0.0f;
    switch (a) {
    case NN_ACT_RELU:
        return use_dst ? dnnl_eltwise_relu_use_dst_for_bwd : dnnl_eltwise_relu;
    case NN_ACT_LEAKY_RELU:
        *alpha = NN_LEAKY_RELU_SLOPE;
        return use_dst ? dnnl_eltwise_relu_use_dst_for_bwd : dnnl_eltwise_relu;
    case NN_ACT_ELU:
        *alpha = 1.0f;
        return use_dst ? dnnl_eltwise_elu_use_dst_for_bwd : dnnl_eltwise_elu;
    case NN_ACT_TANH:
        return use_dst ? dnnl_eltwise_tanh_use_dst_for_bwd : dnnl_eltwise_tanh;
    case NN_ACT_SIGMOID:
        return use_dst ? dnnl_eltwise_logistic_use_dst_for_bwd : dnnl_eltwise_logistic;
    default:
        return dnnl_alg_kind_undef;
    }
}

/* Every activation but softmax (a head's, which the loss applies) is taken:
 * those act_alg knows as a post-op of the primitive, the others (gelu,
 * selu, swish, softplus, whose backward needs the values before them) as
 * eltwise primitives after it (nn_weighted_unfused). */
static int check_act(const Model *m, int l, SgError *err)
{
    float alpha;
    const NnAct act = m->specs[l].act;
    if (act == NN_ACT_NONE || act == NN_ACT_SOFTMAX ||
        nn_op_eltwise(act, &alpha) != dnnl_alg_kind_undef)
        return 0;
    return sg_fail(err, SG_EMODEL, "layer %d (%s): unknown activation %d", l, nn_op_of(m, l)->name,
                   (int)act);
}

int nn_weighted_unfused(const Model *m, int l)
{
    float alpha;
    const NnAct act = model_layer_act(m, l);
    return act != NN_ACT_NONE && act_alg(act, 1, &alpha) == dnnl_alg_kind_undef;
}

/* Dense works on the last axis: an input of h x w x c is h*w rows of c. */
static int dense_infer(Model *m, int l, SgError *err)
{
    const LayerSpec *sp = &m->specs[l];
    LayerShape *s = &m->shapes[l];
    if (sp->units <= 0)
        return sg_fail(err, SG_EMODEL, "layer %d (Dense): units must be > 0, not %d", l, sp->units);
    s->oh = s->h;
    s->ow = s->w;
    s->oc = sp->units;
    int rc = check_act(m, l, err);
    if (rc < 0)
        return rc;
    int ks[2] = {s->c, sp->units}, bs[1] = {sp->units};
    m->kernel_t[l] = model_add_tensor(m, l, 0, 2, ks);
    m->bias_t[l] = model_add_tensor(m, l, 1, 1, bs);
    return 0;
}

static int conv2d_infer(Model *m, int l, SgError *err)
{
    int rc = nn_op_infer_window(m, l, 1, 1, err);
    if (rc < 0 || (rc = check_act(m, l, err)) < 0)
        return rc;
    const LayerSpec *sp = &m->specs[l];
    int ks[4] = {sp->kh, sp->kw, m->shapes[l].c, sp->units}, bs[1] = {sp->units};
    m->kernel_t[l] = model_add_tensor(m, l, 0, 4, ks);
    m->bias_t[l] = model_add_tensor(m, l, 1, 1, bs);
    return 0;
}

/* The scratch of node l, in this order: a shared layer's gradients when it
 * adds them (accumulate), an unfused activation's input (pre) and SELU's
 * middle (mid), each B x its output. */
static size_t grads_floats(const Model *m, int l)
{
    return m->accumulate[l] ? m->tensors[m->kernel_t[l]].size + m->tensors[m->bias_t[l]].size : 0;
}

static size_t weighted_scratch(const Model *m, int l, int B)
{
    size_t n = grads_floats(m, l);
    if (nn_weighted_unfused(m, l))
        n += (size_t)B * nn_op_out_size(m, l) * (model_layer_act(m, l) == NN_ACT_SELU ? 2 : 1);
    return n;
}

/* ---- primitives ------------------------------------------------------------ */

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

/* Builds a Dense or Conv2D layer. The parameters and their gradients are f32
 * buffers of the model; the activations and their gradients f32 buffers of
 * the plan, except between two bf16 layers (below). With bf16 (the model's
 * precision), the primitives take bf16 copies of their inputs, made by
 * reorders: the layer input and the f32 master weights before the forward (so
 * the weights are converted once per step, and the backward data reuses that
 * copy), the output gradient after the activation backward; they accumulate
 * in f32 and write f32 diff weights and bias.
 *
 * in16 / out16 (the plan's chain16; NnOpBuild.input_bf16 / output_bf16): the
 * layer's input / output is an activation
 * between two bf16 layers, kept in bf16 in its plan buffer: the producer's
 * forward writes it in bf16 (activation fused, rounded once, as the reorder
 * would), the consumer's backward data writes its gradient in bf16, and the
 * producer's activation backward runs in bf16 on it (for ReLU exactly the
 * rounded f32 result), so neither direction needs a conversion reorder. */
static int weighted_build(Model *m, Plan *p, int l, const NnOpBuild *how, SgError *err)
{
    int bf16 = how->bf16, in16 = how->input_bf16, out16 = how->output_bf16;
    const LayerSpec *sp = &m->specs[l];
    const LayerShape *s = &m->shapes[l];
    LayerPlan *lp = &p->lp[l];
    const int conv = sp->kind == LAYER_CONV2D, B = p->B;
    const NnAct act = model_layer_act(m, l); /* the head's is the loss's */
    float alpha;
    const dnnl_alg_kind_t act_bwd = act_alg(act, 1, &alpha), act_fwd = act_alg(act, 0, &alpha);
    const int fused = act_fwd != dnnl_alg_kind_undef;
    /* an activation the primitive cannot fuse runs after it, from its output (pre) */
    const int unfused = nn_weighted_unfused(m, l);
    float *pre = unfused ? p->lp[l].scratch + grads_floats(m, l) : NULL;
    float *mid = pre ? pre + (size_t)B * s->oh * s->ow * s->oc : NULL;
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
    out16 = out16 && bf16 && !unfused;
    lp->bf16 = bf16;
    lp->input_bf16 = in16;
    lp->output_bf16 = out16;
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
        /* the rows: every position of every sample */
        const dnnl_dim_t rows = (dnnl_dim_t)B * s->h * s->w;
        dnnl_dims_t sd = {rows, s->c}, dd = {rows, s->oc}, wd = {s->oc, s->c};
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
            (rc = DNNL(err, dnnl_post_ops_append_eltwise, po, act_fwd, alpha, 0.0f)) < 0 ||
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

    /* a shared layer's node that adds its gradients writes them to its scratch first */
    float *W = m->params + kt->offset, *dW = m->accumulate[l] ? lp->scratch : m->grads + kt->offset;
    float *dbias = m->accumulate[l] ? lp->scratch + kt->size : m->grads + bt->offset;
    if ((rc = plan_mem(m, p, &src_m, in_md, op_src(m, p, l, 0), err)) < 0 ||
        (rc = plan_mem(m, p, &dst_m, out_md, unfused ? pre : op_dst(m, p, l), err)) < 0 ||
        (rc = plan_mem(m, p, &ddst_m, out_md, op_ddst(m, p, l), err)) < 0 ||
        (rc = plan_mem(m, p, &w_m, w_md, W, err)) < 0 ||
        (rc = plan_mem(m, p, &dw_m, w_md, dW, err)) < 0 ||
        (rc = plan_mem(m, p, &b_m, b_md, m->params + bt->offset, err)) < 0 ||
        (rc = plan_mem(m, p, &db_m, b_md, dbias, err)) < 0)
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
    lp->weights_convert = -1;
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
            lp->weights_convert = lp->nfwd;
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

    /* an unfused activation: pre -> the output, its backward in place on the
     * output's gradient (before everything below, as the fused one) */
    if (unfused && (rc = nn_op_eltwise_chain(m, p, l, act, out_md, pre, mid, op_dst(m, p, l),
                                             op_ddst(m, p, l), op_ddst(m, p, l), err)) < 0)
        goto cleanup;

    /* backward: activation (from dst), [output gradient to bf16,] weights + bias, data */
    g_m = ddst_m;
    if (fused) {
        if ((rc = DNNL(err, dnnl_eltwise_forward_primitive_desc_create, &efwd_pd, m->eng,
                       dnnl_forward_training, act_bwd, out_md, out_md, alpha, 0.0f, NULL)) < 0 ||
            (rc = DNNL(err, dnnl_eltwise_backward_primitive_desc_create, &ebwd_pd, m->eng, act_bwd,
                       out_md, out_md, out_md, alpha, 0.0f, efwd_pd, NULL)) < 0)
            goto cleanup;
        /* in place: the gradient before the activation overwrites the output's */
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
    lp->wgrad_first = lp->nbwd;
    e = &lp->bwd[lp->nbwd++];
    if ((rc = plan_prim(p, &e->prim, bww_pd, err)) < 0)
        goto cleanup;
    nn_exec_arg(e, DNNL_ARG_SRC, wsrc_m);
    nn_exec_arg(e, DNNL_ARG_DIFF_DST, wdd_m);
    nn_exec_arg(e, DNNL_ARG_DIFF_WEIGHTS, tmp);
    nn_exec_arg(e, DNNL_ARG_DIFF_BIAS, db_m);
    if (tmp != dw_m && (rc = plan_reorder(m, p, &lp->bwd[lp->nbwd++], tmp, dw_m, err)) < 0)
        goto cleanup;
    lp->wgrad_count = lp->nbwd - lp->wgrad_first;

    if (op_dsrc(p, l, 0) != NULL) {
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
            (rc = plan_mem(m, p, &dsrc_m, in_md, op_dsrc(p, l, 0), err)) < 0)
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

/* ---- passes ------------------------------------------------------------------ */

static int weighted_forward(Model *m, Plan *p, int l, int training, SgError *err)
{
    (void)training;
    LayerPlan *lp = &p->lp[l];
    /* the optimizer wrote this step's bf16 weights already */
    const int skip = m->w16_fresh == p ? lp->weights_convert : -1;
    return nn_op_run(m, lp->fwd, lp->nfwd, skip, l, "forward", err);
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

/* The backward primitives in order. With a hook, ready() is told the
 * layer's kernel and bias gradients (adjacent in the flat buffer) as soon as
 * they are final, before the data gradient. With sgd_lr (Dense) the
 * weight-gradient primitives are skipped and the update is applied in one
 * GEMM after the data gradient, which needs the weights before it. */
static int weighted_backward(Model *m, Plan *p, int l, const NnOpBackward *how, SgError *err)
{
    LayerPlan *lp = &p->lp[l];
    const int last_wgrad = lp->wgrad_first + lp->wgrad_count - 1;
    const ParamInfo *kt = &m->tensors[m->kernel_t[l]], *bt = &m->tensors[m->bias_t[l]];
    int rc;
    for (int i = 0; i < lp->nbwd; i++) {
        if (how->sgd_lr != NULL && i >= lp->wgrad_first && i <= last_wgrad)
            continue;
        if ((rc = nn_exec(&lp->bwd[i], m->stream, err)) < 0)
            return sg_context(err, "backward of layer %d: ", l);
        /* kernel and bias are adjacent, in the flat buffer and in a shared
         * node's scratch */
        if (i == last_wgrad && (rc = nn_op_params_done(m, l, how, kt->offset, kt->size + bt->size,
                                                       lp->scratch, err)) < 0)
            return rc;
    }
    if (how->sgd_lr == NULL)
        return 0;
    if ((rc = DNNL(err, dnnl_stream_wait, m->stream)) < 0)
        return rc;
    const LayerShape *s = &m->shapes[l];
    if ((rc = dense_sgd_update(m->params + kt->offset, m->params + bt->offset, p->colsum,
                               op_src(m, p, l, 0), op_ddst(m, p, l), p->B * s->h * s->w, s->c,
                               s->oc, *how->sgd_lr, err)) < 0)
        return sg_context(err, "SGD update of layer %d: ", l);
    return 0;
}

const NnOpKind nn_op_dense = {
    "Dense",           NN_OP_WEIGHTED | NN_OP_ACTIVATION | NN_OP_FOLDS_SGD,
    dense_infer,       weighted_scratch,
    weighted_build,    weighted_forward,
    weighted_backward,
};

const NnOpKind nn_op_conv2d = {
    "Conv2D",          NN_OP_WEIGHTED | NN_OP_ACTIVATION,
    conv2d_infer,      weighted_scratch,
    weighted_build,    weighted_forward,
    weighted_backward,
};
