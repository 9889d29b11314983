/*
 * py_net_ps.c - sparkgrad._core.PsServer, PsClient and ps_shard_range: the
 * parameter server of csrc/net/ps.h on float32 NumPy arrays, used in place.
 * serve() and every PsClient call run with the GIL released.
 */
#include <stdlib.h>
#include <string.h>

#include <math.h>

#include "net/ps.h"
#include "py/py_net.h"
#include "py/py_nn.h"

/* A C-contiguous float32 array (writable if asked): of exactly *n values
 * when `exact`, else 1-D of any size (into *n). Returns its data or NULL
 * with an exception set. */
static float *float_array_n(PyObject *obj, int exact, uint64_t *n, int writable, const char *what)
{
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be a numpy.ndarray of float32, got %s", what,
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    PyArrayObject *a = (PyArrayObject *)obj;
    int bad = PyArray_TYPE(a) != NPY_FLOAT32 || !PyArray_IS_C_CONTIGUOUS(a) ||
              (writable && !PyArray_ISWRITEABLE(a));
    const char *tname = PyArray_DESCR(a)->typeobj->tp_name;
    const char *contig = PyArray_IS_C_CONTIGUOUS(a) ? "" : " (not contiguous)";
    if (exact && (bad || (uint64_t)PyArray_SIZE(a) != *n)) {
        sg_raise_code(SG_EINVAL,
                      "%s must be a C-contiguous%s float32 array of %llu values, got %s[%lld]%s",
                      what, writable ? ", writable" : "", (unsigned long long)*n, tname,
                      (long long)PyArray_SIZE(a), contig);
        return NULL;
    }
    if (!exact && (bad || PyArray_NDIM(a) != 1)) {
        sg_raise_code(SG_EINVAL,
                      "%s must be a 1-D C-contiguous%s float32 array, got %s of %d dimensions%s",
                      what, writable ? ", writable" : "", tname, PyArray_NDIM(a), contig);
        return NULL;
    }
    *n = (uint64_t)PyArray_SIZE(a);
    return (float *)PyArray_DATA(a);
}

/* A C-contiguous float32 array of exactly n values (writable if asked). */
static float *float_array(PyObject *obj, uint64_t n, int writable, const char *what)
{
    return float_array_n(obj, 1, &n, writable, what);
}

/* ---- table layouts and ps_shard_range ----------------------------------------- */

/* A model's embedding tables from obj: None, or a sequence of (offset, rows,
 * dim[, ...]) as Model.touched_rows gives them. *out is malloc'd (free it);
 * *n tables. -1 with an exception set. */
static int parse_tables(PyObject *obj, OptimRows **out, int *n)
{
    *out = NULL, *n = 0;
    if (obj == NULL || obj == Py_None)
        return 0;
    PyObject *seq = PySequence_Fast(obj, "tables must be a sequence of (offset, rows, dim)");
    if (seq == NULL)
        return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    if (len > PS_TABLES_MAX) {
        Py_DECREF(seq);
        sg_raise_code(SG_EINVAL, "%zd embedding tables: the ps takes at most %d", len,
                      PS_TABLES_MAX);
        return -1;
    }
    *out = calloc((size_t)len + 1, sizeof **out);
    int ok = *out != NULL;
    if (!ok)
        PyErr_NoMemory();
    for (Py_ssize_t i = 0; ok && i < len; i++) {
        PyObject *t = PySequence_Fast_GET_ITEM(seq, i);
        unsigned long long off, rows, dim;
        PyObject *item = PySequence_Check(t) ? PySequence_GetSlice(t, 0, 3) : NULL;
        PyObject *tup = item != NULL ? PySequence_Tuple(item) : NULL;
        ok = tup != NULL &&
             PyArg_ParseTuple(tup, "KKK;each table must be (offset, rows, dim)", &off, &rows, &dim);
        Py_XDECREF(item);
        Py_XDECREF(tup);
        if (!ok && !PyErr_Occurred())
            sg_raise_code(SG_EINVAL, "tables[%zd] must be (offset, rows, dim)", i);
        if (ok)
            (*out)[i] = (OptimRows){(size_t)off, (size_t)rows, (size_t)dim, NULL, 0};
    }
    Py_DECREF(seq);
    if (!ok) {
        free(*out);
        *out = NULL;
        return -1;
    }
    *n = (int)len;
    return 0;
}

