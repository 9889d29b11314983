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

static int add_table(ParamInfo *table, int *count, size_t *total, int layer, const char *name,
                     NnFill fill, int ndim, const int *shape)
{
    ParamInfo *t = &table[(*count)++];
    t->layer = layer;
    t->name = name;
    t->fill = fill;
    t->is_bias = fill == NN_FILL_ZEROS;
    t->ndim = ndim;
    t->size = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->size *= (size_t)shape[i];
    }
    t->offset = *total;
    *total += t->size;
    return *count - 1;
}

int model_add_param(Model *m, int layer, const char *name, NnFill fill, int ndim, const int *shape)
{
    return add_table(m->tensors, &m->ntensors, &m->nparams, layer, name, fill, ndim, shape);
}

int model_add_tensor(Model *m, int layer, int is_bias, int ndim, const int *shape)
{
    return model_add_param(m, layer, is_bias ? "bias" : "kernel",
                           is_bias ? NN_FILL_ZEROS : NN_FILL_INIT, ndim, shape);
}

int model_add_state(Model *m, int layer, const char *name, NnFill fill, int ndim, const int *shape)
{
    return add_table(m->states, &m->nstates, &m->nstate, layer, name, fill, ndim, shape);
}

/* 1 if tables a[0..n) and b[0..n) declare tensors of the same shapes. */
static int same_shapes(const ParamInfo *a, const ParamInfo *b, int n)
{
    for (int i = 0; i < n; i++)
        if (a[i].ndim != b[i].ndim ||
            memcmp(a[i].shape, b[i].shape, sizeof a[i].shape[0] * a[i].ndim) != 0)
            return 0;
    return 1;
}

/* Node l uses node `shares`'s parameters and state: the tensors its infer
 * just declared must have their shapes, and are dropped. */
static int share_params(Model *m, int l, SgError *err)
{
    const int o = m->nodes[l].shares;
    const char *name = nn_op_of(m, l)->name;
    if (o < 0 || o >= l || memcmp(&m->specs[o], &m->specs[l], sizeof m->specs[l]) != 0)
        return sg_fail(
            err, SG_EMODEL,
            "layer %d (%s) shares layer %d's parameters; a shared layer is an earlier node "
            "of the same layer",
            l, name, o);
    const int np = m->param_count[l], ns = m->state_count[l];
    if (np + ns == 0)
        return sg_fail(err, SG_EMODEL, "layer %d (%s) has no parameters to share", l, name);
    if (!same_shapes(&m->tensors[m->param_first[l]], &m->tensors[m->param_first[o]], np) ||
        !same_shapes(&m->states[m->state_first[l]], &m->states[m->state_first[o]], ns))
        return sg_fail(
            err, SG_EMODEL,
            "layer %d (%s) is layer %d called again, on an input of %d channels where "
            "layer %d had %d: a shared layer's input must give its weights the same shapes",
            l, name, o, m->shapes[l].c, o, m->shapes[o].c);
    m->ntensors = m->param_first[l];
    m->nparams = np ? m->tensors[m->ntensors].offset : m->nparams;
    m->nstates = m->state_first[l];
    m->nstate = ns ? m->states[m->nstates].offset : m->nstate;
    m->param_first[l] = m->param_first[o];
    m->state_first[l] = m->state_first[o];
    m->kernel_t[l] = m->kernel_t[o];
    m->bias_t[l] = m->bias_t[o];
    return 0;
}

/* Node l on its inputs (their shapes known: nodes come in topological
 * order): its op's shapes and parameters, then what every layer shares (the
 * activation rules). */
