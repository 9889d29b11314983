/*
 * py_nn.c - sparkgrad._core.Model: a network (a graph of layers) of nn/nn_model.h
 * whose parameter and gradient buffers are exposed as NumPy views (no copy),
 * and whose training, evaluation and prediction loops run with the GIL
 * released. The Keras-like API (sparkgrad.nn) is built on it in Python;
 * set_num_threads/get_num_threads set the OpenMP thread count.
 */
#include "py/py_nn.h"
#include "py/py_nn_prep.h"

#include <math.h>
#include <string.h>

typedef struct ModelObject {
    PyObject_HEAD
    Model *model;
    int busy; /* a GIL-released call is running */
    /* the string columns' arrays of the running call (raw columns of inputs
     * with preprocessing), held until its C pass ends, whatever object handed
     * them over */
    PyObject *held;
} ModelObject;

static void model_dealloc(ModelObject *self)
{
    Py_CLEAR(self->held);
    model_free(self->model);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Sets *out from the int field `key` of a layer description (absent: left). */
static int layer_int(PyObject *desc, const char *key, int *out, Py_ssize_t i)
{
    PyObject *v = PyDict_GetItemString(desc, key); /* borrowed */
    if (v == NULL)
        return 0;
    long x = PyLong_AsLong(v);
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return sg_raise_code(SG_EINVAL, "layer %zd: %s must be an int, not %s", i, key,
                             Py_TYPE(v)->tp_name),
               -1;
    }
    *out = (int)x;
    return 0;
}

/* Sets out[0..n) from the int-sequence field `key` (absent: left). */
static int layer_ints(PyObject *desc, const char *key, int *out, int min, int max, int *count,
                      Py_ssize_t i)
{
    PyObject *v = PyDict_GetItemString(desc, key);
    if (v == NULL)
        return 0;
    PyObject *seq = PySequence_Fast(v, "");
    Py_ssize_t n = seq ? PySequence_Fast_GET_SIZE(seq) : -1;
    int rc = 0;
    if (seq == NULL || n < min || n > max) {
        PyErr_Clear();
        rc = -1;
    }
    for (Py_ssize_t k = 0; rc == 0 && k < n; k++) {
        long x = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, k));
        if (x == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            rc = -1;
        }
        out[k] = (int)x;
    }
    Py_XDECREF(seq);
    if (rc < 0)
        return sg_raise_code(SG_EINVAL, "layer %zd: %s must be a sequence of %d to %d ints", i, key,
                             min, max),
               -1;
    if (count)
        *count = (int)n;
    return 0;
}

/* The fields of a layer description (a dict), the typed form Python hands
 * over: "kind" (an index of LAYER_KINDS) is required, the others default to
 * 0 / none; "inputs" defaults to the previous tensor (a chain). */
static const char *const LAYER_FIELDS[] = {
    "kind",  "inputs",      "units",        "kernel_size", "strides", "padding",  "activation",
    "rate",  "initializer", "target_shape", "shares",      "epsilon", "momentum", "center",
    "scale", "normalize",   "input_dim",    "mask_zero",   NULL,
};

/* desc[key] as a float into *out, if present. */
static int layer_float(PyObject *desc, const char *key, float *out)
{
    PyObject *v = PyDict_GetItemString(desc, key);
    if (v == NULL)
        return 0;
    double r = PyFloat_AsDouble(v);
    if (r == -1.0 && PyErr_Occurred())
        return -1;
    *out = (float)r;
    return 0;
}

static int parse_layer(PyObject *desc, Py_ssize_t i, int ninputs, NnNode *nd)
{
    if (!PyDict_Check(desc))
        return sg_raise_code(SG_EINVAL, "layer %zd must be a dict (a layer description), not %s", i,
                             Py_TYPE(desc)->tp_name),
               -1;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(desc, &pos, &key, &value)) {
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        int known = 0;
        for (int f = 0; k != NULL && LAYER_FIELDS[f] != NULL; f++)
            known |= strcmp(k, LAYER_FIELDS[f]) == 0;
        if (!known) {
            PyErr_Clear();
            PyObject *r = PyObject_Repr(key);
            sg_raise_code(SG_EINVAL, "layer %zd: unknown field %s", i,
                          r ? PyUnicode_AsUTF8(r) : "?");
            Py_XDECREF(r);
            return -1;
        }
    }
    LayerSpec *s = &nd->spec;
    memset(nd, 0, sizeof *nd);
    int kind = -1, act = 0, init = 0, kernel[2] = {0, 0};
    nd->ninputs = 1;
    nd->inputs[0] = ninputs - 1 + (int)i; /* the previous tensor */
    nd->shares = -1;
    if (layer_int(desc, "kind", &kind, i) < 0 || layer_int(desc, "units", &s->units, i) < 0 ||
        layer_int(desc, "strides", &s->stride, i) < 0 ||
        layer_int(desc, "activation", &act, i) < 0 ||
        layer_int(desc, "initializer", &init, i) < 0 ||
        layer_int(desc, "shares", &nd->shares, i) < 0 ||
        layer_int(desc, "center", &s->center, i) < 0 ||
        layer_int(desc, "scale", &s->scale, i) < 0 ||
        layer_int(desc, "normalize", &s->normalize, i) < 0 ||
        layer_int(desc, "input_dim", &s->input_dim, i) < 0 ||
        layer_int(desc, "mask_zero", &s->mask_zero, i) < 0 ||
        layer_float(desc, "rate", &s->rate) < 0 || layer_float(desc, "epsilon", &s->epsilon) < 0 ||
        layer_float(desc, "momentum", &s->momentum) < 0 ||
        layer_ints(desc, "kernel_size", kernel, 2, 2, NULL, i) < 0 ||
        layer_ints(desc, "target_shape", s->shape, 3, 3, NULL, i) < 0 ||
        layer_ints(desc, "inputs", nd->inputs, 1, NN_MAX_NODE_INPUTS, &nd->ninputs, i) < 0)
        return -1;
    if (kind < 0 || kind >= LAYER_KIND_COUNT)
        return sg_raise_code(SG_EINVAL, "layer %zd: kind must be an index of LAYER_KINDS, not %d",
                             i, kind),
               -1;
    PyObject *pad = PyDict_GetItemString(desc, "padding");
    const char *ps = pad && PyUnicode_Check(pad) ? PyUnicode_AsUTF8(pad) : NULL;
    if (pad != NULL && (ps == NULL || (strcmp(ps, "same") && strcmp(ps, "valid"))))
        return sg_raise_code(SG_EINVAL, "layer %zd: padding must be 'same' or 'valid'", i), -1;
    s->same = ps != NULL && strcmp(ps, "same") == 0;
    s->kind = (LayerKind)kind;
    s->kh = kernel[0];
    s->kw = kernel[1];
    s->act = (NnAct)act;
    s->init = (NnInit)init;
    return 0;
}

