/*
 * py_nn.c - sparkgrad._core.Model: a sequential network of nn/nn_model.h
 * whose parameter and gradient buffers are exposed as NumPy views (no copy),
 * and whose training, evaluation and prediction loops run with the GIL
 * released. The Keras-like API (sparkgrad.nn) is built on it in Python;
 * set_num_threads/get_num_threads set the OpenMP thread count.
 */
#include "py/py_nn.h"

#include <math.h>
#include <string.h>

typedef struct ModelObject {
    PyObject_HEAD
    Model *model;
    int busy; /* a GIL-released call is running */
} ModelObject;

static void model_dealloc(ModelObject *self)
{
    model_free(self->model);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int model_init(ModelObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"input_shape", "layers", NULL};
    int h, w, c;
    PyObject *layers;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "(iii)O:Model", kwlist, &h, &w, &c, &layers))
        return -1;
    PyObject *seq = PySequence_Fast(layers, "layers must be a sequence of tuples");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    LayerSpec *specs = PyMem_Calloc(n ? (size_t)n : 1, sizeof *specs);
    int rc = -1;
    if (specs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        LayerSpec *s = &specs[i];
        int kind, act, init;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "iiiiiiifi;layer tuple", &kind,
                              &s->units, &s->kh, &s->kw, &s->stride, &s->same, &act, &s->rate,
                              &init))
            goto done;
        s->kind = (LayerKind)kind;
        s->act = (NnAct)act;
        s->init = (NnInit)init;
    }
    SgError err = {0};
    model_free(self->model);
    self->model = NULL;
    if (model_create(&self->model, h, w, c, specs, (int)n, &err) < 0) {
        sg_raise(&err);
        goto done;
    }
    rc = 0;
done:
    PyMem_Free(specs);
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

static PyObject *view(ModelObject *self, float *data)
{
    npy_intp dims[1] = {(npy_intp)model_num_params(self->model)};
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
    return model_ready(self) < 0 ? NULL : view(self, model_params(self->model));
}

static PyObject *model_get_grads(ModelObject *self, void *closure)
{
    (void)closure;
    return model_ready(self) < 0 ? NULL : view(self, model_grads(self->model));
}

static PyObject *model_param_table(ModelObject *self, PyObject *noargs)
{
    (void)noargs;
    if (model_ready(self) < 0)
        return NULL;
    int n = model_num_tensors(self->model);
    PyObject *out = PyList_New(n);
    for (int i = 0; out && i < n; i++) {
        const ParamInfo *p = model_param_info(self->model, i);
        PyObject *shape = PyTuple_New(p->ndim);
        for (int d = 0; shape && d < p->ndim; d++)
            PyTuple_SET_ITEM(shape, d, PyLong_FromLong(p->shape[d]));
        PyObject *row = shape ? Py_BuildValue("(iinnN)", p->layer, p->is_bias,
                                              (Py_ssize_t)p->offset, (Py_ssize_t)p->size, shape)
                              : NULL;
        if (row == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, row);
    }
    return out;
}