static int shape_layer(Model *m, int l, SgError *err)
{
    const LayerSpec *sp = &m->specs[l];
    const NnOpKind *op = nn_op_kind(sp->kind);
    const NnNode *nd = &m->nodes[l];
    LayerShape *s = &m->shapes[l];
    memset(s, 0, sizeof *s);
    m->kernel_t[l] = m->bias_t[l] = -1;
    if (op == NULL)
        return sg_fail(err, SG_EMODEL, "layer %d: unknown layer kind %d", l, (int)sp->kind);
    const int merge = (op->flags & NN_OP_MERGE) != 0;
    if (merge ? nd->ninputs < 2 || nd->ninputs > NN_MAX_NODE_INPUTS : nd->ninputs != 1)
        return merge ? sg_fail(err, SG_EMODEL, "layer %d (%s) reads 2 to %d tensors, not %d", l,
                               op->name, NN_MAX_NODE_INPUTS, nd->ninputs)
                     : sg_fail(err, SG_EMODEL, "layer %d (%s) reads one tensor, not %d", l,
                               op->name, nd->ninputs);
    for (int k = 0; k < nd->ninputs; k++)
        if (nd->inputs[k] < 0 || nd->inputs[k] >= node_out(m, l))
            return sg_fail(err, SG_EMODEL,
                           "layer %d (%s): input %d is tensor %d; a layer reads the model's inputs "
                           "(0..%d) or an earlier layer's output (tensor %d..%d)",
                           l, op->name, k, nd->inputs[k], m->ninputs - 1, m->ninputs,
                           node_out(m, l) - 1);
    const NnShape *in = op_in_shape(m, l, 0);
    s->h = in->h, s->w = in->w, s->c = in->c;
    m->param_first[l] = m->ntensors;
    m->state_first[l] = m->nstates;
    int rc = op->infer(m, l, err);
    if (rc < 0)
        return rc;
    m->param_count[l] = m->ntensors - m->param_first[l];
    m->state_count[l] = m->nstates - m->state_first[l];
    if (nd->shares >= 0 && (rc = share_params(m, l, err)) < 0)
        return rc;
    if (sp->act != NN_ACT_NONE && !(op->flags & NN_OP_ACTIVATION))
        return sg_fail(err, SG_EMODEL, "layer %d (%s) takes no activation", l, op->name);
    if ((unsigned)sp->act >= NN_ACT_COUNT)
        return sg_fail(err, SG_EMODEL, "layer %d: unknown activation %d", l, (int)sp->act);
    NnShape *o = &m->tshape[node_out(m, l)];
    o->h = s->oh, o->w = s->ow, o->c = s->oc;
    return 0;
}

/* The outputs, the readers of every tensor and which need a gradient. */
static int link_graph(Model *m, const int *outputs, int noutputs, SgError *err)
{
    const int T = m->ntensors_graph;
    for (int l = 0; l < m->nlayers; l++)
        for (int k = 0; k < m->nodes[l].ninputs; k++)
            m->readers[node_in(m, l, k)]++;
    m->noutputs = noutputs;
    for (int j = 0; j < noutputs; j++) {
        const int t = outputs[j];
        if (t < m->ninputs || t >= T)
            return sg_fail(err, SG_EMODEL,
                           "output %d is tensor %d; an output is a layer's (tensor %d..%d)", j, t,
                           m->ninputs, T - 1);
        for (int i = 0; i < j; i++)
            if (outputs[i] == t)
                return sg_fail(err, SG_EMODEL, "outputs %d and %d are the same tensor %d", i, j, t);
        const NnShape *sh = &m->tshape[t];
        const int l = t - m->ninputs;
        if (sh->h != 1 || sh->w != 1)
            return sg_fail(err, SG_EMODEL,
                           "output %d (layer %d, %s) is %dx%dx%d; it must be flat: add Flatten "
                           "before the Dense that makes it (Dense works on the last axis)",
                           j, l, nn_op_of(m, l)->name, sh->h, sh->w, sh->c);
        ModelOutput *o = &m->outputs[j];
        o->tensor = t;
        o->width = sh->c;
        o->loss_weight = 1.0f;
        const LayerSpec *sp = &m->specs[l];
        /* a head only where nothing else reads the activation */
        o->head = nn_op_of(m, l) == &nn_op_dense && m->readers[t] == 0 &&
                          (sp->act == NN_ACT_SOFTMAX || sp->act == NN_ACT_SIGMOID)
                      ? sp->act
                      : NN_ACT_NONE;
        /* the default loss: what the head and the width suggest */
        o->loss.kind = o->head == NN_ACT_SIGMOID ? NN_LOSS_BINARY_CE
                       : o->width >= 2           ? NN_LOSS_SPARSE_CE
                                                 : NN_LOSS_MSE;
        m->readers[t]++;
    }
    for (int l = 0; l < m->nlayers; l++) {
        if (m->specs[l].act == NN_ACT_SOFTMAX) {
            int head = 0;
            for (int j = 0; j < noutputs; j++)
                head |=
                    m->outputs[j].tensor == node_out(m, l) && m->outputs[j].head == NN_ACT_SOFTMAX;
            if (!head)
                return sg_fail(err, SG_EMODEL,
                               "layer %d: softmax is only supported on a Dense that is a model "
                               "output read by no other layer (the loss applies it)",
                               l);
        }
        if (m->readers[node_out(m, l)] == 0)
            return sg_fail(err, SG_EMODEL, "layer %d (%s): its output reaches no model output", l,
                           nn_op_of(m, l)->name);
    }
    for (int i = 0; i < m->ninputs; i++)
        if (m->readers[i] == 0)
            return sg_fail(err, SG_EMODEL, "input %d is read by no layer", i);
    for (int l = 0; l < m->nlayers; l++) {
        const int in = node_in(m, l, 0);
        m->needs_grad[node_out(m, l)] =
            (nn_op_of(m, l)->flags & NN_OP_ALIAS) ? m->needs_grad[in] : 1;
    }
    return 0;
}

