/*
 * nn_op_norm.c - BatchNormalization and LayerNormalization on the last axis
 * (the channels of NHWC), as Keras' layers with axis=-1, on oneDNN's
 * normalization primitives:
 *
 *   y = (x - mean) / sqrt(var + epsilon) * gamma + beta
 *
 * gamma with `scale`, beta with `center` (parameters, in that order).
 * BatchNormalization's mean and var are, in training, the batch's over every
 * axis but the last (the biased variance, as Keras and oneDNN compute it),
 * and each training pass then moves the state buffer's moving_mean and
 * moving_variance towards them: moving = moving * momentum + batch * (1 -
 * momentum); in inference they are the moving ones. LayerNormalization's
 * are each position's over its C channels, in both modes, and it has no
 * state.
 *
 * Plan scratch: [the batch statistics: mean, var][diff_src when the input
 * needs no gradient (oneDNN's backward writes one)][a shared node's
 * parameter gradients, added into m->grads after its backward].
 */
#include "nn/nn_op.h"

#include <math.h>

/* Normalized positions per sample (LayerNormalization: one statistic each). */
static int positions(const LayerShape *s)
{
    return s->h * s->w;
}

static int is_batchnorm(const Model *m, int l)
{
    return m->specs[l].kind == LAYER_BATCHNORM;
}

static int norm_infer(Model *m, int l, SgError *err)
{
    const LayerSpec *sp = &m->specs[l];
    LayerShape *s = &m->shapes[l];
    const char *name = nn_op_of(m, l)->name;
    if (!(sp->epsilon > 0.0f) || isinf(sp->epsilon))
        return sg_fail(err, SG_EMODEL, "layer %d (%s): epsilon must be > 0, not %g", l, name,
                       (double)sp->epsilon);
    if (is_batchnorm(m, l) && !(sp->momentum >= 0.0f && sp->momentum <= 1.0f))
        return sg_fail(err, SG_EMODEL, "layer %d (%s): momentum must be in [0, 1], not %g", l, name,
                       (double)sp->momentum);
    s->oh = s->h, s->ow = s->w, s->oc = s->c;
    const int c[1] = {s->c};
    if (sp->scale)
        model_add_param(m, l, "gamma", NN_FILL_ONES, 1, c);
    if (sp->center)
        model_add_param(m, l, "beta", NN_FILL_ZEROS, 1, c);
    if (is_batchnorm(m, l)) {
        model_add_state(m, l, "moving_mean", NN_FILL_ZEROS, 1, c);
        model_add_state(m, l, "moving_variance", NN_FILL_ONES, 1, c);
    }
    return 0;
}

/* Floats of the batch statistics, mean and var each. */
static size_t stats_size(const Model *m, int l, int B)
{
    return is_batchnorm(m, l) ? (size_t)m->shapes[l].c : (size_t)B * positions(&m->shapes[l]);
}

/* Floats of each scratch part (see the top). */
static size_t throwaway_size(const Model *m, int l, int B)
{
    return m->needs_grad[node_in(m, l, 0)] ? 0 : (size_t)B * nn_op_out_size(m, l);
}

static size_t shared_size(const Model *m, int l)
{
    return m->accumulate[l] ? (size_t)m->param_count[l] * m->shapes[l].c : 0;
}

static size_t norm_scratch(const Model *m, int l, int B)
{
    return 2 * stats_size(m, l, B) + throwaway_size(m, l, B) + shared_size(m, l);
}