static PyObject *model_layer_shapes(ModelObject *self, PyObject *noargs)
{
    (void)noargs;
    if (model_ready(self) < 0)
        return NULL;
    int n = model_num_layers(self->model);
    PyObject *out = PyList_New(n);
    for (int i = 0; out && i < n; i++) {
        const LayerShape *s = model_layer_shape(self->model, i);
        PyObject *row = Py_BuildValue("((iii)(iii)(iiii))", s->h, s->w, s->c, s->oh, s->ow, s->oc,
                                      s->pt, s->pl, s->pb, s->pr);
        if (row == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, row);
    }
    return out;
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

/* Fills d from (x, labels, targets), the sample weights and the input
 * transform (scale NaN, mean and std None: none); None for what is absent.
 * x: float32 or uint8; labels: int32 or int64; targets [n, K] and weights
 * [n]: float32. The arrays are used in place: the caller keeps them alive. */
static int parse_data(ModelObject *self, NnData *d, PyObject *xo, PyObject *lo, PyObject *oo,
                      double scale, PyObject *meano, PyObject *stdo, PyObject *wo)
{
    memset(d, 0, sizeof *d);
    if (!PyArray_Check(xo))
        return sg_raise_code(SG_EINVAL, "x must be a NumPy array, not %s", Py_TYPE(xo)->tp_name),
               -1;
    PyArrayObject *x = (PyArrayObject *)xo;
    int xt = PyArray_TYPE(x);
    if ((xt != NPY_FLOAT32 && xt != NPY_UINT8) || !PyArray_IS_C_CONTIGUOUS(x))
        return sg_raise_code(SG_EINVAL, "x must be a C-contiguous float32 or uint8 array, not %s%s",
                             PyArray_DESCR(x)->typeobj->tp_name,
                             PyArray_IS_C_CONTIGUOUS(x) ? "" : " (not contiguous)"),
               -1;
    if (PyArray_NDIM(x) < 1)
        return sg_raise_code(SG_EINVAL, "x must have a batch dimension"), -1;
    d->n = (size_t)PyArray_DIM(x, 0);
    d->row = model_input_size(self->model);
    if ((size_t)PyArray_SIZE(x) != d->n * d->row)
        return sg_raise_code(SG_EINVAL,
                             "x has %zd values for %zu rows; the model takes %zu per row",
                             PyArray_SIZE(x), d->n, d->row),
               -1;
    if (xt == NPY_FLOAT32)
        d->x = PyArray_DATA(x);
    else
        d->x_u8 = PyArray_DATA(x);
    if (optional_floats(meano, "input mean", d->row, &d->mean) < 0 ||
        optional_floats(stdo, "input std", d->row, &d->std) < 0)
        return -1;
    d->transform = !isnan(scale) || d->mean || d->std;
    d->scale = isnan(scale) ? 1.0f : (float)scale;
    if (lo != Py_None) {
        PyArrayObject *l = (PyArrayObject *)lo;
        int lt = PyArray_Check(lo) ? PyArray_TYPE(l) : -1;
        if ((lt != NPY_INT32 && lt != NPY_INT64) || !PyArray_IS_C_CONTIGUOUS(l) ||
            (size_t)PyArray_SIZE(l) != d->n)
            return sg_raise_code(SG_EINVAL,
                                 "labels must be a contiguous int32 or int64 array of %zu rows",
                                 d->n),
                   -1;
        if (lt == NPY_INT32)
            d->labels = PyArray_DATA(l);
        else
            d->labels64 = PyArray_DATA(l);
    }
    if (oo != Py_None) {
        size_t k = (size_t)model_num_classes(self->model);
        if (nn_float_array(oo, "targets", d->n * k, 0) == NULL)
            return -1;
        d->targets = PyArray_DATA((PyArrayObject *)oo);
    }
    return optional_floats(wo, "sample weights", d->n, &d->weights);
}

/* The metrics' state array st->metrics points into: None, or a contiguous
 * float64 array of model_metric_state_size doubles, added to in place. */
static int metric_state(ModelObject *self, PyObject *o, NnStats *st)
{
    st->metrics = NULL;
    if (o == Py_None)
        return 0;
    size_t n = model_metric_state_size(self->model);
    if (!PyArray_Check(o) || PyArray_TYPE((PyArrayObject *)o) != NPY_FLOAT64 ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)o) || !PyArray_ISWRITEABLE((PyArrayObject *)o) ||
        (size_t)PyArray_SIZE((PyArrayObject *)o) != n)
        return sg_raise_code(SG_EINVAL,
                             "metrics must be None or a writable contiguous float64 array of %zu "
                             "values (the metrics' state)",
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
    static char *kwlist[] = {"opt",   "x",       "labels",  "targets", "order", "start",
                             "batch", "nsteps",  "hook",    "step",    "scale", "mean",
                             "std",   "weights", "metrics", NULL};
    PyObject *opto, *xo, *lo, *oo, *ordo, *hooko = Py_None, *meano = Py_None, *stdo = Py_None;
    PyObject *wo = Py_None, *mo = Py_None;
    Py_ssize_t start;
    int batch;
    long long nsteps, step = 0;
    double scale = NAN;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOniL|$OLdOOOO:train_steps", kwlist, &opto, &xo,
                                     &lo, &oo, &ordo, &start, &batch, &nsteps, &hooko, &step,
                                     &scale, &meano, &stdo, &wo, &mo) ||
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
    if (parse_data(self, &d, xo, lo, oo, scale, meano, stdo, wo) < 0 ||
        metric_state(self, mo, &st) < 0)
        return NULL;
    if (!d.labels && !d.labels64 && !d.targets)
        return sg_raise_code(SG_EINVAL, "train_steps needs labels or targets");
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
    Py_XDECREF(hook ? hooko : NULL);
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
    static char *kwlist[] = {"x",    "labels", "targets", "batch",   "scale",
                             "mean", "std",    "weights", "metrics", NULL};
    PyObject *xo, *lo, *oo, *meano = Py_None, *stdo = Py_None, *wo = Py_None, *mo = Py_None;
    int batch;
    double scale = NAN;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOi|$dOOOO:evaluate", kwlist, &xo, &lo, &oo,
                                     &batch, &scale, &meano, &stdo, &wo, &mo) ||
        model_ready(self) < 0)
        return NULL;
    NnData d;
    NnStats st = {0};
    if (parse_data(self, &d, xo, lo, oo, scale, meano, stdo, wo) < 0 ||
        metric_state(self, mo, &st) < 0)
        return NULL;
    SgError err = {0};
    int rc;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = model_evaluate(self->model, &d, batch, &st, &err);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    if (rc < 0)
        return sg_raise(&err);
    return stats_tuple(&st);
}