static int model_init(ModelObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"inputs", "layers", "outputs", NULL};
    PyObject *inputs, *layers, *outputs = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O:Model", kwlist, &inputs, &layers, &outputs))
        return -1;
    NnShape shapes[NN_MAX_IO];
    int nin = 0, nout = 0, outs[NN_MAX_IO];
    PyObject *iseq = PySequence_Fast(inputs, "inputs must be a sequence of (h, w, c) shapes");
    if (iseq == NULL)
        return -1;
    Py_ssize_t ni = PySequence_Fast_GET_SIZE(iseq);
    for (Py_ssize_t i = 0; i < ni && i < NN_MAX_IO; i++)
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(iseq, i), "iii;an input shape is (h, w, c)",
                              &shapes[i].h, &shapes[i].w, &shapes[i].c)) {
            Py_DECREF(iseq);
            return -1;
        }
    Py_DECREF(iseq);
    if (ni < 1 || ni > NN_MAX_IO)
        return sg_raise_code(SG_EMODEL, "a model has 1 to %d inputs, not %zd", NN_MAX_IO, ni), -1;
    nin = (int)ni;
    PyObject *seq = PySequence_Fast(layers, "layers must be a sequence of layer descriptions");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    NnNode *nodes = PyMem_Calloc(n ? (size_t)n : 1, sizeof *nodes);
    int rc = -1;
    if (nodes == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (parse_layer(PySequence_Fast_GET_ITEM(seq, i), i, nin, &nodes[i]) < 0)
            goto done;
    if (outputs == Py_None) {
        nout = 1;
        outs[0] = nin + (int)n - 1;
    } else {
        PyObject *oseq = PySequence_Fast(outputs, "outputs must be a sequence of tensor ids");
        if (oseq == NULL)
            goto done;
        Py_ssize_t no = PySequence_Fast_GET_SIZE(oseq);
        for (Py_ssize_t j = 0; j < no && j < NN_MAX_IO; j++) {
            outs[j] = (int)PyLong_AsLong(PySequence_Fast_GET_ITEM(oseq, j));
            if (outs[j] == -1 && PyErr_Occurred()) {
                Py_DECREF(oseq);
                goto done;
            }
        }
        Py_DECREF(oseq);
        if (no < 1 || no > NN_MAX_IO) {
            sg_raise_code(SG_EMODEL, "a model has 1 to %d outputs, not %zd", NN_MAX_IO, no);
            goto done;
        }
        nout = (int)no;
    }
    SgError err = {0};
    model_free(self->model);
    self->model = NULL;
    if (model_create_graph(&self->model, shapes, nin, nodes, (int)n, outs, nout, &err) < 0) {
        sg_raise(&err);
        goto done;
    }
    rc = 0;
done:
    PyMem_Free(nodes);
    Py_DECREF(seq);
    return rc;
}

static int model_ready(ModelObject *self)
{
    if (self->model == NULL) {
        sg_raise_code(SG_ESTATE, "Model was not initialised");
        return -1;
    }
    if (self->busy) {
        sg_raise_code(SG_ESTATE, "Model is in use by another thread");
        return -1;
    }
    return 0;
}