static int norm_build(Model *m, Plan *p, int l, const NnOpBuild *how, SgError *err)
{
    (void)how;
    const LayerSpec *sp = &m->specs[l];
    const LayerShape *s = &m->shapes[l];
    LayerPlan *lp = &p->lp[l];
    const int B = p->B, bn = is_batchnorm(m, l);
    const size_t nstats = stats_size(m, l, B);
    float *mean = lp->scratch, *var = lp->scratch + nstats;
    float *throwaway = var + nstats, *shared = throwaway + throwaway_size(m, l, B);
    const unsigned flags = (sp->scale ? dnnl_use_scale : 0u) | (sp->center ? dnnl_use_shift : 0u);
    const ParamInfo *gamma = sp->scale ? op_param(m, l, 0) : NULL;
    const ParamInfo *beta = sp->center ? op_param(m, l, sp->scale) : NULL;
    dnnl_memory_desc_t data_md = NULL, stat_md = NULL, chan_md = NULL;
    dnnl_primitive_desc_t train_pd = NULL, infer_pd = NULL, bwd_pd = NULL;
    dnnl_memory_t src_m, dst_m, mean_m, var_m, gamma_m = NULL, beta_m = NULL, ddst_m, dsrc_m;
    dnnl_memory_t dgamma_m = NULL, dbeta_m = NULL, mmean_m = NULL, mvar_m = NULL;
    /* BatchNormalization: NHWC as oneDNN's N C H W, statistics per channel;
     * LayerNormalization: rows of C, a statistic per row */
    const dnnl_dims_t d4 = {B, s->c, s->h, s->w}, d2 = {(dnnl_dim_t)B * positions(s), s->c},
                      dc = {s->c}, dn = {(dnnl_dim_t)nstats};
    int rc;
    if ((rc = bn ? nn_md(&data_md, 4, d4, dnnl_nhwc, err) : nn_md(&data_md, 2, d2, dnnl_ab, err)) <
            0 ||
        (rc = nn_md(&stat_md, 1, dn, dnnl_a, err)) < 0 ||
        (rc = nn_md(&chan_md, 1, dc, dnnl_a, err)) < 0)
        goto cleanup;
    rc = bn ? DNNL(err, dnnl_batch_normalization_forward_primitive_desc_create, &train_pd, m->eng,
                   dnnl_forward_training, data_md, data_md, sp->epsilon, flags, NULL)
            : DNNL(err, dnnl_layer_normalization_forward_primitive_desc_create, &train_pd, m->eng,
                   dnnl_forward_training, data_md, data_md, stat_md, sp->epsilon, flags, NULL);
    if (rc < 0 || (rc = plan_mem(m, p, &src_m, data_md, op_src(m, p, l, 0), err)) < 0 ||
        (rc = plan_mem(m, p, &dst_m, data_md, op_dst(m, p, l), err)) < 0 ||
        (rc = plan_mem(m, p, &mean_m, stat_md, mean, err)) < 0 ||
        (rc = plan_mem(m, p, &var_m, stat_md, var, err)) < 0)
        goto cleanup;
    if (gamma && (rc = plan_mem(m, p, &gamma_m, chan_md, m->params + gamma->offset, err)) < 0)
        goto cleanup;
    if (beta && (rc = plan_mem(m, p, &beta_m, chan_md, m->params + beta->offset, err)) < 0)
        goto cleanup;
    /* fwd[0]: training (writes the batch statistics); BatchNormalization's
     * fwd[1]: inference on the moving statistics */
    NnExec *e = &lp->fwd[lp->nfwd++];
    if ((rc = plan_prim(p, &e->prim, train_pd, err)) < 0)
        goto cleanup;
    nn_exec_arg(e, DNNL_ARG_SRC, src_m);
    nn_exec_arg(e, DNNL_ARG_DST, dst_m);
    nn_exec_arg(e, DNNL_ARG_MEAN, mean_m);
    nn_exec_arg(e, DNNL_ARG_VARIANCE, var_m);
    if (gamma_m)
        nn_exec_arg(e, DNNL_ARG_SCALE, gamma_m);
    if (beta_m)
        nn_exec_arg(e, DNNL_ARG_SHIFT, beta_m);
    if (bn) {
        const ParamInfo *mm = op_state(m, l, 0), *mv = op_state(m, l, 1);
        if ((rc = DNNL(err, dnnl_batch_normalization_forward_primitive_desc_create, &infer_pd,
                       m->eng, dnnl_forward_inference, data_md, data_md, sp->epsilon,
                       flags | dnnl_use_global_stats, NULL)) < 0 ||
            (rc = plan_mem(m, p, &mmean_m, chan_md, m->state + mm->offset, err)) < 0 ||
            (rc = plan_mem(m, p, &mvar_m, chan_md, m->state + mv->offset, err)) < 0)
            goto cleanup;
        e = &lp->fwd[lp->nfwd++];
        if ((rc = plan_prim(p, &e->prim, infer_pd, err)) < 0)
            goto cleanup;
        nn_exec_arg(e, DNNL_ARG_SRC, src_m);
        nn_exec_arg(e, DNNL_ARG_DST, dst_m);
        nn_exec_arg(e, DNNL_ARG_MEAN, mmean_m);
        nn_exec_arg(e, DNNL_ARG_VARIANCE, mvar_m);
        if (gamma_m)
            nn_exec_arg(e, DNNL_ARG_SCALE, gamma_m);
        if (beta_m)
            nn_exec_arg(e, DNNL_ARG_SHIFT, beta_m);
    }
    float *dsrc = op_dsrc(p, l, 0);
    if (dsrc == NULL && flags == 0) {
        rc = 0; /* nothing to differentiate */
        goto cleanup;
    }
    const dnnl_prop_kind_t prop = flags ? dnnl_backward : dnnl_backward_data;
    rc = bn ? DNNL(err, dnnl_batch_normalization_backward_primitive_desc_create, &bwd_pd, m->eng,
                   prop, data_md, data_md, data_md, sp->epsilon, flags, train_pd, NULL)
            : DNNL(err, dnnl_layer_normalization_backward_primitive_desc_create, &bwd_pd, m->eng,
                   prop, data_md, data_md, data_md, stat_md, sp->epsilon, flags, train_pd, NULL);
    if (rc < 0 || (rc = plan_mem(m, p, &ddst_m, data_md, op_ddst(m, p, l), err)) < 0 ||
        (rc = plan_mem(m, p, &dsrc_m, data_md, dsrc ? dsrc : throwaway, err)) < 0)
        goto cleanup;
    /* a shared node's gradients go to its scratch, added in by backward */
    float *dparams = m->accumulate[l] ? shared : NULL;
    if (gamma && (rc = plan_mem(m, p, &dgamma_m, chan_md,
                                dparams ? dparams : m->grads + gamma->offset, err)) < 0)
        goto cleanup;
    if (beta &&
        (rc = plan_mem(m, p, &dbeta_m, chan_md,
                       dparams ? dparams + (gamma ? s->c : 0) : m->grads + beta->offset, err)) < 0)
        goto cleanup;
    e = &lp->bwd[lp->nbwd++];
    if ((rc = plan_prim(p, &e->prim, bwd_pd, err)) < 0)
        goto cleanup;
    nn_exec_arg(e, DNNL_ARG_SRC, src_m);
    nn_exec_arg(e, DNNL_ARG_MEAN, mean_m);
    nn_exec_arg(e, DNNL_ARG_VARIANCE, var_m);
    nn_exec_arg(e, DNNL_ARG_DIFF_DST, ddst_m);
    nn_exec_arg(e, DNNL_ARG_DIFF_SRC, dsrc_m);
    if (gamma_m) {
        nn_exec_arg(e, DNNL_ARG_SCALE, gamma_m);
        nn_exec_arg(e, DNNL_ARG_DIFF_SCALE, dgamma_m);
    }
    if (beta_m) {
        if (!bn) /* LayerNormalization's backward takes the shift too (BatchNormalization's refuses
                    it) */
            nn_exec_arg(e, DNNL_ARG_SHIFT, beta_m);
        nn_exec_arg(e, DNNL_ARG_DIFF_SHIFT, dbeta_m);
    }
    rc = 0;
cleanup:
    if (rc < 0)
        sg_context(err, "building layer %d (%s, batch %d): ", l, nn_op_of(m, l)->name, B);
    dnnl_primitive_desc_destroy(train_pd);
    dnnl_primitive_desc_destroy(infer_pd);
    dnnl_primitive_desc_destroy(bwd_pd);
    dnnl_memory_desc_destroy(data_md);
    dnnl_memory_desc_destroy(stat_md);
    dnnl_memory_desc_destroy(chan_md);
    return rc;
}

