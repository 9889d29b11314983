/*
 * nn_model.c - model declaration, the flat parameter buffer and its size
 * table, initialisers, and the per-batch-size execution plan: every oneDNN
 * primitive and memory object a forward/backward pass needs, created once
 * per batch size and reused for every step (see nn_model.h).
 *
 * Kernels per layer (oneDNN unless noted):
 *   Dense    inner product fwd (bias + activation fused as an eltwise post-op);
 *            eltwise bwd from dst, inner product bwd weights (+bias), bwd data
 *   Conv2D   convolution likewise; weights reordered to the format oneDNN
 *            prefers when it differs from HWIO
 *   MaxPool  pooling fwd training with workspace, pooling bwd
 *   AvgPool  pooling (padding excluded from the average)
 *   Dropout  C (counter-based RNG, nn_ref.c); Flatten: an alias, no copy
 *   Loss     training: softmax cross-entropy, its gradient and the hits in one
 *            C pass (nn_loss.c); evaluation: oneDNN log-softmax, then C
 * Plain SGD on a Dense stack is folded into the weight-gradient GEMMs
 * (model_backward_sgd in nn_plan.c). With NN_BF16 precision the Dense and
 * Conv2D primitives run on bf16 copies of their inputs (build_weighted in
 * nn_plan.c): the input rows are gathered into bf16, activations between two
 * bf16 layers stay bf16 both ways, and within a run of steps the optimizer
 * writes the next forward's bf16 Dense weights (optim_step_bf16). The
 * training loops are in nn_train.c.
 */
#include "nn/nn_model_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- declaration and shapes --------------------------------------------- */

static int out_dim(int in, int k, int s, int same, int *pad_lo, int *pad_hi)
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

static const char *kind_name(LayerKind k)
{
    static const char *names[] = {"Dense",   "Conv2D", "MaxPool2D", "AveragePooling2D",
                                  "Dropout", "Flatten"};
    return (unsigned)k < 6 ? names[k] : "?";
}

static int add_tensor(Model *m, int layer, int is_bias, int ndim, const int *shape)
{
    ParamInfo *t = &m->tensors[m->ntensors++];
    t->layer = layer;
    t->is_bias = is_bias;
    t->ndim = ndim;
    t->size = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->size *= (size_t)shape[i];
    }
    t->offset = m->nparams;
    m->nparams += t->size;
    return m->ntensors - 1;
}

static int shape_layer(Model *m, int l, int h, int w, int c, SgError *err)
{
    const LayerSpec *sp = &m->specs[l];
    LayerShape *s = &m->shapes[l];
    memset(s, 0, sizeof *s);
    s->h = h, s->w = w, s->c = c;
    m->kernel_t[l] = m->bias_t[l] = -1;
    switch (sp->kind) {
    case LAYER_DENSE: {
        if (h != 1 || w != 1)
            return sg_fail(err, SG_EMODEL,
                           "layer %d (Dense): input is %dx%dx%d; add Flatten before a Dense layer",
                           l, h, w, c);
        if (sp->units <= 0)
            return sg_fail(err, SG_EMODEL, "layer %d (Dense): units must be > 0, not %d", l,
                           sp->units);
        s->oh = s->ow = 1;
        s->oc = sp->units;
        int ks[2] = {c, sp->units}, bs[1] = {sp->units};
        m->kernel_t[l] = add_tensor(m, l, 0, 2, ks);
        m->bias_t[l] = add_tensor(m, l, 1, 1, bs);
        break;
    }
    case LAYER_CONV2D:
    case LAYER_MAXPOOL:
    case LAYER_AVGPOOL: {
        int conv = sp->kind == LAYER_CONV2D;
        int stride = sp->stride > 0 ? sp->stride : (conv ? 1 : sp->kh);
        if (sp->kh <= 0 || sp->kw <= 0 || stride <= 0 || (conv && sp->units <= 0))
            return sg_fail(err, SG_EMODEL,
                           "layer %d (%s): kernel %dx%d, stride %d, filters %d must be > 0", l,
                           kind_name(sp->kind), sp->kh, sp->kw, stride, sp->units);
        m->specs[l].stride = stride;
        s->oh = out_dim(h, sp->kh, stride, sp->same, &s->pt, &s->pb);
        s->ow = out_dim(w, sp->kw, stride, sp->same, &s->pl, &s->pr);
        s->oc = conv ? sp->units : c;
        if (s->oh <= 0 || s->ow <= 0)
            return sg_fail(
                err, SG_EMODEL,
                "layer %d (%s): window %dx%d does not fit the %dx%d input with valid padding", l,
                kind_name(sp->kind), sp->kh, sp->kw, h, w);
        if (conv) {
            int ks[4] = {sp->kh, sp->kw, c, sp->units}, bs[1] = {sp->units};
            m->kernel_t[l] = add_tensor(m, l, 0, 4, ks);
            m->bias_t[l] = add_tensor(m, l, 1, 1, bs);
        }
        break;
    }
    case LAYER_DROPOUT:
        if (!(sp->rate >= 0.0f && sp->rate < 1.0f))
            return sg_fail(err, SG_EMODEL, "layer %d (Dropout): rate must be in [0, 1), not %g", l,
                           sp->rate);
        s->oh = h, s->ow = w, s->oc = c;
        break;
    case LAYER_FLATTEN:
        s->oh = s->ow = 1;
        s->oc = h * w * c;
        break;
    default:
        return sg_fail(err, SG_EMODEL, "layer %d: unknown layer kind %d", l, (int)sp->kind);
    }
    if (sp->act != NN_ACT_NONE && sp->kind != LAYER_DENSE && sp->kind != LAYER_CONV2D)
        return sg_fail(err, SG_EMODEL, "layer %d (%s) takes no activation", l, kind_name(sp->kind));
    if ((unsigned)sp->act > NN_ACT_SOFTMAX)
        return sg_fail(err, SG_EMODEL, "layer %d: unknown activation %d", l, (int)sp->act);
    if (sp->act == NN_ACT_SOFTMAX && l != m->nlayers - 1)
        return sg_fail(err, SG_EMODEL, "layer %d: softmax is only supported on the last layer", l);
    return 0;
}