static PyObject *view(ModelObject *self, float *data, size_t n)
{
    npy_intp dims[1] = {(npy_intp)n};
    PyObject *arr = PyArray_SimpleNewFromData(1, dims, NPY_FLOAT32, data);
    if (arr == NULL)
        return NULL;
    Py_INCREF(self);
    if (PyArray_SetBaseObject((PyArrayObject *)arr, (PyObject *)self) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

static PyObject *model_get_params(ModelObject *self, void *closure)
{
    (void)closure;
    return model_ready(self) < 0
               ? NULL
               : view(self, model_params(self->model), model_num_params(self->model));
}

static PyObject *model_get_grads(ModelObject *self, void *closure)
{
    (void)closure;
    return model_ready(self) < 0
               ? NULL
               : view(self, model_grads(self->model), model_num_params(self->model));
}

static PyObject *model_get_state(ModelObject *self, void *closure)
{
    (void)closure;
    return model_ready(self) < 0
               ? NULL
               : view(self, model_state(self->model), model_num_state(self->model));
}

/* [row(m, 0), ..., row(m, n - 1)]; NULL with the exception set when a row
 * is NULL. */
static PyObject *list_of_rows(const Model *m, int n, PyObject *(*row)(const Model *m, int i))
{
    PyObject *out = PyList_New(n);
    for (int i = 0; out && i < n; i++) {
        PyObject *r = row(m, i);
        if (r == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, r);
    }
    return out;
}

/* A size table's row (layer, is_bias, offset, size, shape, name). */
static PyObject *size_row(const ParamInfo *p)
{
    PyObject *shape = PyTuple_New(p->ndim);
    for (int d = 0; shape && d < p->ndim; d++)
        PyTuple_SET_ITEM(shape, d, PyLong_FromLong(p->shape[d]));
    return shape ? Py_BuildValue("(iinnNs)", p->layer, p->is_bias, (Py_ssize_t)p->offset,
                                 (Py_ssize_t)p->size, shape, p->name)
                 : NULL;
}

static PyObject *param_row(const Model *m, int i)
{
    return size_row(model_param_info(m, i));
}

static PyObject *state_row(const Model *m, int i)
{
    return size_row(model_state_info(m, i));
}

static PyObject *model_param_table(ModelObject *self, PyObject *noargs)
{
    (void)noargs;
    if (model_ready(self) < 0)
        return NULL;
    return list_of_rows(self->model, model_num_tensors(self->model), param_row);
}

static PyObject *model_state_table(ModelObject *self, PyObject *noargs)
{
    (void)noargs;
    if (model_ready(self) < 0)
        return NULL;
    return list_of_rows(self->model, model_num_state_tensors(self->model), state_row);
}

/* (offset, rows, dim, ids) of Embedding table i: the rows the last backward
 * touched (int32, sorted, unique; a copy). */
static PyObject *touched_row(const Model *m, int i)
{
    const OptimRows *t;
    model_touched_rows(m, &t);
    npy_intp dims[1] = {(npy_intp)t[i].nids};
    PyObject *ids = PyArray_SimpleNew(1, dims, NPY_INT32);
    if (ids != NULL && t[i].nids > 0)
        memcpy(PyArray_DATA((PyArrayObject *)ids), t[i].ids, t[i].nids * sizeof(int32_t));
    return ids ? Py_BuildValue("(nnnN)", (Py_ssize_t)t[i].off, (Py_ssize_t)t[i].rows,
                               (Py_ssize_t)t[i].dim, ids)
               : NULL;
}

static PyObject *model_touched_rows_py(ModelObject *self, PyObject *noargs)
{
    (void)noargs;
    if (model_ready(self) < 0)
        return NULL;
    const OptimRows *t;
    return list_of_rows(self->model, model_touched_rows(self->model, &t), touched_row);
}

static PyObject *shape_row(const Model *m, int i)
{
    const LayerShape *s = model_layer_shape(m, i);
    return Py_BuildValue("((iii)(iii)(iiii))", s->h, s->w, s->c, s->oh, s->ow, s->oc, s->pt, s->pl,
                         s->pb, s->pr);
}

static PyObject *model_layer_shapes(ModelObject *self, PyObject *noargs)
{
    (void)noargs;
    if (model_ready(self) < 0)
        return NULL;
    return list_of_rows(self->model, model_num_layers(self->model), shape_row);
}

static PyObject *model_init_params_py(ModelObject *self, PyObject *args)
{
    unsigned long long seed;
    if (!PyArg_ParseTuple(args, "K:init_params", &seed) || model_ready(self) < 0)
        return NULL;
    model_init_params(self->model, seed);
    Py_RETURN_NONE;
}

static PyObject *model_get_rng_py(ModelObject *self, PyObject *noargs)
{
    (void)noargs;
    if (model_ready(self) < 0)
        return NULL;
    uint64_t seed, counter;
    model_get_rng(self->model, &seed, &counter);
    return Py_BuildValue("(KK)", (unsigned long long)seed, (unsigned long long)counter);
}

static PyObject *model_set_rng_py(ModelObject *self, PyObject *args)
{
    unsigned long long seed, counter;
    if (!PyArg_ParseTuple(args, "KK:set_rng", &seed, &counter) || model_ready(self) < 0)
        return NULL;
    model_set_rng(self->model, seed, counter);
    Py_RETURN_NONE;
}

static PyObject *model_shuffle_py(ModelObject *self, PyObject *args)
{
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "n:shuffle", &n) || model_ready(self) < 0)
        return NULL;
    if (n < 0)
        return sg_raise_code(SG_EINVAL, "shuffle: n must be >= 0");
    npy_intp dims[1] = {n};
    PyObject *arr = PyArray_SimpleNew(1, dims, NPY_INT64);
    if (arr == NULL)
        return NULL;
    model_shuffle(self->model, (int64_t *)PyArray_DATA((PyArrayObject *)arr), (size_t)n);
    return arr;
}

static const char *precision_name(NnPrecision p)
{
    return p == NN_BF16 ? "bf16" : "fp32";
}

static PyObject *model_set_precision_py(ModelObject *self, PyObject *args)
{
    const char *name;
    if (!PyArg_ParseTuple(args, "s:set_precision", &name) || model_ready(self) < 0)
        return NULL;
    NnPrecision want;
    if (strcmp(name, "fp32") == 0)
        want = NN_FP32;
    else if (strcmp(name, "bf16") == 0)
        want = NN_BF16;
    else
        return sg_raise_code(SG_EINVAL, "precision must be 'fp32' or 'bf16', not '%s'", name);
    return PyUnicode_FromString(precision_name(model_set_precision(self->model, want)));
}

static PyObject *model_bf16_layers_py(ModelObject *self, PyObject *args)
{
    int batch, count = 0;
    if (!PyArg_ParseTuple(args, "i:bf16_layers", &batch) || model_ready(self) < 0)
        return NULL;
    SgError err = {0};
    if (model_bf16_layers(self->model, batch, &count, &err) < 0)
        return sg_raise(&err);
    return PyLong_FromLong(count);
}

static PyObject *model_get_precision(ModelObject *self, void *closure)
{
    (void)closure;
    return model_ready(self) < 0
               ? NULL
               : PyUnicode_FromString(precision_name(model_precision(self->model)));
}

/* A contiguous float32 array of n values (n == (size_t)-1: any) or None. */
static int optional_floats(PyObject *o, const char *name, size_t n, const float **out)
{
    *out = NULL;
    if (o == Py_None)
        return 0;
    if (!PyArray_Check(o) || PyArray_TYPE((PyArrayObject *)o) != NPY_FLOAT32 ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)o) ||
        (size_t)PyArray_SIZE((PyArrayObject *)o) != n)
        return sg_raise_code(SG_EINVAL,
                             "%s must be None or a contiguous float32 array of %zu values", name,
                             n),
               -1;
    *out = PyArray_DATA((PyArrayObject *)o);
    return 0;
}

/* The arrays of x (one array, or a list or tuple of them): *out holds n
 * new references to sequence items or x itself. */
static PyObject *as_list(PyObject *o)
{
    if (PyList_Check(o) || PyTuple_Check(o))
        return PySequence_Fast(o, "");
    return PyTuple_Pack(1, o);
}

/* Input i's raw column (read by its preprocessing chain) into d; a string
 * column's arrays are held by self->held until the next call. */
