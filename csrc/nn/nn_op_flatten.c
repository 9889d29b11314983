/*
 * nn_op_flatten.c - Flatten: the NHWC input read as rows of h*w*c values.
 * Its output is its input's buffer (NN_OP_ALIAS): no pass, no copy.
 */
#include "nn/nn_op.h"

static int flatten_infer(Model *m, int l, SgError *err)
{
    (void)err;
    LayerShape *s = &m->shapes[l];
    s->oh = s->ow = 1;
    s->oc = s->h * s->w * s->c;
    return 0;
}

const NnOpKind nn_op_flatten = {
    "Flatten", NN_OP_ALIAS | NN_OP_FOLDS_SGD, flatten_infer, NULL, NULL, NULL, NULL,
};
