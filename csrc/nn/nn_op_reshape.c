/*
 * nn_op_reshape.c - Reshape: the input read as another shape of as many
 * values (Keras' target_shape, without the batch axis). Activations are
 * NHWC and contiguous, so its output is its input's buffer (NN_OP_ALIAS).
 */
#include "nn/nn_op.h"

static int reshape_infer(Model *m, int l, SgError *err)
{
    const int *to = m->specs[l].shape;
    LayerShape *s = &m->shapes[l];
    if (to[0] <= 0 || to[1] <= 0 || to[2] <= 0)
        return sg_fail(err, SG_EMODEL, "layer %d (Reshape): target shape %dx%dx%d must be > 0", l,
                       to[0], to[1], to[2]);
    if ((long long)to[0] * to[1] * to[2] != (long long)s->h * s->w * s->c)
        return sg_fail(err, SG_EMODEL,
                       "layer %d (Reshape): the input %dx%dx%d has %lld values, the target shape "
                       "%dx%dx%d %lld",
                       l, s->h, s->w, s->c, (long long)s->h * s->w * s->c, to[0], to[1], to[2],
                       (long long)to[0] * to[1] * to[2]);
    s->oh = to[0], s->ow = to[1], s->oc = to[2];
    return 0;
}

const NnOpKind nn_op_reshape = {
    "Reshape", NN_OP_ALIAS | NN_OP_FOLDS_SGD, reshape_infer, NULL, NULL, NULL, NULL,
};