static PyObject *py_ps_shard_range(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"total", "num_ps", "index", "tables", NULL};
    unsigned long long total;
    int num_ps, index, n;
    PyObject *tobj = Py_None;
    OptimRows *tables;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Kii|O:ps_shard_range", kwlist, &total, &num_ps,
                                     &index, &tobj) ||
        parse_tables(tobj, &tables, &n) < 0)
        return NULL;
    uint64_t off, cnt;
    SgError err;
    int rc = ps_shard_range_rows(total, tables, n, num_ps, index, &off, &cnt, &err);
    free(tables);
    if (rc < 0)
        return sg_raise(&err);
    return Py_BuildValue("(KK)", (unsigned long long)off, (unsigned long long)cnt);
}

/* ---- PsServer ----------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PsServer *srv;
    PyObject *listener;
    PyObject *optimizer; /* a private _core.Optimizer for this shard, or NULL */
    uint64_t offset, count, total;
    int serving;
} PsServerObject;

/* A new _core.Optimizer of n values from `spec`: a name ("adam", Keras
 * defaults through sparkgrad.nn.optimizers.get), a sparkgrad.nn.optimizers
 * Optimizer (its kind and config; its own state is not used), or a dict
 * {"kind": ..., **_core.Optimizer keywords}. */
static PyObject *shard_optimizer(PyObject *spec, uint64_t n)
{
    PyObject *inst = NULL, *kind = NULL, *config = NULL, *out = NULL;
    if (PyUnicode_Check(spec)) {
        PyObject *mod = PyImport_ImportModule("sparkgrad.nn.optimizers");
        if (mod == NULL)
            return NULL;
        inst = PyObject_CallMethod(mod, "get", "O", spec);
        Py_DECREF(mod);
        if (inst == NULL)
            return NULL;
        spec = inst;
    }
    if (PyDict_Check(spec)) {
        config = PyDict_Copy(spec);
        kind = config != NULL ? PyDict_GetItemString(config, "kind") : NULL;
        if (config != NULL && kind == NULL)
            sg_raise_code(SG_EINVAL, "optimizer dict needs a \"kind\" (sgd, adam, adamw, rmsprop, "
                                     "adadelta) besides the _core.Optimizer keywords");
        Py_XINCREF(kind);
        if (kind != NULL && PyDict_DelItemString(config, "kind") < 0)
            Py_CLEAR(kind);
    } else if (PyObject_HasAttrString(spec, "kind") && PyObject_HasAttrString(spec, "config") &&
               !PyObject_TypeCheck(spec, &OptimizerType)) {
        kind = PyObject_GetAttrString(spec, "kind");
        PyObject *c = kind != NULL ? PyObject_GetAttrString(spec, "config") : NULL;
        if (c != NULL && !PyDict_Check(c))
            sg_raise_code(SG_EINVAL, "optimizer.config must be a dict, got %s",
                          Py_TYPE(c)->tp_name);
        else if (c != NULL)
            config = PyDict_Copy(c);
        Py_XDECREF(c);
    } else {
        sg_raise_code(SG_EINVAL,
                      "optimizer must be a name (\"adam\"), a sparkgrad.nn.optimizers.Optimizer or "
                      "a dict {\"kind\": ..., **_core.Optimizer keywords}, got %s",
                      Py_TYPE(spec)->tp_name);
    }
    if (kind != NULL && config != NULL) {
        PyObject *args = Py_BuildValue("(OK)", kind, (unsigned long long)n);
        if (args != NULL)
            out = PyObject_Call((PyObject *)&OptimizerType, args, config);
        Py_XDECREF(args);
    }
    Py_XDECREF(kind);
    Py_XDECREF(config);
    Py_XDECREF(inst);
    return out;
}

/* (opt_step, state array) from a C shard state; takes ownership of nothing. */
static PyObject *opt_state_tuple(int64_t step, const float *state, size_t len)
{
    npy_intp dims[1] = {(npy_intp)len};
    PyObject *arr = PyArray_SimpleNew(1, dims, NPY_FLOAT32);
    if (arr == NULL)
        return NULL;
    if (len > 0)
        memcpy(PyArray_DATA((PyArrayObject *)arr), state, len * sizeof(float));
    return Py_BuildValue("(LN)", (long long)step, arr);
}

/* Parses (opt_step, state) into o (state borrowed from the array, kept alive
 * by *keep). Returns 0 or -1 with an exception. */