/* The Embedding tables: one per parameter group of an NN_OP_SPARSE_ROWS
 * op, its first tensor, with nothing touched yet. */
static int find_tables(Model *m, SgError *err)
{
    m->table_of = malloc((size_t)m->nlayers * sizeof(int));
    m->touched = calloc((size_t)m->nlayers, sizeof *m->touched);
    m->tables = calloc((size_t)m->nlayers, sizeof *m->tables);
    if (!m->table_of || !m->touched || !m->tables)
        return sg_fail(err, SG_ENOMEM, "model: out of memory");
    for (int l = 0; l < m->nlayers; l++) {
        m->table_of[l] = -1;
        if (!(nn_op_of(m, l)->flags & NN_OP_SPARSE_ROWS) || m->param_count[l] == 0)
            continue;
        for (int k = 0; k < l && m->table_of[l] < 0; k++)
            if (m->table_of[k] >= 0 && m->param_first[k] == m->param_first[l])
                m->table_of[l] = m->table_of[k];
        if (m->table_of[l] >= 0)
            continue;
        const ParamInfo *t = &m->tensors[m->param_first[l]];
        m->touched[m->ntables] =
            (OptimRows){t->offset, (size_t)t->shape[0], (size_t)t->shape[1], NULL, 0};
        m->table_of[l] = m->ntables++;
    }
    return 0;
}

int model_touched_rows(const Model *m, const OptimRows **tables)
{
    *tables = m->touched;
    return m->ntables;
}

void model_tables_written(Model *m)
{
    for (int i = 0; i < m->ntables; i++)
        m->tables[i].grads_whole = 1;
}