int model_create(Model **out, int h, int w, int c, const LayerSpec *layers, int nlayers,
                 SgError *err)
{
    *out = NULL;
    if (nlayers <= 0 || h <= 0 || w <= 0 || c <= 0)
        return sg_fail(err, SG_EMODEL,
                       "model needs layers and a positive input shape (%dx%dx%d, %d layers)", h, w,
                       c, nlayers);
    Model *m = calloc(1, sizeof *m);
    if (m == NULL)
        return sg_fail(err, SG_ENOMEM, "model: out of memory");
    int rc = 0;
    m->nlayers = nlayers;
    m->specs = calloc(nlayers, sizeof *m->specs);
    m->shapes = calloc(nlayers, sizeof *m->shapes);
    m->tensors = calloc(2 * (size_t)nlayers, sizeof *m->tensors);
    m->kernel_t = calloc(nlayers, sizeof(int));
    m->bias_t = calloc(nlayers, sizeof(int));
    if (!m->specs || !m->shapes || !m->tensors || !m->kernel_t || !m->bias_t) {
        rc = sg_fail(err, SG_ENOMEM, "model: out of memory");
        goto cleanup;
    }
    memcpy(m->specs, layers, nlayers * sizeof *layers);
    m->in_h = h, m->in_w = w, m->in_c = c;
    for (int l = 0; l < nlayers; l++) {
        if ((rc = shape_layer(m, l, h, w, c, err)) < 0)
            goto cleanup;
        h = m->shapes[l].oh, w = m->shapes[l].ow, c = m->shapes[l].oc;
    }
    const LayerSpec *last = &m->specs[nlayers - 1];
    if (h != 1 || w != 1 || (last->kind != LAYER_DENSE) ||
        (last->act != NN_ACT_NONE && last->act != NN_ACT_SOFTMAX)) {
        rc = sg_fail(err, SG_EMODEL,
                     "the last layer must be Dense with softmax or no activation (cross-entropy on "
                     "logits); it is %s with output %dx%dx%d",
                     kind_name(last->kind), h, w, c);
        goto cleanup;
    }
    m->classes = c;
    /* 64-byte aligned so that oneDNN and the optimizer loops vectorise cleanly */
    size_t bytes = ((m->nparams * sizeof(float) + 63) / 64) * 64;
    m->params = aligned_alloc(64, bytes ? bytes : 64);
    m->grads = aligned_alloc(64, bytes ? bytes : 64);
    if (!m->params || !m->grads) {
        rc = sg_fail(err, SG_ENOMEM, "model: cannot allocate 2 x %zu parameters", m->nparams);
        goto cleanup;
    }
    memset(m->params, 0, bytes);
    memset(m->grads, 0, bytes);
    if ((rc = DNNL(err, dnnl_engine_create, &m->eng, dnnl_cpu, 0)) < 0)
        goto cleanup;
    if ((rc = DNNL(err, dnnl_stream_create, &m->stream, m->eng, dnnl_stream_default_flags)) < 0)
        goto cleanup;
    m->rng_seed = 0;
    *out = m;
    return 0;
cleanup:
    model_free(m);
    return rc;
}