static int parse_opt_state(PyObject *obj, PsOptState *o, PyObject **keep, const char *what)
{
    long long step;
    PyObject *arr;
    *keep = NULL;
    if (!PyTuple_Check(obj) || !PyArg_ParseTuple(obj, "LO", &step, &arr)) {
        PyErr_Clear();
        sg_raise_code(SG_EINVAL, "%s must be (optimizer_step: int, state: float32 array), got %s",
                      what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyObject *a =
        PyArray_FROMANY(arr, NPY_FLOAT32, 0, 0, NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED);
    if (a == NULL)
        return -1;
    *keep = a;
    o->step = step;
    o->state = (float *)PyArray_DATA((PyArrayObject *)a);
    o->len = (size_t)PyArray_SIZE((PyArrayObject *)a);
    o->present = 1;
    return 0;
}

static int PsServer_init(PsServerObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"listener",    "secret",       "offset",   "count",  "total",
                             "num_workers", "mode",         "lr",       "params", "step",
                             "optimizer",   "auth_timeout", "security", "tables", NULL};
    PyObject *listener, *params = Py_None, *optspec = Py_None, *optimizer = NULL, *tobj = Py_None;
    const char *security = NULL;
    Py_buffer secret;
    unsigned long long offset, count, total, step = 0;
    int num_workers;
    const char *mode = "async";
    float lr = NAN;
    double auth_timeout = 10.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oy*KKKi|sfOKOdzO:PsServer", kwlist, &listener,
                                     &secret, &offset, &count, &total, &num_workers, &mode, &lr,
                                     &params, &step, &optspec, &auth_timeout, &security, &tobj))
        return -1;
    NetSecurity sec = NET_SEC_DEFAULT;
    OptimRows *tables = NULL;
    int ntables = 0;
    int fd = py_net_security(security, &sec) < 0 || parse_tables(tobj, &tables, &ntables) < 0
                 ? -1
                 : py_listener_fd(listener);
    int ok = fd >= 0;
    if (ok && (!isfinite(auth_timeout) || auth_timeout <= 0)) {
        sg_raise_code(SG_EINVAL, "auth_timeout must be a positive number of seconds, got %g",
                      auth_timeout);
        ok = 0;
    }
    if (ok && optspec != Py_None && !isnan(lr)) {
        sg_raise_code(SG_EINVAL, "PsServer takes lr= (plain SGD) or optimizer=, not both (give the "
                                 "learning rate to the optimizer)");
        ok = 0;
    }
    if (ok && optspec != Py_None && (optimizer = shard_optimizer(optspec, count)) == NULL)
        ok = 0;
    PsServerConfig cfg = {.total = total,
                          .offset = offset,
                          .count = count,
                          .num_workers = num_workers,
                          .lr = isnan(lr) ? 0.01f : lr,
                          .step = step,
                          .auth_timeout = auth_timeout,
                          .security = sec,
                          .optim = optimizer != NULL ? ((OptimizerObject *)optimizer)->opt : NULL,
                          .tables = tables,
                          .ntables = ntables};
    if (ok && strcmp(mode, "async") != 0 && strcmp(mode, "sync") != 0) {
        sg_raise_code(SG_EINVAL, "PsServer mode must be 'async' or 'sync', got '%s'", mode);
        ok = 0;
    }
    cfg.mode = strcmp(mode, "sync") == 0 ? PS_MODE_SYNC : PS_MODE_ASYNC;
    if (ok && params != Py_None && (cfg.init = float_array(params, count, 0, "params")) == NULL)
        ok = 0;
    if (ok && self->srv != NULL) {
        sg_raise_code(SG_ESTATE, "PsServer is already initialized");
        ok = 0;
    }
    SgError err;
    if (ok && ps_server_new(fd, secret.buf, (size_t)secret.len, &cfg, &self->srv, &err) < 0) {
        sg_raise(&err);
        ok = 0;
    }
    PyBuffer_Release(&secret);
    free(tables);
    if (!ok) {
        Py_XDECREF(optimizer);
        return -1;
    }
    if (optimizer != NULL)
        ((OptimizerObject *)optimizer)->busy = 1; /* stepped only by the shard */
    self->optimizer = optimizer;
    Py_INCREF(listener);
    self->listener = listener;
    self->offset = offset, self->count = count, self->total = total;
    return 0;
}

static void PsServer_dealloc(PsServerObject *self)
{
    if (self->srv != NULL) {
        Py_BEGIN_ALLOW_THREADS
        ps_server_free(self->srv);
        Py_END_ALLOW_THREADS
    }
    Py_XDECREF(self->listener);
    Py_XDECREF(self->optimizer);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PsServer *ps_live(PsServerObject *self)
{
    if (self->srv == NULL)
        sg_raise_code(SG_ESTATE, "PsServer was not initialized");
    return self->srv;
}

static PyObject *PsServer_serve(PsServerObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"timeout", NULL};
    PyObject *timeout_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:serve", kwlist, &timeout_obj) ||
        ps_live(self) == NULL)
        return NULL;
    double timeout = -1;
    if (timeout_obj != Py_None) {
        timeout = PyFloat_AsDouble(timeout_obj);
        if (timeout == -1 && PyErr_Occurred())
            return NULL;
        if (!(timeout >= 0))
            return sg_raise_code(SG_EINVAL, "serve timeout must be None or >= 0 seconds");
    }
    if (self->serving)
        return sg_raise_code(SG_ESTATE, "PsServer.serve is already running in another thread");
    self->serving = 1;
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ps_server_serve(self->srv, timeout, &err);
    Py_END_ALLOW_THREADS
    self->serving = 0;
    if (rc < 0)
        return sg_raise(&err);
    return PyUnicode_FromString(rc == 1 ? "done" : rc == 2 ? "stopped" : "timeout");
}