static int parse_raw_column(ModelObject *self, NnData *d, int i, PyObject *o)
{
    size_t n;
    PyObject *keep;
    if (nn_py_raw_column(o, nn_prep_in_row(d->preps[i]), &d->inputs[i], &n, &keep) < 0)
        return -1;
    if (keep != NULL) {
        int rc = self->held ? PyList_Append(self->held, keep) : -1;
        Py_DECREF(keep);
        if (rc < 0)
            return -1;
    }
    if (i == 0)
        d->n = n;
    if (n != d->n)
        return sg_raise_code(SG_EINVAL, "x[%d] has %zu rows, x[0] %zu", i, n, d->n), -1;
    return 0;
}

/* Fills d from x (an array, or one per input; an input with a
 * preprocessing chain in preps takes its raw column), y (None, an array, or one per
 * output: int32/int64 labels or float32 targets), the sample weights and the
 * input transform of input 0 (scale NaN, mean and std None: none). The arrays
 * are used in place: the caller keeps them alive. */
static int parse_data(ModelObject *self, NnData *d, PyObject *xo, PyObject *yo, double scale,
                      PyObject *meano, PyObject *stdo, PyObject *wo, PyObject *prepso)
{
    Model *m = self->model;
    memset(d, 0, sizeof *d);
    PyObject *xs = as_list(xo);
    if (xs == NULL)
        return -1;
    const Py_ssize_t nx = PySequence_Fast_GET_SIZE(xs);
    int rc = -1;
    if (nx != model_num_inputs(m)) {
        sg_raise_code(SG_EINVAL, "x has %zd arrays, the model has %d inputs", nx,
                      model_num_inputs(m));
        goto done;
    }
    d->ninputs = (int)nx;
    Py_CLEAR(self->held);
    if ((self->held = PyList_New(0)) == NULL || nn_py_prep_list(prepso, d->ninputs, d->preps) < 0)
        goto done;
    for (int i = 0; i < d->ninputs; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(xs, i);
        if (d->preps[i] != NULL) {
            if (parse_raw_column(self, d, i, o) < 0)
                goto done;
            continue;
        }
        if (!PyArray_Check(o)) {
            sg_raise_code(SG_EINVAL, "x[%d] must be a NumPy array, not %s", i, Py_TYPE(o)->tp_name);
            goto done;
        }
        PyArrayObject *x = (PyArrayObject *)o;
        int xt = PyArray_TYPE(x);
        if ((xt != NPY_FLOAT32 && xt != NPY_UINT8 && xt != NPY_INT32 && xt != NPY_INT64) ||
            !PyArray_IS_C_CONTIGUOUS(x) || PyArray_NDIM(x) < 1) {
            sg_raise_code(SG_EINVAL,
                          "x[%d] must be a C-contiguous float32, uint8, int32 or int64 array with "
                          "a batch dimension, not %s%s",
                          i, PyArray_DESCR(x)->typeobj->tp_name,
                          PyArray_IS_C_CONTIGUOUS(x) ? "" : " (not contiguous)");
            goto done;
        }
        const size_t n = (size_t)PyArray_DIM(x, 0), row = model_input_row(m, i);
        if (i == 0)
            d->n = n;
        if (n != d->n) {
            sg_raise_code(SG_EINVAL, "x[%d] has %zu rows, x[0] %zu", i, n, d->n);
            goto done;
        }
        if ((size_t)PyArray_SIZE(x) != n * row) {
            sg_raise_code(SG_EINVAL,
                          "x[%d] has %zd values for %zu rows; the model takes %zu per row", i,
                          PyArray_SIZE(x), n, row);
            goto done;
        }
        d->inputs[i] = (NnArray){xt == NPY_FLOAT32 ? NN_F32
                                 : xt == NPY_UINT8 ? NN_U8
                                 : xt == NPY_INT32 ? NN_I32
                                                   : NN_I64,
                                 PyArray_DATA(x), row};
    }
    NnTransform *tf = &d->transforms[0];
    if (optional_floats(meano, "input mean", d->inputs[0].row, &tf->mean) < 0 ||
        optional_floats(stdo, "input std", d->inputs[0].row, &tf->std) < 0)
        goto done;
    tf->on = !isnan(scale) || tf->mean || tf->std;
    tf->scale = isnan(scale) ? 1.0f : (float)scale;
    for (int i = 1; i < d->ninputs; i++)
        d->transforms[i].scale = 1.0f;
    if (yo != Py_None) {
        PyObject *ys = as_list(yo);
        if (ys == NULL)
            goto done;
        const Py_ssize_t ny = PySequence_Fast_GET_SIZE(ys);
        if (ny != model_num_outputs(m)) {
            sg_raise_code(SG_EINVAL, "y has %zd arrays, the model has %d outputs", ny,
                          model_num_outputs(m));
            Py_DECREF(ys);
            goto done;
        }
        d->ntargets = (int)ny;
        for (int j = 0; j < d->ntargets; j++) {
            PyObject *o = PySequence_Fast_GET_ITEM(ys, j);
            PyArrayObject *y = (PyArrayObject *)o;
            int yt = PyArray_Check(o) ? PyArray_TYPE(y) : -1;
            size_t k = (size_t)model_output_width(m, j);
            size_t row = yt == NPY_FLOAT32 ? k : 1;
            if ((yt != NPY_INT32 && yt != NPY_INT64 && yt != NPY_FLOAT32) ||
                !PyArray_IS_C_CONTIGUOUS(y) || (size_t)PyArray_SIZE(y) != d->n * row) {
                sg_raise_code(SG_EINVAL,
                              "y[%d] must be contiguous int32 or int64 labels [%zu] or float32 "
                              "targets [%zu, %zu]",
                              j, d->n, d->n, k);
                Py_DECREF(ys);
                goto done;
            }
            d->targets[j] = (NnArray){yt == NPY_INT32   ? NN_I32
                                      : yt == NPY_INT64 ? NN_I64
                                                        : NN_F32,
                                      PyArray_DATA(y), row};
        }
        Py_DECREF(ys);
    }
    rc = optional_floats(wo, "sample weights", d->n, &d->weights);
done:
    Py_DECREF(xs);
    return rc;
}

/* Doubles of the state array Python keeps: the metrics' state, then with
 * several outputs each output's loss sum (they add up as the metrics do). */
