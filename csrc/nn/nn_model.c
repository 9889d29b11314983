/*
 * nn_model.c - model declaration, the flat parameter buffer and its size
 * table, the loss and metrics chosen, initialisers and the RNG (see
 * nn_model.h). Each layer's shapes and parameters come from its op's entry
 * in the op table (nn_op.h, one file per op); the execution plan is
 * nn_plan.c's, the training loops nn_train.c's, the loss and metric tables
 * nn_loss.c's and nn_metric.c's.
 */
#include "nn/nn_op.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- declaration and shapes --------------------------------------------- */

int model_add_tensor(Model *m, int layer, int is_bias, int ndim, const int *shape)
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

/* Layer l on an input of h x w x c: its op's shapes and parameters, then
 * what every layer shares (the activation rules). */
static int shape_layer(Model *m, int l, int h, int w, int c, SgError *err)
{
    const LayerSpec *sp = &m->specs[l];
    const NnOpKind *op = nn_op_kind(sp->kind);
    LayerShape *s = &m->shapes[l];
    memset(s, 0, sizeof *s);
    s->h = h, s->w = w, s->c = c;
    m->kernel_t[l] = m->bias_t[l] = -1;
    if (op == NULL)
        return sg_fail(err, SG_EMODEL, "layer %d: unknown layer kind %d", l, (int)sp->kind);
    int rc = op->infer(m, l, err);
    if (rc < 0)
        return rc;
    if (sp->act != NN_ACT_NONE && !(op->flags & NN_OP_ACTIVATION))
        return sg_fail(err, SG_EMODEL, "layer %d (%s) takes no activation", l, op->name);
    if ((unsigned)sp->act >= NN_ACT_COUNT)
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
    if (h != 1 || w != 1) {
        rc = sg_fail(err, SG_EMODEL,
                     "the model's output is %dx%dx%d; it must be flat (end with Dense, or add "
                     "Flatten)",
                     h, w, c);
        goto cleanup;
    }
    m->classes = c;
    const LayerSpec *last = &m->specs[nlayers - 1];
    m->head = nn_op_kind(last->kind) == &nn_op_dense &&
                      (last->act == NN_ACT_SOFTMAX || last->act == NN_ACT_SIGMOID)
                  ? last->act
                  : NN_ACT_NONE;
    /* the default loss: what the head and the outputs suggest */
    m->loss.kind = m->head == NN_ACT_SIGMOID ? NN_LOSS_BINARY_CE
                   : c >= 2                  ? NN_LOSS_SPARSE_CE
                                             : NN_LOSS_MSE;
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
    free(m->metrics);
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
int model_num_classes(const Model *m)
{
    return m->classes;
}
size_t model_input_size(const Model *m)
{
    return (size_t)m->in_h * m->in_w * m->in_c;
}

NnAct model_head(const Model *m)
{
    return m->head;
}

NnAct model_layer_act(const Model *m, int l)
{
    return l == m->nlayers - 1 && m->head != NN_ACT_NONE ? NN_ACT_NONE : m->specs[l].act;
}

/* ---- loss and metrics ---------------------------------------------------- */

int model_set_loss(Model *m, const NnLoss *loss, SgError *err)
{
    int rc = nn_loss_check(loss, m->head, m->classes, err);
    if (rc < 0)
        return rc;
    /* the metrics must still fit the loss's targets */
    for (int i = 0; i < m->nmetrics; i++)
        if ((rc = nn_metric_check(&m->metrics[i], m->classes, nn_loss_ops(loss->kind)->sparse,
                                  err)) < 0)
            return rc;
    m->loss = *loss;
    return 0;
}

const NnLoss *model_loss(const Model *m)
{
    return &m->loss;
}

int model_set_metrics(Model *m, const NnMetric *metrics, int n, SgError *err)
{
    const int sparse = nn_loss_ops(m->loss.kind)->sparse;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        int rc = nn_metric_check(&metrics[i], m->classes, sparse, err);
        if (rc < 0)
            return rc;
        total += nn_metric_state_size(&metrics[i]);
    }
    NnMetric *copy = NULL;
    if (n > 0 && (copy = malloc((size_t)n * sizeof *copy)) == NULL)
        return sg_fail(err, SG_ENOMEM, "model: out of memory");
    if (n > 0)
        memcpy(copy, metrics, (size_t)n * sizeof *copy);
    free(m->metrics);
    m->metrics = copy;
    m->nmetrics = n;
    m->metric_state = total;
    return 0;
}

size_t model_metric_state_size(const Model *m)
{
    return m->metric_state;
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
