/* nn_op.c - the op table and what the ops share (see nn_op.h). */
#include "nn/nn_op.h"

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