static size_t state_size(const Model *m)
{
    return model_metric_state_size(m) + (model_num_outputs(m) > 1 ? model_num_outputs(m) : 0);
}

/* Adds the run's per-output losses into the state's tail (see state_size). */
static void add_output_losses(const Model *m, const NnStats *st)
{
    if (st->metrics == NULL || model_num_outputs(m) < 2)
        return;
    double *tail = st->metrics + model_metric_state_size(m);
    for (int j = 0; j < model_num_outputs(m); j++)
        tail[j] += st->output_loss[j];
}

/* The metrics' state array st->metrics points into: None, or a contiguous
 * float64 array of model_metric_state_size doubles, added to in place. */
static int metric_state(ModelObject *self, PyObject *o, NnStats *st)
{
    st->metrics = NULL;
    if (o == Py_None)
        return 0;
    size_t n = state_size(self->model);
    if (!PyArray_Check(o) || PyArray_TYPE((PyArrayObject *)o) != NPY_FLOAT64 ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)o) || !PyArray_ISWRITEABLE((PyArrayObject *)o) ||
        (size_t)PyArray_SIZE((PyArrayObject *)o) != n)
        return sg_raise_code(SG_EINVAL,
                             "metrics must be None or a writable contiguous float64 array of %zu "
                             "values (the metrics' state, then each output's loss sum)",
                             n),
               -1;
    st->metrics = PyArray_DATA((PyArrayObject *)o);
    return 0;
}

static PyObject *stats_tuple(const NnStats *st)
{
    return Py_BuildValue("(dLL)", st->loss_sum, (long long)st->seen, (long long)st->steps);
}

/* What a hook capsule points to: the hook first, so the capsule's pointer is
 * an NnGradHook * to its readers, then how to release its context. */
typedef struct HookBox {
    NnGradHook hook;
    void (*release)(void *ctx);
} HookBox;

static void hook_box_free(PyObject *cap)
{
    HookBox *box = PyCapsule_GetPointer(cap, NN_GRAD_HOOK_CAPSULE);
    PyObject *owner = PyCapsule_GetContext(cap);
    if (box != NULL && box->release != NULL) {
        Py_BEGIN_ALLOW_THREADS
        box->release(box->hook.ctx);
        Py_END_ALLOW_THREADS
    }
    PyMem_Free(box);
    Py_XDECREF(owner);
}

PyObject *nn_grad_hook_capsule(PyObject *owner, const NnGradHook *hook, void (*release)(void *ctx))
{
    HookBox *box = PyMem_Malloc(sizeof *box);
    PyObject *cap = box != NULL ? PyCapsule_New(box, NN_GRAD_HOOK_CAPSULE, hook_box_free) : NULL;
    if (cap == NULL) {
        PyMem_Free(box);
        if (release != NULL)
            release(hook->ctx);
        return box == NULL ? PyErr_NoMemory() : NULL;
    }
    box->hook = *hook;
    box->release = release;
    Py_INCREF(owner);
    if (PyCapsule_SetContext(cap, owner) < 0) {
        Py_DECREF(owner);
        Py_DECREF(cap); /* releases the hook */
        return NULL;
    }
    return cap;
}

/* The NnGradHook of a capsule named NN_GRAD_HOOK_CAPSULE (nn/nn_hook.h). */
static const NnGradHook *hook_from_capsule(PyObject *o)
{
    if (!PyCapsule_IsValid(o, NN_GRAD_HOOK_CAPSULE)) {
        sg_raise_code(SG_EINVAL,
                      "hook must be a capsule named %s (from grad_hook() of a PsClient or a "
                      "Communicator), not %s",
                      NN_GRAD_HOOK_CAPSULE, Py_TYPE(o)->tp_name);
        return NULL;
    }
    const NnGradHook *h = PyCapsule_GetPointer(o, NN_GRAD_HOOK_CAPSULE);
    if (h != NULL && h->step == NULL) {
        sg_raise_code(SG_EINVAL, "gradient hook has no step function");
        return NULL;
    }
    return h;
}

static PyObject *model_train_steps(ModelObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"opt",     "x",       "y",     "order", "start", "batch",
                             "nsteps",  "hook",    "step",  "scale", "mean",  "std",
                             "weights", "metrics", "preps", NULL};
    PyObject *opto, *xo, *yo, *ordo, *hooko = Py_None, *meano = Py_None, *stdo = Py_None;
    PyObject *wo = Py_None, *mo = Py_None, *prepso = Py_None;
    Py_ssize_t start;
    int batch;
    long long nsteps, step = 0;
    double scale = NAN;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOniL|$OLdOOOOO:train_steps", kwlist, &opto, &xo,
                                     &yo, &ordo, &start, &batch, &nsteps, &hooko, &step, &scale,
                                     &meano, &stdo, &wo, &mo, &prepso) ||
        model_ready(self) < 0)
        return NULL;
    Optimizer *opt = NULL;
    if (opto != Py_None) {
        if (!PyObject_TypeCheck(opto, &OptimizerType))
            return sg_raise_code(SG_EINVAL,
                                 "optimizer must be a sparkgrad._core.Optimizer or None");
        opt = ((OptimizerObject *)opto)->opt;
        if (((OptimizerObject *)opto)->n != model_num_params(self->model))
            return sg_raise_code(SG_EINVAL, "optimizer is for %zu parameters, the model has %zu",
                                 ((OptimizerObject *)opto)->n, model_num_params(self->model));
    }
    const NnGradHook *hook = NULL;
    if (hooko != Py_None && (hook = hook_from_capsule(hooko)) == NULL)
        return NULL;
    NnData d;
    NnStats st = {0};
    if (parse_data(self, &d, xo, yo, scale, meano, stdo, wo, prepso) < 0 ||
        metric_state(self, mo, &st) < 0)
        return NULL;
    if (d.ntargets == 0)
        return sg_raise_code(SG_EINVAL, "train_steps needs targets (y)");
    const int64_t *order = NULL;
    if (ordo != Py_None) {
        if (!PyArray_Check(ordo) || PyArray_TYPE((PyArrayObject *)ordo) != NPY_INT64 ||
            !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)ordo) ||
            (size_t)PyArray_SIZE((PyArrayObject *)ordo) != d.n)
            return sg_raise_code(SG_EINVAL, "order must be a contiguous int64 array of %zu rows",
                                 d.n);
        order = PyArray_DATA((PyArrayObject *)ordo);
    }
    if (start < 0)
        return sg_raise_code(SG_EINVAL, "start must be >= 0");
    SgError err = {0};
    int64_t gstep = (int64_t)step;
    int rc;
    /* the capsule (and through it the hook's owner) stays alive for the call */
    Py_XINCREF(hook ? hooko : NULL);
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = model_fit_steps(self->model, opt, &d, order, (size_t)start, batch, nsteps, hook, &gstep,
                         &st, &err);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    Py_CLEAR(self->held);
    Py_XDECREF(hook ? hooko : NULL);
    add_output_losses(self->model, &st);
    if (rc < 0 && err.code != SG_ENOMEM) {
        /* the steps before the failing one were applied: say how far the run got */
        PyObject *details =
            Py_BuildValue("{s:L,s:L,s:L,s:d}", "step", (long long)gstep, "steps",
                          (long long)st.steps, "seen", (long long)st.seen, "loss_sum", st.loss_sum);
        if (details == NULL)
            return NULL;
        sg_raise_details(&err, details);
        Py_DECREF(details);
        return NULL;
    }
    if (rc < 0)
        return sg_raise(&err);
    return Py_BuildValue("(dLLL)", st.loss_sum, (long long)st.seen, (long long)st.steps,
                         (long long)gstep);
}