static PyObject *model_predict_py(ModelObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "batch", "scale", "mean", "std", NULL};
    PyObject *xo, *meano = Py_None, *stdo = Py_None;
    int batch;
    double scale = NAN;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oi|$dOO:predict", kwlist, &xo, &batch, &scale,
                                     &meano, &stdo) ||
        model_ready(self) < 0)
        return NULL;
    NnData d;
    if (parse_data(self, &d, xo, Py_None, Py_None, scale, meano, stdo, Py_None) < 0)
        return NULL;
    npy_intp dims[2] = {(npy_intp)d.n, model_num_classes(self->model)};
    PyObject *out = PyArray_SimpleNew(2, dims, NPY_FLOAT32);
    if (out == NULL)
        return NULL;
    float *dst = PyArray_DATA((PyArrayObject *)out);
    SgError err = {0};
    int rc;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = model_predict(self->model, &d, batch, dst, &err);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    if (rc < 0) {
        Py_DECREF(out);
        return sg_raise(&err);
    }
    return out;
}

static PyObject *model_set_loss_py(ModelObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"kind", "from_logits", "label_smoothing", "delta", NULL};
    int kind, from_logits = 0;
    float smoothing = 0.0f, delta = 1.0f;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "i|$pff:set_loss", kwlist, &kind, &from_logits,
                                     &smoothing, &delta) ||
        model_ready(self) < 0)
        return NULL;
    NnLoss loss = {(NnLossKind)kind, from_logits, smoothing, delta};
    SgError err = {0};
    if (model_set_loss(self->model, &loss, &err) < 0)
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

static PyObject *model_set_metrics_py(ModelObject *self, PyObject *args)
{
    PyObject *list;
    NnMetric *ms;
    int n;
    if (!PyArg_ParseTuple(args, "O:set_metrics", &list) || model_ready(self) < 0 ||
        parse_metrics(list, &ms, &n) < 0)
        return NULL;
    SgError err = {0};
    int rc = model_set_metrics(self->model, ms, n, &err);
    PyMem_Free(ms);
    if (rc < 0)
        return sg_raise(&err);
    Py_RETURN_NONE;
}

