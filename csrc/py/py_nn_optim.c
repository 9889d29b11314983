/*
 * py_nn_optim.c - sparkgrad._core.Optimizer: the C optimizers of
 * nn/nn_optim.h over any float32 array (a model's flat buffer, a
 * parameter-server shard). step() releases the GIL.
 */
#include "py/py_nn.h"

#include <limits.h>
#include <string.h>

static void optimizer_dealloc(OptimizerObject *self)
{
    optim_free(self->opt);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static const char *const kind_names[] = {"sgd",      "adam",    "adamw", "rmsprop",
                                         "adadelta", "adagrad", NULL};
static const char *const sched_names[] = {"constant",    "step",      "cosine",
                                          "exponential", "piecewise", NULL};
static const char *const warmup_names[] = {"scale", "ramp", NULL};

static int lookup(const char *const *names, const char *what, const char *v)
{
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], v) == 0)
            return i;
    PyErr_Format(PyExc_ValueError, "unknown %s '%s'", what, v);
    return -1;
}

/* LR_PIECEWISE's boundaries and values from two sequences (None: unused). */
static int parse_pieces(OptimConfig *c, PyObject *boundaries, PyObject *values)
{
    if (boundaries == Py_None && values == Py_None)
        return 0;
    PyObject *b = PySequence_Fast(boundaries, "boundaries must be a sequence of ints");
    PyObject *v = b ? PySequence_Fast(values, "values must be a sequence of floats") : NULL;
    int rc = -1;
    if (v == NULL)
        goto cleanup;
    Py_ssize_t nb = PySequence_Fast_GET_SIZE(b), nv = PySequence_Fast_GET_SIZE(v);
    if (nv < 1 || nv > OPTIM_MAX_PIECES || nb != nv - 1) {
        sg_raise_code(SG_EINVAL,
                      "a piecewise schedule needs 1..%d values and one boundary fewer, got %zd "
                      "boundaries and %zd values",
                      OPTIM_MAX_PIECES, nb, nv);
        goto cleanup;
    }
    for (Py_ssize_t i = 0; i < nb; i++) {
        c->boundaries[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(b, i));
        if (c->boundaries[i] == -1 && PyErr_Occurred())
            goto cleanup;
    }
    for (Py_ssize_t i = 0; i < nv; i++) {
        c->values[i] = (float)PyFloat_AsDouble(PySequence_Fast_GET_ITEM(v, i));
        if (c->values[i] == -1.0f && PyErr_Occurred())
            goto cleanup;
    }
    c->npieces = (int)nv;
    rc = 0;
cleanup:
    Py_XDECREF(b);
    Py_XDECREF(v);
    return rc;
}

/* Declares the tensors of the range (a sequence of sizes; None: one tensor). */
static int set_tensors(Optimizer *opt, PyObject *sizes)
{
    if (sizes == Py_None)
        return 0;
    PyObject *seq = PySequence_Fast(sizes, "tensor_sizes must be a sequence of ints");
    if (seq == NULL)
        return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    size_t *v = PyMem_Malloc((size_t)(count > 0 ? count : 1) * sizeof *v);
    if (v == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    int rc = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < count; i++) {
        v[i] = PyLong_AsSize_t(PySequence_Fast_GET_ITEM(seq, i));
        rc = v[i] == (size_t)-1 && PyErr_Occurred() ? -1 : 0;
    }
    SgError err = {0};
    if (rc == 0 && count > INT_MAX) {
        sg_raise_code(SG_EINVAL, "tensor_sizes: %zd tensors, at most %d", count, INT_MAX);
        rc = -1;
    } else if (rc == 0 && (rc = optim_set_tensors(opt, v, (int)count, &err)) < 0) {
        sg_raise(&err);
    }
    PyMem_Free(v);
    Py_DECREF(seq);
    return rc < 0 ? -1 : 0;
}

