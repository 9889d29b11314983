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
    if ((unsigned)act >= NN_ACT_COUNT || nn_op_eltwise(act, &alpha) == dnnl_alg_kind_undef)
        return sg_fail(err, SG_EMODEL, "layer %d (Activation): unknown activation %d", l, (int)act);
    s->oh = s->h, s->ow = s->w, s->oc = s->c;
    return 0;
}

/* SELU's ELU output, between its two primitives */
static size_t activation_scratch(const Model *m, int l, int B)
{
    return m->specs[l].act == NN_ACT_SELU ? (size_t)B * nn_op_out_size(m, l) : 0;
}

static int activation_build(Model *m, Plan *p, int l, const NnOpBuild *how, SgError *err)
{
    (void)how;
    const LayerShape *s = &m->shapes[l];
    dnnl_dims_t d = {p->B, s->c, s->h, s->w};
    dnnl_memory_desc_t md = NULL;
    int rc = nn_md(&md, 4, d, dnnl_nhwc, err);
    /* a model input's gradient is never needed (op_dsrc NULL) */
    if (rc == 0)
        rc = nn_op_eltwise_chain(m, p, l, m->specs[l].act, md, op_src(m, p, l, 0), p->lp[l].scratch,
                                 op_dst(m, p, l), op_dsrc(p, l, 0), op_ddst(m, p, l), err);
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