int model_create_graph(Model **out, const NnShape *inputs, int ninputs, const NnNode *nodes,
                       int nnodes, const int *outputs, int noutputs, SgError *err)
{
    *out = NULL;
    if (nnodes <= 0 || ninputs <= 0 || ninputs > NN_MAX_IO || noutputs <= 0 || noutputs > NN_MAX_IO)
        return sg_fail(err, SG_EMODEL,
                       "a model needs layers, 1 to %d inputs and 1 to %d outputs (%d layers, %d "
                       "inputs, %d outputs)",
                       NN_MAX_IO, NN_MAX_IO, nnodes, ninputs, noutputs);
    for (int i = 0; i < ninputs; i++)
        if (inputs[i].h <= 0 || inputs[i].w <= 0 || inputs[i].c <= 0)
            return sg_fail(err, SG_EMODEL, "input %d has shape %dx%dx%d; every size must be > 0", i,
                           inputs[i].h, inputs[i].w, inputs[i].c);
    Model *m = calloc(1, sizeof *m);
    if (m == NULL)
        return sg_fail(err, SG_ENOMEM, "model: out of memory");
    int rc = 0;
    const int T = ninputs + nnodes;
    m->nlayers = nnodes;
    m->ninputs = ninputs;
    m->ntensors_graph = T;
    m->specs = calloc(nnodes, sizeof *m->specs);
    m->shapes = calloc(nnodes, sizeof *m->shapes);
    m->nodes = calloc(nnodes, sizeof *m->nodes);
    m->tshape = calloc(T, sizeof *m->tshape);
    m->readers = calloc(T, sizeof(int));
    m->needs_grad = calloc(T, sizeof(int));
    m->accumulate = calloc(nnodes, sizeof(int));
    m->tells = calloc(nnodes, sizeof(int));
    m->tensors = calloc(2 * (size_t)nnodes, sizeof *m->tensors);
    m->states = calloc(2 * (size_t)nnodes, sizeof *m->states);
    m->kernel_t = calloc(nnodes, sizeof(int));
    m->bias_t = calloc(nnodes, sizeof(int));
    m->param_first = calloc(4 * (size_t)nnodes, sizeof(int));
    if (!m->specs || !m->shapes || !m->nodes || !m->tshape || !m->readers || !m->needs_grad ||
        !m->accumulate || !m->tells || !m->tensors || !m->states || !m->kernel_t || !m->bias_t ||
        !m->param_first) {
        rc = sg_fail(err, SG_ENOMEM, "model: out of memory");
        goto cleanup;
    }
    m->param_count = m->param_first + nnodes;
    m->state_first = m->param_count + nnodes;
    m->state_count = m->state_first + nnodes;
    memcpy(m->nodes, nodes, nnodes * sizeof *nodes);
    memcpy(m->tshape, inputs, ninputs * sizeof *inputs);
    for (int l = 0; l < nnodes; l++) {
        m->specs[l] = nodes[l].spec;
        if ((rc = shape_layer(m, l, err)) < 0)
            goto cleanup;
    }
    if ((rc = link_graph(m, outputs, noutputs, err)) < 0)
        goto cleanup;
    /* shared parameters: the group's last node writes the gradients, the
     * others add theirs; the group's first tells the hook */
    for (int l = 0; l < nnodes; l++) {
        if (m->param_count[l] == 0)
            continue;
        int first = 1, last = 1;
        for (int k = 0; k < nnodes; k++) {
            if (k != l && m->param_count[k] > 0 && m->param_first[k] == m->param_first[l]) {
                first &= k > l;
                last &= k < l;
            }
        }
        m->accumulate[l] = !last;
        m->tells[l] = first;
    }
    if ((rc = find_tables(m, err)) < 0)
        goto cleanup;
    m->classes = m->outputs[0].width;
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
    bytes = ((m->nstate * sizeof(float) + 63) / 64) * 64;
    if ((m->state = aligned_alloc(64, bytes ? bytes : 64)) == NULL) {
        rc = sg_fail(err, SG_ENOMEM, "model: cannot allocate %zu values of state", m->nstate);
        goto cleanup;
    }
    memset(m->state, 0, bytes ? bytes : 64);
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

int model_create(Model **out, int h, int w, int c, const LayerSpec *layers, int nlayers,
                 SgError *err)
{
    *out = NULL;
    if (nlayers <= 0 || h <= 0 || w <= 0 || c <= 0)
        return sg_fail(err, SG_EMODEL,
                       "model needs layers and a positive input shape (%dx%dx%d, %d layers)", h, w,
                       c, nlayers);
    NnNode *nodes = calloc(nlayers, sizeof *nodes);
    if (nodes == NULL)
        return sg_fail(err, SG_ENOMEM, "model: out of memory");
    for (int l = 0; l < nlayers; l++) {
        nodes[l].spec = layers[l];
        nodes[l].ninputs = 1;
        nodes[l].inputs[0] = l;
        nodes[l].shares = -1;
    }
    const NnShape in = {h, w, c};
    const int output = nlayers;
    int rc = model_create_graph(out, &in, 1, nodes, nlayers, &output, 1, err);
    free(nodes);
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
    free(m->state);
    free(m->states);
    free(m->param_first);
    free(m->specs);
    free(m->shapes);
    free(m->nodes);
    free(m->tshape);
    free(m->readers);
    free(m->needs_grad);
    free(m->accumulate);
    free(m->tells);
    free(m->tensors);
    free(m->kernel_t);
    free(m->bias_t);
    for (int i = 0; i < m->ntables; i++) {
        free(m->tables[i].ids);
        free(m->tables[i].tmp);
        free(m->tables[i].seen);
    }
    free(m->tables);
    free(m->touched);
    free(m->table_of);
    for (int j = 0; j < NN_MAX_IO; j++)
        free(m->outputs[j].metrics);
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
size_t model_num_state(const Model *m)
{
    return m->nstate;
}
float *model_state(Model *m)
{
    return m->state;
}
int model_num_state_tensors(const Model *m)
{
    return m->nstates;
}
const ParamInfo *model_state_info(const Model *m, int i)
{
    return i >= 0 && i < m->nstates ? &m->states[i] : NULL;
}
const LayerShape *model_layer_shape(const Model *m, int l)
{
    return l >= 0 && l < m->nlayers ? &m->shapes[l] : NULL;
}
int model_num_layers(const Model *m)
{
    return m->nlayers;
}
int model_num_inputs(const Model *m)
{
    return m->ninputs;
}
int model_num_outputs(const Model *m)
{
    return m->noutputs;
}
const NnShape *model_input_shape(const Model *m, int i)
{
    return i >= 0 && i < m->ninputs ? &m->tshape[i] : NULL;
}
size_t model_input_row(const Model *m, int i)
{
    const NnShape *s = model_input_shape(m, i);
    return s ? (size_t)s->h * s->w * s->c : 0;
}
int model_output_tensor(const Model *m, int j)
{
    return j >= 0 && j < m->noutputs ? m->outputs[j].tensor : -1;
}
int model_output_width(const Model *m, int j)
{
    return j >= 0 && j < m->noutputs ? m->outputs[j].width : 0;
}
int model_node_inputs(const Model *m, int l, const int **ids)
{
    if (l < 0 || l >= m->nlayers)
        return 0;
    *ids = m->nodes[l].inputs;
    return m->nodes[l].ninputs;
}
int model_num_classes(const Model *m)
{
    return m->classes;
}
size_t model_input_size(const Model *m)
{
    return model_input_row(m, 0);
}

NnAct model_output_head(const Model *m, int j)
{
    return j >= 0 && j < m->noutputs ? m->outputs[j].head : NN_ACT_NONE;
}

NnAct model_head(const Model *m)
{
    return model_output_head(m, 0);
}

NnAct model_layer_act(const Model *m, int l)
{
    for (int j = 0; j < m->noutputs; j++)
        if (m->outputs[j].tensor == node_out(m, l) && m->outputs[j].head != NN_ACT_NONE)
            return NN_ACT_NONE;
    return m->specs[l].act;
}

/* ---- loss and metrics ---------------------------------------------------- */

static int check_output(const Model *m, int j, SgError *err)
{
    if (j < 0 || j >= m->noutputs)
        return sg_fail(err, SG_EINVAL, "output %d does not exist (the model has %d)", j,
                       m->noutputs);
    return 0;
}

int model_set_output_loss(Model *m, int j, const NnLoss *loss, float weight, SgError *err)
{
    int rc = check_output(m, j, err);
    if (rc < 0)
        return rc;
    ModelOutput *o = &m->outputs[j];
    if (!(weight >= 0.0f) || isinf(weight))
        return sg_fail(err, SG_EINVAL, "output %d: loss weight %g must be finite and >= 0", j,
                       (double)weight);
    if ((rc = nn_loss_check(loss, o->head, o->width, err)) < 0)
        return m->noutputs > 1 ? sg_context(err, "output %d: ", j) : rc;
    /* the metrics must still fit the loss's targets */
    for (int i = 0; i < o->nmetrics; i++)
        if ((rc = nn_metric_check(&o->metrics[i], o->width, nn_loss_ops(loss->kind)->sparse, err)) <
            0)
            return rc;
    o->loss = *loss;
    o->loss_weight = weight;
    return 0;
}

int model_set_loss(Model *m, const NnLoss *loss, SgError *err)
{
    return model_set_output_loss(m, 0, loss, 1.0f, err);
}

const NnLoss *model_output_loss(const Model *m, int j)
{
    return j >= 0 && j < m->noutputs ? &m->outputs[j].loss : NULL;
}

const NnLoss *model_loss(const Model *m)
{
    return model_output_loss(m, 0);
}

int model_set_output_metrics(Model *m, int j, const NnMetric *metrics, int n, SgError *err)
{
    int rc = check_output(m, j, err);
    if (rc < 0)
        return rc;
    ModelOutput *o = &m->outputs[j];
    const int sparse = nn_loss_ops(o->loss.kind)->sparse;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if ((rc = nn_metric_check(&metrics[i], o->width, sparse, err)) < 0)
            return m->noutputs > 1 ? sg_context(err, "output %d: ", j) : rc;
        total += nn_metric_state_size(&metrics[i]);
    }
    NnMetric *copy = NULL;
    if (n > 0 && (copy = malloc((size_t)n * sizeof *copy)) == NULL)
        return sg_fail(err, SG_ENOMEM, "model: out of memory");
    if (n > 0)
        memcpy(copy, metrics, (size_t)n * sizeof *copy);
    free(o->metrics);
    o->metrics = copy;
    o->nmetrics = n;
    m->metric_state += total - o->metric_state;
    o->metric_state = total;
    return 0;
}

int model_set_metrics(Model *m, const NnMetric *metrics, int n, SgError *err)
{
    return model_set_output_metrics(m, 0, metrics, n, err);
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

/* A constant fill (zeros, ones); 0 for NN_FILL_INIT, left to the caller. */
static int fill_constant(const ParamInfo *p, float *w)
{
    if (p->fill == NN_FILL_INIT)
        return 0;
    const float v = p->fill == NN_FILL_ONES ? 1.0f : 0.0f;
    for (size_t i = 0; i < p->size; i++)
        w[i] = v;
    return 1;
}

void model_init_params(Model *m, uint64_t seed)
{
    for (int t = 0; t < m->nstates; t++)
        fill_constant(&m->states[t], m->state + m->states[t].offset);
    uint64_t ctr = 0;
    for (int t = 0; t < m->ntensors; t++) {
        const ParamInfo *p = &m->tensors[t];
        float *w = m->params + p->offset;
        if (fill_constant(p, w))
            continue;
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
            case INIT_UNIFORM:
                v = (2.0 * nn_uniform(tseed, ctr++) - 1.0) * 0.05;
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