static PyObject *model_evaluate_py(ModelObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x",   "y",       "batch",   "scale", "mean",
                             "std", "weights", "metrics", "preps", NULL};
    PyObject *xo, *yo, *meano = Py_None, *stdo = Py_None, *wo = Py_None, *mo = Py_None;
    PyObject *prepso = Py_None;
    int batch;
    double scale = NAN;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOi|$dOOOOO:evaluate", kwlist, &xo, &yo, &batch,
                                     &scale, &meano, &stdo, &wo, &mo, &prepso) ||
        model_ready(self) < 0)
        return NULL;
    NnData d;
    NnStats st = {0};
    if (parse_data(self, &d, xo, yo, scale, meano, stdo, wo, prepso) < 0 ||
        metric_state(self, mo, &st) < 0)
        return NULL;
    if (d.ntargets == 0)
        return sg_raise_code(SG_EINVAL, "evaluate needs targets (y)");
    SgError err = {0};
    int rc;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = model_evaluate(self->model, &d, batch, &st, &err);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    Py_CLEAR(self->held);
    add_output_losses(self->model, &st);
    if (rc < 0)
        return sg_raise(&err);
    return stats_tuple(&st);
}

static PyObject *model_predict_py(ModelObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "batch", "scale", "mean", "std", "preps", NULL};
    PyObject *xo, *meano = Py_None, *stdo = Py_None, *prepso = Py_None;
    int batch;
    double scale = NAN;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oi|$dOOO:predict", kwlist, &xo, &batch, &scale,
                                     &meano, &stdo, &prepso) ||
        model_ready(self) < 0)
        return NULL;
    NnData d;
    if (parse_data(self, &d, xo, Py_None, scale, meano, stdo, Py_None, prepso) < 0)
        return NULL;
    const int nout = model_num_outputs(self->model);
    float *dst[NN_MAX_IO];
    PyObject *outs = PyList_New(nout);
    for (int j = 0; outs != NULL && j < nout; j++) {
        npy_intp dims[2] = {(npy_intp)d.n, model_output_width(self->model, j)};
        PyObject *o = PyArray_SimpleNew(2, dims, NPY_FLOAT32);
        if (o == NULL) {
            Py_CLEAR(outs);
            break;
        }
        PyList_SET_ITEM(outs, j, o);
        dst[j] = PyArray_DATA((PyArrayObject *)o);
    }
    if (outs == NULL)
        return NULL;
    SgError err = {0};
    int rc;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = model_predict(self->model, &d, batch, dst, &err);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    Py_CLEAR(self->held);
    if (rc < 0) {
        Py_DECREF(outs);
        return sg_raise(&err);
    }
    if (nout > 1)
        return outs;
    PyObject *one = PyList_GET_ITEM(outs, 0);
    Py_INCREF(one);
    Py_DECREF(outs);
    return one;
}

static PyObject *model_set_loss_py(ModelObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"kind",   "from_logits", "label_smoothing", "delta", "output",
                             "weight", NULL};
    int kind, from_logits = 0, output = 0;
    float smoothing = 0.0f, delta = 1.0f, weight = 1.0f;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "i|$pffif:set_loss", kwlist, &kind, &from_logits,
                                     &smoothing, &delta, &output, &weight) ||
        model_ready(self) < 0)
        return NULL;
    if (kind < 0 || kind >= NN_LOSS_COUNT)
        return sg_raise_code(SG_EINVAL, "set_loss: unknown loss kind %d", kind);
    NnLoss loss = {(NnLossKind)kind, from_logits, smoothing, delta};
    SgError err = {0};
    if (model_set_output_loss(self->model, output, &loss, weight, &err) < 0)
        return sg_raise(&err);
    Py_RETURN_NONE;
}

/* The NnMetric array of a sequence of (kind, threshold, num_thresholds,
 * pr_curve, from_logits) tuples, PyMem_Malloc'ed into *out; -1 with an
 * exception set. */
static int parse_metrics(PyObject *list, NnMetric **out, int *count)
{
    PyObject *seq = PySequence_Fast(list, "metrics must be a sequence of tuples");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    NnMetric *ms = PyMem_Calloc(n ? (size_t)n : 1, sizeof *ms);
    int rc = -1;
    if (ms == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int kind;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "ifipp", &kind, &ms[i].threshold,
                              &ms[i].num_thresholds, &ms[i].pr_curve, &ms[i].from_logits)) {
            sg_raise_code(SG_EINVAL,
                          "metric %zd must be (kind, threshold, num_thresholds, pr_curve, "
                          "from_logits)",
                          i);
            goto done;
        }
        if (nn_metric_ops((NnMetricKind)kind) == NULL) {
            sg_raise_code(SG_EINVAL, "metric %zd: unknown kind %d", i, kind);
            goto done;
        }
        ms[i].kind = (NnMetricKind)kind;
    }
    *out = ms;
    *count = (int)n;
    ms = NULL;
    rc = 0;