static int norm_forward(Model *m, Plan *p, int l, int training, SgError *err)
{
    const LayerPlan *lp = &p->lp[l];
    if (!is_batchnorm(m, l))
        return nn_op_run(m, p->lp[l].fwd, lp->nfwd, -1, l, "forward", err);
    int rc = nn_op_run(m, p->lp[l].fwd, lp->nfwd, training ? 1 : 0, l, "forward", err);
    if (rc < 0 || !training)
        return rc;
    /* the moving statistics move towards the batch's */
    if ((rc = DNNL(err, dnnl_stream_wait, m->stream)) < 0)
        return rc;
    const float mo = m->specs[l].momentum;
    const int C = m->shapes[l].c;
    const float *mean = lp->scratch, *var = lp->scratch + C;
    float *mm = m->state + op_state(m, l, 0)->offset, *mv = m->state + op_state(m, l, 1)->offset;
    for (int c = 0; c < C; c++) {
        mm[c] = mm[c] * mo + mean[c] * (1.0f - mo);
        mv[c] = mv[c] * mo + var[c] * (1.0f - mo);
    }
    return 0;
}

/* Backward; with a hook, ready() is told the node's parameters once their
 * gradients are final. */
static int norm_backward(Model *m, Plan *p, int l, const NnOpBackward *how, SgError *err)
{
    const LayerPlan *lp = &p->lp[l];
    int rc = nn_op_run(m, p->lp[l].bwd, lp->nbwd, -1, l, "backward", err);
    const int np = m->param_count[l];
    if (rc < 0 || np == 0)
        return rc;
    /* gamma and beta are adjacent; a shared node's are in scratch after the statistics */
    const float *mine = m->accumulate[l]
                            ? lp->scratch + 2 * stats_size(m, l, p->B) + throwaway_size(m, l, p->B)
                            : NULL;
    return nn_op_params_done(m, l, how, op_param(m, l, 0)->offset, (size_t)np * m->shapes[l].c,
                             mine, err);
}

const NnOpKind nn_op_batchnorm = {
    "BatchNormalization", 0, norm_infer, norm_scratch, norm_build, norm_forward, norm_backward,
};

const NnOpKind nn_op_layernorm = {
    "LayerNormalization", 0, norm_infer, norm_scratch, norm_build, norm_forward, norm_backward,
};