static PyObject *PsServer_stop(PsServerObject *self, PyObject *noargs)
{
    (void)noargs;
    if (ps_live(self) == NULL)
        return NULL;
    ps_server_stop(self->srv);
    Py_RETURN_NONE;
}

static PyObject *PsServer_get_state(PsServerObject *self, PyObject *noargs)
{
    (void)noargs;
    if (ps_live(self) == NULL)
        return NULL;
    npy_intp dims[1] = {(npy_intp)self->count};
    npy_intp odims[1] = {(npy_intp)ps_server_optim_state_size(self->srv)};
    PyObject *arr = PyArray_SimpleNew(1, dims, NPY_FLOAT32);
    PyObject *oarr =
        arr != NULL && self->optimizer != NULL ? PyArray_SimpleNew(1, odims, NPY_FLOAT32) : NULL;
    if (arr == NULL || (self->optimizer != NULL && oarr == NULL)) {
        Py_XDECREF(arr);
        return NULL;
    }
    uint64_t step = 0;
    int64_t opt_step = 0;
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ps_server_get_state(self->srv, PyArray_DATA((PyArrayObject *)arr), &step,
                             oarr != NULL ? PyArray_DATA((PyArrayObject *)oarr) : NULL, &opt_step,
                             &err);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        Py_DECREF(arr);
        Py_XDECREF(oarr);
        return sg_raise(&err);
    }
    if (oarr == NULL)
        return Py_BuildValue("(NKO)", arr, (unsigned long long)step, Py_None);
    return Py_BuildValue("(NK(LN))", arr, (unsigned long long)step, (long long)opt_step, oarr);
}

static PyObject *PsServer_set_state(PsServerObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"params", "step", "optimizer_state", NULL};
    PyObject *params, *ostate = Py_None, *keep = NULL;
    unsigned long long step;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OK|O:set_state", kwlist, &params, &step, &ostate) ||
        ps_live(self) == NULL)
        return NULL;
    const float *p = float_array(params, self->count, 0, "params");
    if (p == NULL)
        return NULL;
    PsOptState o = {0};
    if (ostate != Py_None && parse_opt_state(ostate, &o, &keep, "optimizer_state") < 0)
        return NULL;
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ps_server_set_state(self->srv, p, step, ostate != Py_None ? &o : NULL, &err);
    Py_END_ALLOW_THREADS
    Py_XDECREF(keep);
    if (rc < 0)
        return sg_raise(&err);
    Py_RETURN_NONE;
}

static PyObject *PsServer_get_step(PsServerObject *self, void *closure)
{
    (void)closure;
    return ps_live(self) ? PyLong_FromUnsignedLongLong(ps_server_step(self->srv)) : NULL;
}

static PyObject *PsServer_get_integrity_failures(PsServerObject *self, void *closure)
{
    (void)closure;
    if (ps_live(self) == NULL)
        return NULL;
    return PyLong_FromUnsignedLongLong(ps_server_integrity_failures(self->srv, NULL));
}

static PyObject *PsServer_get_range(PsServerObject *self, void *closure)
{
    (void)closure;
    return Py_BuildValue("(KKK)", (unsigned long long)self->offset, (unsigned long long)self->count,
                         (unsigned long long)self->total);
}