static int optimizer_init(OptimizerObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"kind",
                             "n",
                             "lr",
                             "momentum",
                             "nesterov",
                             "weight_decay",
                             "beta1",
                             "beta2",
                             "eps",
                             "rho",
                             "centered",
                             "schedule",
                             "step_size",
                             "gamma",
                             "total_steps",
                             "lr_min",
                             "warmup_steps",
                             "clip_norm",
                             "clip_value",
                             "init_accum",
                             "clip_tensor_norm",
                             "boundaries",
                             "values",
                             "warmup",
                             "warmup_from",
                             "tensor_sizes",
                             NULL};
    const char *kind, *schedule = "constant", *warmup_kind = "scale";
    Py_ssize_t n;
    OptimConfig c;
    optim_config_default(&c, OPTIM_SGD);
    long long step_size = 1, total_steps = 1, warmup = 0;
    int nesterov = 0, centered = 0;
    PyObject *boundaries = Py_None, *values = Py_None, *tensor_sizes = Py_None;
    if (!PyArg_ParseTupleAndKeywords(
            args, kw, "sn|$ffpfffffpsLfLfLffffOOsfO:Optimizer", kwlist, &kind, &n, &c.lr,
            &c.momentum, &nesterov, &c.weight_decay, &c.beta1, &c.beta2, &c.eps, &c.rho, &centered,
            &schedule, &step_size, &c.gamma, &total_steps, &c.lr_min, &warmup, &c.clip_norm,
            &c.clip_value, &c.init_accum, &c.clip_tensor_norm, &boundaries, &values, &warmup_kind,
            &c.warmup_from, &tensor_sizes))
        return -1;
    int k = lookup(kind_names, "optimizer kind", kind);
    int s = k < 0 ? -1 : lookup(sched_names, "schedule", schedule);
    int w = s < 0 ? -1 : lookup(warmup_names, "warm-up", warmup_kind);
    if (k < 0 || s < 0 || w < 0 || parse_pieces(&c, boundaries, values) < 0)
        return -1;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "n must be >= 0");
        return -1;
    }
    c.kind = (OptimKind)k;
    c.schedule = (LrSchedule)s;
    c.nesterov = nesterov;
    c.centered = centered;
    c.step_size = step_size;
    c.total_steps = total_steps;
    c.warmup_steps = warmup;
    c.warmup = (LrWarmup)w;
    SgError err = {0};
    optim_free(self->opt);
    self->opt = NULL;
    if (optim_create(&self->opt, &c, (size_t)n, &err) < 0) {
        sg_raise(&err);
        return -1;
    }
    self->n = (size_t)n;
    return set_tensors(self->opt, tensor_sizes);
}

float *nn_float_array(PyObject *obj, const char *name, size_t n, int writable)
{
    if (!PyArray_Check(obj) || PyArray_TYPE((PyArrayObject *)obj) != NPY_FLOAT32 ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)obj) ||
        (writable && !PyArray_ISWRITEABLE((PyArrayObject *)obj))) {
        PyErr_Format(PyExc_TypeError, "%s must be a %sC-contiguous float32 NumPy array", name,
                     writable ? "writable " : "");
        return NULL;
    }
    if (n != (size_t)-1 && (size_t)PyArray_SIZE((PyArrayObject *)obj) != n) {
        PyErr_Format(PyExc_ValueError, "%s has %zd elements, expected %zu", name,
                     PyArray_SIZE((PyArrayObject *)obj), n);
        return NULL;
    }
    return (float *)PyArray_DATA((PyArrayObject *)obj);
}

/* rows: None, or a sequence of (offset, rows, dim, ids) with ids int32
 * arrays; *tables gets PyMem storage the caller frees, *keep the id arrays
 * it must release. */
static int parse_rows(PyObject *rows, OptimRows **tables, int *count, PyObject **keep)
{
    *tables = NULL;
    *count = 0;
    *keep = NULL;
    if (rows == Py_None)
        return 0;
    PyObject *seq = PySequence_Fast(rows, "rows must be a sequence of (offset, rows, dim, ids)");
    if (seq == NULL)
        return -1;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    *tables = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof **tables);
    *keep = PyList_New(0);
    if (*tables == NULL || *keep == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t off, nrows, dim;
        PyObject *ids;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, k),
                              "nnnO;rows entries are (offset, rows, dim, ids)", &off, &nrows, &dim,
                              &ids)) {
            Py_DECREF(seq);
            return -1;
        }
        PyObject *a = PyArray_FROMANY(ids, NPY_INT32, 1, 1, NPY_ARRAY_IN_ARRAY);
        if (a == NULL || PyList_Append(*keep, a) < 0) {
            Py_XDECREF(a);
            Py_DECREF(seq);
            return -1;
        }
        Py_DECREF(a);
        if (off < 0 || nrows < 0 || dim < 0) {
            Py_DECREF(seq);
            return sg_raise_code(SG_EINVAL, "rows entry %zd: negative offset or size", k), -1;
        }
        (*tables)[k] =
            (OptimRows){(size_t)off, (size_t)nrows, (size_t)dim, PyArray_DATA((PyArrayObject *)a),
                        (size_t)PyArray_SIZE((PyArrayObject *)a)};
    }
    *count = (int)n;
    Py_DECREF(seq);
    return 0;
}

static PyObject *optimizer_step(OptimizerObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"params", "grads", "rows", NULL};
    PyObject *po, *go, *rowso = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O:step", kwlist, &po, &go, &rowso))
        return NULL;
    float *params = nn_float_array(po, "params", self->n, 1);
    if (params == NULL)
        return NULL;
    const float *grads = nn_float_array(go, "grads", self->n, 0);
    if (grads == NULL)
        return NULL;
    if (self->busy)
        return sg_raise_code(SG_ESTATE, "optimizer is in use by another thread");
    OptimRows *tables;
    PyObject *keep;
    int ntables;
    if (parse_rows(rowso, &tables, &ntables, &keep) < 0) {
        PyMem_Free(tables);
        Py_XDECREF(keep);
        return NULL;
    }
    SgError err = {0};
    int rc;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = optim_step_rows(self->opt, params, grads, self->n, tables, ntables, NULL, 0, &err);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    PyMem_Free(tables);
    Py_XDECREF(keep);
    if (rc < 0)
        return sg_raise(&err);
    Py_RETURN_NONE;
}