void model_free(Model *m)
{
    if (m == NULL)
        return;
    for (int i = 0; i < PLAN_CACHE; i++)
        plan_free(m->plans[i]);
    if (m->stream)
        dnnl_stream_destroy(m->stream);
    if (m->eng)
        dnnl_engine_destroy(m->eng);
    free(m->params);
    free(m->grads);
    free(m->specs);
    free(m->shapes);
    free(m->tensors);
    free(m->kernel_t);
    free(m->bias_t);
    free(m);
}

size_t model_num_params(const Model *m)
{
    return m->nparams;
}
float *model_params(Model *m)
{
    return m->params;
}
float *model_grads(Model *m)
{
    return m->grads;
}
int model_num_tensors(const Model *m)
{
    return m->ntensors;
}
const ParamInfo *model_param_info(const Model *m, int i)
{
    return i >= 0 && i < m->ntensors ? &m->tensors[i] : NULL;
}
const LayerShape *model_layer_shape(const Model *m, int l)
{
    return l >= 0 && l < m->nlayers ? &m->shapes[l] : NULL;
}
int model_num_layers(const Model *m)
{
    return m->nlayers;
}
const LayerSpec *model_layer_spec(const Model *m, int l)
{
    return l >= 0 && l < m->nlayers ? &m->specs[l] : NULL;
}
int model_num_classes(const Model *m)
{
    return m->classes;
}
size_t model_input_size(const Model *m)
{
    return (size_t)m->in_h * m->in_w * m->in_c;
}

void model_get_rng(const Model *m, uint64_t *seed, uint64_t *counter)
{
    *seed = m->rng_seed;
    *counter = m->rng_counter;
}

void model_set_rng(Model *m, uint64_t seed, uint64_t counter)
{
    m->rng_seed = seed;
    m->rng_counter = counter;
}

/* ---- initialisers ------------------------------------------------------- */

static double normal_at(uint64_t seed, uint64_t *ctr)
{
    /* Box-Muller on two counter-based uniforms */
    double u1 = nn_uniform(seed, (*ctr)++), u2 = nn_uniform(seed, (*ctr)++);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

static double truncated_normal_at(uint64_t seed, uint64_t *ctr)
{
    for (;;) {
        double z = normal_at(seed, ctr);
        if (fabs(z) <= 2.0)
            return z;
    }
}

void model_init_params(Model *m, uint64_t seed)
{
    uint64_t ctr = 0;
    for (int t = 0; t < m->ntensors; t++) {
        const ParamInfo *p = &m->tensors[t];
        float *w = m->params + p->offset;
        if (p->is_bias) {
            memset(w, 0, p->size * sizeof(float));
            continue;
        }
        const LayerSpec *sp = &m->specs[p->layer];
        /* fan_in = size / OC, fan_out = size / C (receptive field included) */
        int oc = p->shape[p->ndim - 1], cin = p->shape[p->ndim - 2];
        double fan_in = (double)p->size / oc, fan_out = (double)p->size / cin;
        uint64_t tseed = nn_mix64(seed + 0x1000193ull * (uint64_t)(t + 1));
        for (size_t i = 0; i < p->size; i++) {
            double v;
            switch (sp->init) {
            case INIT_TRUNCATED_NORMAL:
                v = truncated_normal_at(tseed, &ctr) / sqrt(fan_in);
                break;
            case INIT_HE_NORMAL:
                v = truncated_normal_at(tseed, &ctr) * sqrt(2.0 / fan_in) / 0.87962566103423978;
                break;
            case INIT_HE_UNIFORM:
                v = (2.0 * nn_uniform(tseed, ctr++) - 1.0) * sqrt(6.0 / fan_in);
                break;
            case INIT_ZEROS:
                v = 0.0;
                break;
            default: /* INIT_GLOROT_UNIFORM */
                v = (2.0 * nn_uniform(tseed, ctr++) - 1.0) * sqrt(6.0 / (fan_in + fan_out));
                break;
            }
            w[i] = (float)v;
        }
    }
}

void model_shuffle(Model *m, int64_t *order, size_t n)
{
    for (size_t i = 0; i < n; i++)
        order[i] = (int64_t)i;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(nn_uniform(m->rng_seed, m->rng_counter++) * (double)i);
        if (j >= i)
            j = i - 1;
        int64_t t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
}