done:
    PyMem_Free(ms);
    Py_DECREF(seq);
    return rc;
}

static PyObject *model_set_metrics_py(ModelObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"metrics", "output", NULL};
    PyObject *list;
    NnMetric *ms;
    int n, output = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$i:set_metrics", kwlist, &list, &output) ||
        model_ready(self) < 0 || parse_metrics(list, &ms, &n) < 0)
        return NULL;
    SgError err = {0};
    int rc = model_set_output_metrics(self->model, output, ms, n, &err);
    PyMem_Free(ms);
    if (rc < 0)
        return sg_raise(&err);
    Py_RETURN_NONE;
}

static PyObject *model_get_metric_state_size(ModelObject *self, void *closure)
{
    (void)closure;
    return model_ready(self) < 0 ? NULL : PyLong_FromSize_t(state_size(self->model));
}

static const char *head_name(NnAct h)
{
    return h == NN_ACT_SOFTMAX ? "softmax" : h == NN_ACT_SIGMOID ? "sigmoid" : "linear";
}

static PyObject *output_row(const Model *m, int j)
{
    return Py_BuildValue("(iis)", model_output_tensor(m, j), model_output_width(m, j),
                         head_name(model_output_head(m, j)));
}

static PyObject *model_get_outputs(ModelObject *self, void *closure)
{
    (void)closure;
    if (model_ready(self) < 0)
        return NULL;
    return list_of_rows(self->model, model_num_outputs(self->model), output_row);
}

static PyObject *model_get_head(ModelObject *self, void *closure)
{
    (void)closure;
    if (model_ready(self) < 0)
        return NULL;
    return PyUnicode_FromString(head_name(model_head(self->model)));
}

static PyObject *model_get_classes(ModelObject *self, void *closure)
{
    (void)closure;
    return model_ready(self) < 0 ? NULL : PyLong_FromLong(model_num_classes(self->model));
}