static PyObject *optimizer_state(OptimizerObject *self, PyObject *noargs)
{
    (void)noargs;
    npy_intp dims[1] = {(npy_intp)optim_state_size(self->opt)};
    PyObject *arr = PyArray_SimpleNewFromData(1, dims, NPY_FLOAT32, optim_state(self->opt));
    if (arr == NULL)
        return NULL;
    Py_INCREF(self);
    if (PyArray_SetBaseObject((PyArrayObject *)arr, (PyObject *)self) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

static PyObject *optimizer_set_state(OptimizerObject *self, PyObject *args)
{
    long long step;
    PyObject *so;
    if (!PyArg_ParseTuple(args, "LO:set_state", &step, &so))
        return NULL;
    const float *state = nn_float_array(so, "state", (size_t)-1, 0);
    if (state == NULL)
        return NULL;
    SgError err = {0};
    if (optim_set_state(self->opt, step, state, (size_t)PyArray_SIZE((PyArrayObject *)so), &err) <
        0)
        return sg_raise(&err);
    Py_RETURN_NONE;
}

static PyObject *optimizer_get_lr(OptimizerObject *self, void *closure)
{
    (void)closure;
    return PyFloat_FromDouble(optim_current_lr(self->opt));
}

static PyObject *optimizer_get_base_lr(OptimizerObject *self, void *closure)
{
    (void)closure;
    return PyFloat_FromDouble(optim_config(self->opt)->lr);
}

static int optimizer_set_base_lr(OptimizerObject *self, PyObject *value, void *closure)
{
    (void)closure;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "base_lr cannot be deleted");
        return -1;
    }
    double lr = PyFloat_AsDouble(value);
    if (lr == -1.0 && PyErr_Occurred())
        return -1;
    SgError err;
    if (optim_set_base_lr(self->opt, (float)lr, &err) < 0) {
        sg_raise(&err);
        return -1;
    }
    return 0;
}

static PyObject *optimizer_get_steps(OptimizerObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromLongLong(optim_get_step(self->opt));
}

static PyObject *optimizer_get_n(OptimizerObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromSize_t(self->n);
}

static PyObject *optimizer_get_sparse_rows(OptimizerObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(optim_sparse_rows(self->opt));
}

static PyObject *optimizer_get_kind(OptimizerObject *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(kind_names[optim_config(self->opt)->kind]);
}

static PyMethodDef optimizer_methods[] = {
    {"step", (PyCFunction)(void (*)(void))optimizer_step, METH_VARARGS | METH_KEYWORDS,
     "step(params, grads, rows=None): one update of params (float32, in place) from grads; rows: "
     "[(offset, rows, dim, ids)] tables whose gradient is zero outside the rows ids (int32, "
     "sorted, unique), updated in those rows alone where the optimizer is sparse ("
     "sparse_rows)."},
    {"state", (PyCFunction)optimizer_state, METH_NOARGS,
     "state() -> float32 array: the optimizer's slots (a view, no copy)."},
    {"set_state", (PyCFunction)optimizer_set_state, METH_VARARGS,
     "set_state(step, state): restore the step counter and the slots."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef optimizer_getset[] = {
    {"lr", (getter)optimizer_get_lr, NULL, "learning rate of the next step", NULL},
    {"base_lr", (getter)optimizer_get_base_lr, (setter)optimizer_set_base_lr,
     "the configured learning rate, before the schedule; settable between steps", NULL},
    {"steps", (getter)optimizer_get_steps, NULL, "steps taken", NULL},
    {"n", (getter)optimizer_get_n, NULL, "number of parameters", NULL},
    {"kind", (getter)optimizer_get_kind, NULL, "optimizer kind", NULL},
    {"sparse_rows", (getter)optimizer_get_sparse_rows, NULL,
     "True if an Embedding table's step updates only its touched rows (SGD, Adagrad, lazy Adam; "
     "no weight decay)",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject OptimizerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sparkgrad._core.Optimizer",
    .tp_basicsize = sizeof(OptimizerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Optimizer(kind, n, *, lr, momentum, nesterov, weight_decay, beta1, beta2, eps, rho, "
              "centered, schedule, step_size, gamma, total_steps, lr_min, warmup_steps, clip_norm, "
              "clip_value, init_accum, clip_tensor_norm, boundaries, values, warmup, warmup_from, "
              "tensor_sizes): a C optimizer over n float32 parameters.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)optimizer_init,
    .tp_dealloc = (destructor)optimizer_dealloc,
    .tp_methods = optimizer_methods,
    .tp_getset = optimizer_getset,
};

int nn_optim_module_init(PyObject *mod)
{
    if (PyModule_AddType(mod, &OptimizerType) < 0)
        return -1;
    return 0;
}