static PyObject *model_get_metric_state_size(ModelObject *self, void *closure)
{
    (void)closure;
    return model_ready(self) < 0 ? NULL : PyLong_FromSize_t(model_metric_state_size(self->model));
}

static PyObject *model_get_head(ModelObject *self, void *closure)
{
    (void)closure;
    if (model_ready(self) < 0)
        return NULL;
    NnAct h = model_head(self->model);
    return PyUnicode_FromString(h == NN_ACT_SOFTMAX   ? "softmax"
                                : h == NN_ACT_SIGMOID ? "sigmoid"
                                                      : "linear");
}

static PyObject *model_get_classes(ModelObject *self, void *closure)
{
    (void)closure;
    return model_ready(self) < 0 ? NULL : PyLong_FromLong(model_num_classes(self->model));
}

static PyMethodDef model_methods[] = {
    {"param_table", (PyCFunction)model_param_table, METH_NOARGS,
     "param_table() -> [(layer, is_bias, offset, size, shape)]: the size table."},
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
     "train_steps(opt|None, x, labels|None, targets|None, order|None, start, batch, nsteps, *, "
     "hook=None, step=0, scale=nan, mean=None, std=None, weights=None, metrics=None) -> "
     "(loss_sum, seen, steps, step after); x float32 or uint8, labels int32 or int64, targets "
     "float32 [n, K], weights float32 [n]; metrics: the float64 state array the metrics add to; "
     "hook: a sparkgrad._core.NnGradHook capsule; GIL released."},
    {"evaluate", (PyCFunction)(void (*)(void))model_evaluate_py, METH_VARARGS | METH_KEYWORDS,
     "evaluate(x, labels|None, targets|None, batch, *, scale=nan, mean=None, std=None, "
     "weights=None, metrics=None) -> (loss_sum, seen, steps)."},
    {"set_loss", (PyCFunction)(void (*)(void))model_set_loss_py, METH_VARARGS | METH_KEYWORDS,
     "set_loss(kind, *, from_logits=False, label_smoothing=0.0, delta=1.0): kind indexes "
     "LOSS_NAMES; checked against the head and the outputs (ModelError)."},
    {"set_metrics", (PyCFunction)model_set_metrics_py, METH_VARARGS,
     "set_metrics([(kind, threshold, num_thresholds, pr_curve, from_logits), ...]): kind indexes "
     "METRIC_NAMES."},
    {"predict", (PyCFunction)(void (*)(void))model_predict_py, METH_VARARGS | METH_KEYWORDS,
     "predict(x, batch, *, scale=nan, mean=None, std=None) -> float32 [n, K]."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef model_getset[] = {
    {"params", (getter)model_get_params, NULL, "flat parameter buffer (float32 view)", NULL},
    {"grads", (getter)model_get_grads, NULL, "flat gradient buffer (float32 view)", NULL},
    {"classes", (getter)model_get_classes, NULL, "output width K", NULL},
    {"head", (getter)model_get_head, NULL,
     "'softmax', 'sigmoid' (a last Dense layer's activation, applied by the loss) or 'linear'",
     NULL},
    {"metric_state_size", (getter)model_get_metric_state_size, NULL,
     "doubles in the metrics' state array", NULL},
    {"precision", (getter)model_get_precision, NULL, "'fp32' or 'bf16': the precision in use",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ModelType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sparkgrad._core.Model",
    .tp_basicsize = sizeof(ModelObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Model((h, w, c), layers): a sequential network on oneDNN; layers are tuples "
              "(kind, units, kh, kw, stride, same, act, rate, init).",
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

static PyMethodDef nn_functions[] = {
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