static PyMethodDef model_methods[] = {
    {"param_table", (PyCFunction)model_param_table, METH_NOARGS,
     "param_table() -> [(layer, is_bias, offset, size, shape, name)]: the parameters' size "
     "table."},
    {"state_table", (PyCFunction)model_state_table, METH_NOARGS,
     "state_table() -> [(layer, is_bias, offset, size, shape, name)]: the state buffer's size "
     "table (BatchNormalization's moving statistics)."},
    {"touched_rows", (PyCFunction)model_touched_rows_py, METH_NOARGS,
     "touched_rows() -> [(offset, rows, dim, ids)]: per Embedding table, the rows (int32, sorted, "
     "unique) the last backward pass touched."},
    {"layer_shapes", (PyCFunction)model_layer_shapes, METH_NOARGS,
     "layer_shapes() -> [((h,w,c), (oh,ow,oc), (pt,pl,pb,pr))]."},
    {"init_params", (PyCFunction)model_init_params_py, METH_VARARGS,
     "init_params(seed): fill the parameters from the seeded initialisers."},
    {"get_rng", (PyCFunction)model_get_rng_py, METH_NOARGS, "get_rng() -> (seed, counter)."},
    {"set_rng", (PyCFunction)model_set_rng_py, METH_VARARGS, "set_rng(seed, counter)."},
    {"shuffle", (PyCFunction)model_shuffle_py, METH_VARARGS,
     "shuffle(n) -> int64 permutation drawn from the model RNG."},
    {"set_precision", (PyCFunction)model_set_precision_py, METH_VARARGS,
     "set_precision('fp32'|'bf16') -> the precision in use ('fp32' where the CPU has no bf16)."},
    {"bf16_layers", (PyCFunction)model_bf16_layers_py, METH_VARARGS,
     "bf16_layers(batch) -> Dense/Conv2D layers running bf16 primitives at that batch size."},
    {"train_steps", (PyCFunction)(void (*)(void))model_train_steps, METH_VARARGS | METH_KEYWORDS,
     "train_steps(opt|None, x, y, order|None, start, batch, nsteps, *, hook=None, step=0, "
     "scale=nan, mean=None, std=None, weights=None, metrics=None) -> (loss_sum, seen, steps, step "
     "after); x: float32, uint8, int32 or int64 rows, or a list of them (one per input); y: per "
     "output int32 or "
     "int64 labels or float32 targets [n, K] (an array, or a list with several outputs); weights "
     "float32 [n]; metrics: the float64 state array the metrics (then, with several outputs, "
     "each output's loss sum) add to; hook: a sparkgrad._core.NnGradHook capsule; GIL released."},
    {"evaluate", (PyCFunction)(void (*)(void))model_evaluate_py, METH_VARARGS | METH_KEYWORDS,
     "evaluate(x, y, batch, *, scale=nan, mean=None, std=None, weights=None, metrics=None) -> "
     "(loss_sum, seen, steps)."},
    {"set_loss", (PyCFunction)(void (*)(void))model_set_loss_py, METH_VARARGS | METH_KEYWORDS,
     "set_loss(kind, *, from_logits=False, label_smoothing=0.0, delta=1.0, output=0, weight=1.0): "
     "kind indexes LOSS_NAMES; checked against the output's head and width (ModelError)."},
    {"set_metrics", (PyCFunction)(void (*)(void))model_set_metrics_py, METH_VARARGS | METH_KEYWORDS,
     "set_metrics([(kind, threshold, num_thresholds, pr_curve, from_logits), ...], *, output=0): "
     "kind indexes METRIC_NAMES."},
    {"predict", (PyCFunction)(void (*)(void))model_predict_py, METH_VARARGS | METH_KEYWORDS,
     "predict(x, batch, *, scale=nan, mean=None, std=None) -> float32 [n, K], or a list of them "
     "with several outputs."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef model_getset[] = {
    {"params", (getter)model_get_params, NULL, "flat parameter buffer (float32 view)", NULL},
    {"grads", (getter)model_get_grads, NULL, "flat gradient buffer (float32 view)", NULL},
    {"state", (getter)model_get_state, NULL,
     "flat non-trainable state buffer (float32 view): moving statistics, updated by training",
     NULL},
    {"classes", (getter)model_get_classes, NULL, "output 0's width K", NULL},
    {"outputs", (getter)model_get_outputs, NULL, "[(tensor, width, head)] per output", NULL},
    {"head", (getter)model_get_head, NULL,
     "'softmax', 'sigmoid' (a last Dense layer's activation, applied by the loss) or 'linear'",
     NULL},
    {"metric_state_size", (getter)model_get_metric_state_size, NULL,
     "doubles in the state array: the metrics', then with several outputs their loss sums", NULL},
    {"precision", (getter)model_get_precision, NULL, "'fp32' or 'bf16': the precision in use",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ModelType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sparkgrad._core.Model",
    .tp_basicsize = sizeof(ModelObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Model(inputs, layers, outputs=None): a network of layers on oneDNN. inputs: "
              "[(h, w, c)]; layers: dicts {kind, inputs, units, kernel_size, strides, padding, "
              "activation, rate, initializer, target_shape, shares, epsilon, momentum, center, "
              "scale, normalize, input_dim, mask_zero} in topological order (inputs: tensor "
              "ids, 0.. the model's inputs then each layer's output; default the previous); "
              "outputs: tensor ids (None: the last layer's).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)model_init,
    .tp_dealloc = (destructor)model_dealloc,
    .tp_methods = model_methods,
    .tp_getset = model_getset,
};

static PyObject *py_set_num_threads(PyObject *self, PyObject *args)
{
    (void)self;
    int n;
    if (!PyArg_ParseTuple(args, "i:set_num_threads", &n))
        return NULL;
    if (n <= 0)
        return sg_raise_code(SG_EINVAL, "set_num_threads: n must be > 0, not %d", n);
    nn_set_num_threads(n);
    Py_RETURN_NONE;
}

static PyObject *py_get_num_threads(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return PyLong_FromLong(nn_get_num_threads());
}

static PyObject *py_bf16_supported(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return PyBool_FromLong(nn_bf16_supported());
}

static PyObject *py_metric_results(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *list, *so;
    NnMetric *ms;
    int n;
    if (!PyArg_ParseTuple(args, "OO:metric_results", &list, &so) ||
        parse_metrics(list, &ms, &n) < 0)
        return NULL;
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += nn_metric_state_size(&ms[i]);
    PyObject *out = NULL;
    if (!PyArray_Check(so) || PyArray_TYPE((PyArrayObject *)so) != NPY_FLOAT64 ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)so) ||
        (size_t)PyArray_SIZE((PyArrayObject *)so) != total) {
        sg_raise_code(SG_EINVAL,
                      "state must be a contiguous float64 array of %zu values (the metrics' state)",
                      total);
        goto done;
    }
    const double *state = PyArray_DATA((PyArrayObject *)so);
    if ((out = PyList_New(n)) == NULL)
        goto done;
    for (int i = 0; i < n; i++) {
        PyObject *v = PyFloat_FromDouble(nn_metric_result(&ms[i], state));
        if (v == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, v);
        state += nn_metric_state_size(&ms[i]);
    }
done:
    PyMem_Free(ms);
    return out;
}

static PyObject *py_metric_state_size(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *list;
    NnMetric *ms;
    int n;
    if (!PyArg_ParseTuple(args, "O:metric_state_size", &list) || parse_metrics(list, &ms, &n) < 0)
        return NULL;
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += nn_metric_state_size(&ms[i]);
    PyMem_Free(ms);
    return PyLong_FromSize_t(total);
}

static PyMethodDef nn_functions[] = {
    {"metric_state_size", py_metric_state_size, METH_VARARGS,
     "metric_state_size([(kind, threshold, num_thresholds, pr_curve, from_logits), ...]) -> the "
     "doubles of their state."},
    {"metric_results", py_metric_results, METH_VARARGS,
     "metric_results([(kind, threshold, num_thresholds, pr_curve, from_logits), ...], state) -> "
     "[value per metric] from a (summed) float64 state array."},

    {"bf16_supported", py_bf16_supported, METH_NOARGS,
     "bf16_supported() -> True if oneDNN computes bf16 natively on this CPU (AVX512_BF16/AMX)."},
    {"set_num_threads", py_set_num_threads, METH_VARARGS,
     "set_num_threads(n): OpenMP threads for oneDNN and the C loops (of the calling thread)."},
    {"get_num_threads", py_get_num_threads, METH_NOARGS, "get_num_threads() -> int."},
    {NULL, NULL, 0, NULL},
};

/* A tuple of the table's names, in kind order. */
static PyObject *names_tuple(int n, const char *(*name)(int))
{
    PyObject *t = PyTuple_New(n);
    for (int i = 0; t != NULL && i < n; i++) {
        PyObject *v = PyUnicode_FromString(name(i));
        if (v == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

static const char *loss_name(int i)
{
    return nn_loss_ops((NnLossKind)i)->name;
}

static const char *metric_name(int i)
{
    return nn_metric_ops((NnMetricKind)i)->name;
}

static const char *layer_kind_name(int i)
{
    return nn_layer_kind_name((LayerKind)i);
}

int nn_module_init(PyObject *mod)
{
    if (PyModule_AddType(mod, &ModelType) < 0)
        return -1;
    PyObject *losses = names_tuple(NN_LOSS_COUNT, loss_name);
    PyObject *metrics = names_tuple(NN_METRIC_COUNT, metric_name);
    PyObject *kinds = names_tuple(LAYER_KIND_COUNT, layer_kind_name);
    int rc = losses && metrics && kinds && PyModule_AddObjectRef(mod, "LOSS_NAMES", losses) == 0 &&
                     PyModule_AddObjectRef(mod, "METRIC_NAMES", metrics) == 0 &&
                     PyModule_AddObjectRef(mod, "LAYER_KINDS", kinds) == 0
                 ? 0
                 : -1;
    Py_XDECREF(losses);
    Py_XDECREF(metrics);
    Py_XDECREF(kinds);
    if (rc < 0)
        return -1;
    return PyModule_AddFunctions(mod, nn_functions);
}
