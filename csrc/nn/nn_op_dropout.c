/*
 * nn_op_dropout.c - Dropout in C (oneDNN 3.2 has none): inverted dropout in
 * training, its mask drawn from the model's counter-based RNG (nn_ref.c)
 * into the op's plan scratch; a copy in inference.
 */
#include "nn/nn_op.h"

#include <string.h>

static int dropout_infer(Model *m, int l, SgError *err)
{
    const float rate = m->specs[l].rate;
    LayerShape *s = &m->shapes[l];
    if (!(rate >= 0.0f && rate < 1.0f))
        return sg_fail(err, SG_EMODEL, "layer %d (Dropout): rate must be in [0, 1), not %g", l,
                       (double)rate);
    s->oh = s->h, s->ow = s->w, s->oc = s->c;
    return 0;
}

static size_t dropout_scratch(const Model *m, int l, int B)
{
    return (size_t)B * nn_op_out_size(m, l); /* the mask */
}

static int dropout_op_forward(Model *m, Plan *p, int l, int training, SgError *err)
{
    const float rate = m->specs[l].rate;
    const size_t n = (size_t)p->B * nn_op_out_size(m, l);
    /* the CPU reads what the preceding primitives wrote */
    int rc = DNNL(err, dnnl_stream_wait, m->stream);
    if (rc < 0)
        return rc;
    if (training && rate > 0.0f) {
        dropout_forward(op_dst(m, p, l), p->lp[l].scratch, op_src(m, p, l, 0), n, rate, m->rng_seed,
                        m->rng_counter);
        m->rng_counter += n;
    } else {
        memcpy(op_dst(m, p, l), op_src(m, p, l, 0), n * sizeof(float));
    }
    return 0;
}

/* The gradient of the input from the output's, through the mask; a model
 * input's gradient is never needed. */
static int dropout_op_backward(Model *m, Plan *p, int l, const NnOpBackward *how, SgError *err)
{
    (void)how;
    float *dsrc = op_dsrc(p, l, 0);
    int rc = DNNL(err, dnnl_stream_wait, m->stream);
    if (rc < 0 || dsrc == NULL)
        return rc;
    const size_t n = (size_t)p->B * nn_op_out_size(m, l);
    if (m->specs[l].rate > 0.0f)
        dropout_backward(dsrc, op_ddst(m, p, l), p->lp[l].scratch, n);
    else
        memcpy(dsrc, op_ddst(m, p, l), n * sizeof(float));
    return 0;
}

const NnOpKind nn_op_dropout = {
    "Dropout", NN_OP_FOLDS_SGD,    dropout_infer,       dropout_scratch,
    NULL,      dropout_op_forward, dropout_op_backward,
};