static PyMethodDef PsServer_methods[] = {
    {"serve", (PyCFunction)(void (*)(void))PsServer_serve, METH_VARARGS | METH_KEYWORDS,
     "serve(timeout=None) -> 'done' | 'stopped' | 'timeout': serve workers (GIL released)."},
    {"stop", (PyCFunction)PsServer_stop, METH_NOARGS,
     "stop(): make serve() return promptly (thread-safe)."},
    {"get_state", (PyCFunction)PsServer_get_state, METH_NOARGS,
     "get_state() -> (params copy, step, optimizer_state): optimizer_state is "
     "(optimizer_step, float32 slots) or None without an optimizer."},
    {"set_state", (PyCFunction)(void (*)(void))PsServer_set_state, METH_VARARGS | METH_KEYWORDS,
     "set_state(params, step, optimizer_state=None): None leaves the optimizer as it is."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef PsServer_getset[] = {
    {"step", (getter)PsServer_get_step, NULL, "global step", NULL},
    {"shard", (getter)PsServer_get_range, NULL, "(offset, count, total)", NULL},
    {"integrity_failures", (getter)PsServer_get_integrity_failures, NULL,
     "worker connections closed because a frame failed its integrity or sequence check", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PsServer_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sparkgrad._core.PsServer",
    .tp_basicsize = sizeof(PsServerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "PsServer(listener, secret, offset, count, total, num_workers, mode='async', "
              "lr=0.01, params=None, step=0, optimizer=None, auth_timeout=10.0, security=None, "
              "tables=None): one parameter-server shard (tables: the model's embedding tables, "
              "(offset, rows, dim) each, whose rows it then takes sparse); "
              "optimizer (a name, a sparkgrad.nn.optimizers.Optimizer or a dict with 'kind') "
              "replaces plain SGD with lr and keeps its state on the shard.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)PsServer_init,
    .tp_dealloc = (destructor)PsServer_dealloc,
    .tp_methods = PsServer_methods,
    .tp_getset = PsServer_getset,
};

/* ---- PsClient ----------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PsClient *cli;
    uint64_t total;
} PsClientObject;

static int PsClient_init(PsClientObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"addresses",   "secret",   "total",  "worker_id", "timeout",
                             "compression", "security", "tables", NULL};
    PyObject *addresses, *tobj = Py_None;
    Py_buffer secret;
    unsigned long long total;
    int worker_id;
    double timeout = 60.0;
    const char *compression = NULL, *security = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oy*Ki|dzzO:PsClient", kwlist, &addresses, &secret,
                                     &total, &worker_id, &timeout, &compression, &security, &tobj))
        return -1;
    NetSecurity sec = NET_SEC_DEFAULT;
    OptimRows *tables = NULL;
    int ntables = 0;
    if (py_net_security(security, &sec) < 0 || parse_tables(tobj, &tables, &ntables) < 0) {
        PyBuffer_Release(&secret);
        return -1;
    }
    PsWire wire = PS_WIRE_F32;
    if (compression != NULL && strcmp(compression, "none") != 0) {
        if (strcmp(compression, "bf16") != 0) {
            PyBuffer_Release(&secret);
            free(tables);
            sg_raise_code(SG_EINVAL, "PsClient compression must be None or 'bf16', not '%s'",
                          compression);
            return -1;
        }
        wire = PS_WIRE_BF16;
    }
    PyObject *seq = PySequence_Fast(addresses, "addresses must be a sequence of (host, port)");
    Py_ssize_t n = seq != NULL ? PySequence_Fast_GET_SIZE(seq) : 0;
    const char **hosts = seq != NULL ? calloc((size_t)n + 1, sizeof *hosts) : NULL;
    int *ports = hosts != NULL ? calloc((size_t)n + 1, sizeof *ports) : NULL;
    int ok = ports != NULL;
    if (seq != NULL && !ok)
        PyErr_NoMemory();
    for (Py_ssize_t i = 0; ok && i < n; i++)
        ok = PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i),
                              "si;each address must be (host: str, port: int)", &hosts[i],
                              &ports[i]);
    SgError err;
    int rc = 0;
    if (ok && self->cli != NULL) {
        sg_raise_code(SG_ESTATE, "PsClient is already initialized");
        ok = 0;
    }
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        rc = ps_client_connect(hosts, ports, (int)n, secret.buf, (size_t)secret.len, sec, total,
                               tables, ntables, worker_id, timeout, &self->cli, &err);
        Py_END_ALLOW_THREADS
        if (rc == 0 && (rc = ps_client_set_wire(self->cli, wire, &err)) < 0) {
            ps_client_free(self->cli);
            self->cli = NULL;
        }
        if (rc < 0) {
            sg_raise(&err);
            ok = 0;
        }
    }
    free(hosts);
    free(ports);
    free(tables);
    Py_XDECREF(seq);
    PyBuffer_Release(&secret);
    self->total = total;
    return ok ? 0 : -1;
}

static void PsClient_dealloc(PsClientObject *self)
{
    ps_client_free(self->cli);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PsClient *cli_live(PsClientObject *self)
{
    if (self->cli == NULL)
        sg_raise_code(SG_ESTATE, "PsClient was not initialized");
    return self->cli;
}

enum { CALL_PULL, CALL_PUSH, CALL_PUSH_PULL, CALL_INIT };

static PyObject *ps_call(PsClientObject *self, PyObject *args, int which)
{
    PyObject *a = NULL, *b = NULL;
    if (!PyArg_ParseTuple(args, which == CALL_PUSH_PULL ? "OO" : "O", &a, &b) ||
        cli_live(self) == NULL)
        return NULL;
    const float *grads = NULL;
    float *params = NULL;
    if (which == CALL_PULL)
        params = float_array(a, self->total, 1, "params");
    else if (which == CALL_PUSH || which == CALL_INIT)
        grads = float_array(a, self->total, 0, which == CALL_INIT ? "params" : "grads");
    else if ((grads = float_array(a, self->total, 0, "grads")) != NULL)
        params = float_array(b, self->total, 1, "params");
    if (params == NULL && grads == NULL)
        return NULL;
    if (which == CALL_PUSH_PULL && (params == NULL || grads == NULL))
        return NULL;
    SgError err;
    uint64_t step = 0;
    int rc, initialized = 0;
    static const int ops[] = {PS_OP_PULL, PS_OP_PUSH, PS_OP_PUSH_PULL, PS_OP_INIT};
    Py_BEGIN_ALLOW_THREADS
    rc = ps_client_exchange(self->cli, ops[which], grads, params, &step, &initialized, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return sg_raise(&err);
    if (which == CALL_INIT)
        return PyBool_FromLong(initialized);
    return PyLong_FromUnsignedLongLong(step);
}

static PyObject *PsClient_pull(PsClientObject *self, PyObject *args)
{
    return ps_call(self, args, CALL_PULL);
}

static PyObject *PsClient_push(PsClientObject *self, PyObject *args)
{
    return ps_call(self, args, CALL_PUSH);
}

static PyObject *PsClient_push_pull(PsClientObject *self, PyObject *args)
{
    return ps_call(self, args, CALL_PUSH_PULL);
}

static PyObject *PsClient_init_params(PsClientObject *self, PyObject *args)
{
    return ps_call(self, args, CALL_INIT);
}

/* wait_others(params, timeout) -> step: blocks (GIL released) until every
 * other worker said done, then fills params with the final values. */
static PyObject *PsClient_wait_others(PsClientObject *self, PyObject *args)
{
    PyObject *a;
    double timeout;
    if (!PyArg_ParseTuple(args, "Od:wait_others", &a, &timeout) || cli_live(self) == NULL)
        return NULL;
    float *params = float_array(a, self->total, 1, "params");
    if (params == NULL)
        return NULL;
    SgError err;
    uint64_t step = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ps_client_wait_others(self->cli, params, &step, timeout, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return sg_raise(&err);
    return PyLong_FromUnsignedLongLong(step);
}

/* put_state(state) -> holders / mean_state(state) -> workers: the model
 * state (any 1-D float32 array) on shard 0, GIL released. */
static PyObject *state_call(PsClientObject *self, PyObject *args, int put)
{
    PyObject *a;
    if (!PyArg_ParseTuple(args, put ? "O:put_state" : "O:mean_state", &a) || cli_live(self) == NULL)
        return NULL;
    uint64_t n = 0;
    float *state = float_array_n(a, 0, &n, !put, "state");
    if (state == NULL)
        return NULL;
    SgError err;
    int rc, count = 0;
    Py_BEGIN_ALLOW_THREADS
    if (put)
        rc = ps_client_put_state(self->cli, state, (size_t)n, &count, &err);
    else
        rc = ps_client_mean_state(self->cli, state, (size_t)n, &count, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return sg_raise(&err);
    return PyLong_FromLong(count);
}

static PyObject *PsClient_put_state(PsClientObject *self, PyObject *args)
{
    return state_call(self, args, 1);
}

static PyObject *PsClient_mean_state(PsClientObject *self, PyObject *args)
{
    return state_call(self, args, 0);
}

static PyObject *PsClient_set_state(PsClientObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"params", "step", "optimizer_state", NULL};
    PyObject *params, *ostate = Py_None;
    unsigned long long step;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OK|O:set_state", kwlist, &params, &step, &ostate) ||
        cli_live(self) == NULL)
        return NULL;
    const float *p = float_array(params, self->total, 0, "params");
    if (p == NULL)
        return NULL;
    int n = ps_client_num_ps(self->cli);
    PsOptState *opt = NULL;
    PyObject **keep = NULL, *seq = NULL;
    int ok = 1;
    if (ostate != Py_None) {
        seq = PySequence_Fast(ostate, "optimizer_state must be a list with one entry per ps shard");
        ok = seq != NULL;
        if (ok && PySequence_Fast_GET_SIZE(seq) != n) {
            sg_raise_code(SG_EINVAL,
                          "optimizer_state has %zd entries, the client talks to %d ps shards",
                          PySequence_Fast_GET_SIZE(seq), n);
            ok = 0;
        }
        if (ok) {
            opt = calloc((size_t)n, sizeof *opt);
            keep = calloc((size_t)n, sizeof *keep);
            if (opt == NULL || keep == NULL) {
                PyErr_NoMemory();
                ok = 0;
            }
        }
        for (int i = 0; ok && i < n; i++) {
            PyObject *e = PySequence_Fast_GET_ITEM(seq, i);
            char what[64];
            snprintf(what, sizeof what, "optimizer_state[%d]", i);
            if (e != Py_None && parse_opt_state(e, &opt[i], &keep[i], what) < 0)
                ok = 0;
        }
    }
    SgError err;
    int rc = 0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        rc = ps_client_set_state(self->cli, p, step, opt, &err);
        Py_END_ALLOW_THREADS
    }
    for (int i = 0; keep != NULL && i < n; i++)
        Py_XDECREF(keep[i]);
    free(keep);
    free(opt);
    Py_XDECREF(seq);
    if (!ok)
        return NULL;
    if (rc < 0)
        return sg_raise(&err);
    Py_RETURN_NONE;
}

static PyObject *PsClient_get_state(PsClientObject *self, PyObject *noargs)
{
    (void)noargs;
    if (cli_live(self) == NULL)
        return NULL;
    int n = ps_client_num_ps(self->cli);
    npy_intp dims[1] = {(npy_intp)self->total};
    PyObject *arr = PyArray_SimpleNew(1, dims, NPY_FLOAT32);
    PsOptState *opt = arr != NULL ? calloc((size_t)n, sizeof *opt) : NULL;
    if (opt == NULL) {
        Py_XDECREF(arr);
        return arr != NULL ? PyErr_NoMemory() : NULL;
    }
    uint64_t step = 0;
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ps_client_get_state(self->cli, PyArray_DATA((PyArrayObject *)arr), &step, opt, &err);
    Py_END_ALLOW_THREADS
    PyObject *list = rc < 0 ? NULL : PyList_New(n);
    for (int i = 0; list != NULL && i < n; i++) {
        PyObject *e = opt[i].present ? opt_state_tuple(opt[i].step, opt[i].state, opt[i].len)
                                     : Py_NewRef(Py_None);
        if (e == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, e);
    }
    ps_opt_states_free(opt, n);
    free(opt);
    if (rc < 0) {
        Py_DECREF(arr);
        return sg_raise(&err);
    }
    if (list == NULL) {
        Py_DECREF(arr);
        return NULL;
    }
    return Py_BuildValue("(NKN)", arr, (unsigned long long)step, list);
}

static PyObject *PsClient_done(PsClientObject *self, PyObject *noargs)
{
    (void)noargs;
    if (cli_live(self) == NULL)
        return NULL;
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ps_client_done(self->cli, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return sg_raise(&err);
    Py_RETURN_NONE;
}

static PyObject *PsClient_grad_hook(PsClientObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"sparse", NULL};
    int sparse = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|p:grad_hook", kwlist, &sparse) ||
        cli_live(self) == NULL)
        return NULL;
    NnGradHook h;
    ps_client_grad_hook(self->cli, sparse, &h);
    /* the hook points into this client: the capsule keeps it alive */
    return nn_grad_hook_capsule((PyObject *)self, &h, NULL);
}

/* pull_rows(params, table, ids) -> None: rows ids (int32, sorted, unique)
 * of table index `table` from the shards into params, GIL released. */
static PyObject *PsClient_pull_rows(PsClientObject *self, PyObject *args)
{
    PyObject *a, *idobj;
    int table;
    if (!PyArg_ParseTuple(args, "OiO:pull_rows", &a, &table, &idobj) || cli_live(self) == NULL)
        return NULL;
    float *params = float_array(a, self->total, 1, "params");
    PyObject *ids = params != NULL ? PyArray_FROMANY(idobj, NPY_INT32, 1, 1,
                                                     NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED)
                                   : NULL;
    if (ids == NULL)
        return NULL;
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ps_client_pull_rows(self->cli, params, table, PyArray_DATA((PyArrayObject *)ids),
                             (size_t)PyArray_SIZE((PyArrayObject *)ids), &err);
    Py_END_ALLOW_THREADS
    Py_DECREF(ids);
    if (rc < 0)
        return sg_raise(&err);
    Py_RETURN_NONE;
}

static PyObject *PsClient_get_bytes(PsClientObject *self, void *closure)
{
    (void)closure;
    if (cli_live(self) == NULL)
        return NULL;
    uint64_t sent, received;
    ps_client_bytes(self->cli, &sent, &received);
    return Py_BuildValue("(KK)", (unsigned long long)sent, (unsigned long long)received);
}

static PyGetSetDef PsClient_getset[] = {
    {"bytes", (getter)PsClient_get_bytes, NULL,
     "(sent, received): bytes on every shard connection so far (frame headers and payloads)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyObject *PsClient_close(PsClientObject *self, PyObject *noargs)
{
    (void)noargs;
    if (self->cli != NULL) {
        Py_BEGIN_ALLOW_THREADS
        ps_client_close(self->cli);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyMethodDef PsClient_methods[] = {
    {"pull", (PyCFunction)PsClient_pull, METH_VARARGS,
     "pull(params) -> step: fill params in place."},
    {"push", (PyCFunction)PsClient_push, METH_VARARGS, "push(grads) -> step after the update."},
    {"push_pull", (PyCFunction)PsClient_push_pull, METH_VARARGS,
     "push_pull(grads, params) -> step: push, then fill params with the updated values."},
    {"wait_others", (PyCFunction)PsClient_wait_others, METH_VARARGS,
     "wait_others(params, timeout) -> step: wait until every other worker said done, then fill "
     "params with the final parameters (the chief's last checkpoint and evaluation)."},
    {"init", (PyCFunction)PsClient_init_params, METH_VARARGS,
     "init(params) -> bool: set the parameters unless a worker already did (True if this call "
     "did)."},
    {"set_state", (PyCFunction)(void (*)(void))PsClient_set_state, METH_VARARGS | METH_KEYWORDS,
     "set_state(params, step, optimizer_state=None): overwrite every shard (restore from a "
     "checkpoint); optimizer_state: one (optimizer_step, slots) or None per shard, as "
     "get_state returns it (None: leave that shard's optimizer as it is)."},
    {"get_state", (PyCFunction)PsClient_get_state, METH_NOARGS,
     "get_state() -> (params, step, optimizer_state): every shard's parameters, the global step "
     "and per shard (optimizer_step, float32 slots) or None (no optimizer), for checkpoints."},
    {"put_state", (PyCFunction)PsClient_put_state, METH_VARARGS,
     "put_state(state) -> int: put this worker's model state (1-D float32, e.g. BatchNorm's "
     "moving statistics; the same size on every worker) on ps shard 0, replacing its last one; "
     "returns how many workers' states the shard holds."},
    {"mean_state", (PyCFunction)PsClient_mean_state, METH_VARARGS,
     "mean_state(state) -> int: fill state in place with the elementwise mean of the workers' "
     "model states; returns how many were averaged (0: none put yet, state left as it is)."},
    {"done", (PyCFunction)PsClient_done, METH_NOARGS, "done(): this worker will push no more."},
    {"grad_hook", (PyCFunction)(void (*)(void))PsClient_grad_hook, METH_VARARGS | METH_KEYWORDS,
     "grad_hook(sparse=True) -> capsule sparkgrad._core.NnGradHook for Model.train_steps(hook=): "
     "each step pushes the gradients and pulls the ps-updated parameters (push_pull), the "
     "model's step becoming the ps' global step; the loop's own optimizer is skipped. With "
     "tables and sparse, embedding tables travel as the rows a step touched and a forward "
     "pulls the rows it reads; the rest of each local table is stale (pull() before reading "
     "it)."},
    {"pull_rows", (PyCFunction)PsClient_pull_rows, METH_VARARGS,
     "pull_rows(params, table, ids): rows ids (int32, sorted, unique) of embedding table "
     "`table` (an index into tables) from the shards into params."},
    {"close", (PyCFunction)PsClient_close, METH_NOARGS, "close()"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PsClient_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sparkgrad._core.PsClient",
    .tp_basicsize = sizeof(PsClientObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "PsClient(addresses, secret, total, worker_id, timeout=60.0, compression=None, "
        "security=None, tables=None): a worker's link to every ps shard; security ('none', 'auth', "
        "'encrypt'; None: _core.SECURITY_DEFAULT) must be the shards' own.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)PsClient_init,
    .tp_dealloc = (destructor)PsClient_dealloc,
    .tp_methods = PsClient_methods,
    .tp_getset = PsClient_getset,
};

static PyMethodDef ps_functions[] = {
    {"ps_shard_range", (PyCFunction)(void (*)(void))py_ps_shard_range, METH_VARARGS | METH_KEYWORDS,
     "ps_shard_range(total, num_ps, index, tables=None) -> (offset, count): the contiguous shard "
     "of ps `index`; with tables ((offset, rows, dim) each), split points snap to whole rows."},
    {NULL, NULL, 0, NULL},
};

int ps_module_init(PyObject *mod)
{
    if (PyModule_AddType(mod, &PsServer_Type) < 0 || PyModule_AddType(mod, &PsClient_Type) < 0)
        return -1;
    return PyModule_AddFunctions(mod, ps_functions);
}
