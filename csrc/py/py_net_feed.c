/*
 * py_net_feed.c - sparkgrad._core.FeedServer, FeedClient and feed_send:
 * binary batches of named NumPy columns from Spark partitions to a worker's
 * bounded C queue (csrc/net/feed.h). Waits and sends release the GIL; the
 * arrays next_batch returns own the C buffers they were filled in (no copy).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "net/feed.h"
#include "py/py_net.h"

static const struct {
    int npy, feed;
} dtype_map[] = {
    {NPY_FLOAT32, FEED_F32}, {NPY_FLOAT64, FEED_F64}, {NPY_INT32, FEED_I32},
    {NPY_INT64, FEED_I64},   {NPY_UINT8, FEED_U8},    {NPY_INT8, FEED_I8},
    {NPY_INT16, FEED_I16},   {NPY_UINT16, FEED_U16},  {NPY_BOOL, FEED_BOOL},
};

static int feed_code(int npy)
{
    for (size_t i = 0; i < sizeof dtype_map / sizeof *dtype_map; i++)
        if (PyArray_EquivTypenums(dtype_map[i].npy, npy))
            return dtype_map[i].feed;
    return 0;
}

static int npy_code(int feed)
{
    for (size_t i = 0; i < sizeof dtype_map / sizeof *dtype_map; i++)
        if (dtype_map[i].feed == feed)
            return dtype_map[i].npy;
    return NPY_NOTYPE;
}

static int batch_from_dict(PyObject *columns, const char *input, FeedBatch *b, PyObject **keep);

/* ---- FeedServer ------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    FeedServer *srv;
    PyObject *listener;
} FeedServerObject;

static int FeedServer_init(FeedServerObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"listener",  "secret",       "capacity_bytes", "expected_feeders",
                             "max_frame", "auth_timeout", "security",       NULL};
    PyObject *listener;
    Py_buffer secret;
    Py_ssize_t capacity = (Py_ssize_t)256 << 20;
    int expected = 0;
    unsigned int max_frame = 64u << 20;
    double auth_timeout = 10.0;
    const char *security = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oy*|niIdz:FeedServer", kwlist, &listener, &secret,
                                     &capacity, &expected, &max_frame, &auth_timeout, &security))
        return -1;
    NetSecurity mode;
    int fd = py_net_security(security, &mode) < 0 ? -1 : py_listener_fd(listener);
    SgError err;
    int rc = fd < 0 ? -1 : 0;
    if (rc == 0 && self->srv != NULL) {
        sg_raise_code(SG_ESTATE, "FeedServer is already initialized");
        rc = -1;
    }
    if (rc == 0 && capacity <= 0) {
        sg_raise_code(SG_EINVAL, "capacity_bytes must be > 0");
        rc = -1;
    }
    if (rc == 0 && (!isfinite(auth_timeout) || auth_timeout <= 0)) {
        sg_raise_code(SG_EINVAL, "auth_timeout must be a positive number of seconds, got %g",
                      auth_timeout);
        rc = -1;
    }
    if (rc == 0 && feed_server_start(fd, secret.buf, (size_t)secret.len, mode, (size_t)capacity,
                                     expected, max_frame, &self->srv, &err) < 0) {
        sg_raise(&err);
        rc = -1;
    }
    if (rc == 0)
        feed_server_set_auth_timeout(self->srv, auth_timeout);
    PyBuffer_Release(&secret);
    if (rc < 0)
        return -1;
    Py_INCREF(listener);
    self->listener = listener;
    return 0;
}

static void FeedServer_dealloc(FeedServerObject *self)
{
    if (self->srv != NULL) {
        Py_BEGIN_ALLOW_THREADS
        feed_server_free(self->srv);
        Py_END_ALLOW_THREADS
    }
    Py_XDECREF(self->listener);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static FeedServer *feed_live(FeedServerObject *self)
{
    if (self->srv == NULL)
        sg_raise_code(SG_ESTATE, "FeedServer was not initialized");
    return self->srv;
}

static void capsule_free(PyObject *cap)
{
    free(PyCapsule_GetPointer(cap, "sparkgrad.feed"));
}

/* Wraps out's columns as arrays; takes ownership of their buffers. */
static PyObject *out_to_dict(FeedOut *out)
{
    PyObject *d = PyDict_New();
    for (int c = 0; d != NULL && c < out->ncols; c++) {
        FeedColumn *col = &out->cols[c];
        npy_intp dims[FEED_MAX_NDIM];
        for (int k = 0; k < col->ndim; k++)
            dims[k] = (npy_intp)col->dims[k];
        PyObject *arr =
            PyArray_SimpleNewFromData(col->ndim, dims, npy_code(col->dtype), (void *)col->data);
        PyObject *cap =
            arr != NULL ? PyCapsule_New((void *)col->data, "sparkgrad.feed", capsule_free) : NULL;
        if (cap == NULL || PyArray_SetBaseObject((PyArrayObject *)arr, cap) < 0) {
            Py_XDECREF(cap);
            Py_XDECREF(arr);
            Py_CLEAR(d);
            break;
        }
        col->data = NULL; /* owned by the capsule now */
        if (PyDict_SetItemString(d, col->name, arr) < 0)
            Py_CLEAR(d);
        Py_DECREF(arr);
    }
    feed_out_free(out);
    return d;
}

static PyObject *FeedServer_next_batch(FeedServerObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"n", "timeout", "input", "with_source", "partial", NULL};
    unsigned long long n;
    double timeout;
    const char *input = "train";
    int with_source = 0, partial = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Kd|spp:next_batch", kwlist, &n, &timeout, &input,
                                     &with_source, &partial) ||
        feed_live(self) == NULL)
        return NULL;
    FeedOut *out = calloc(1, sizeof *out);
    if (out == NULL)
        return PyErr_NoMemory();
    out->want_sources = with_source;
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = feed_server_next(self->srv, input, n, partial && n > 0 ? 1 : n, timeout, out, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        free(out);
        return sg_raise(&err);
    }
    PyObject *src = NULL;
    if (with_source) {
        npy_intp dims[1] = {(npy_intp)out->rows};
        src = PyArray_SimpleNewFromData(1, dims, NPY_UINT32, out->sources);
        PyObject *cap =
            src != NULL ? PyCapsule_New(out->sources, "sparkgrad.feed", capsule_free) : NULL;
        if (cap == NULL || PyArray_SetBaseObject((PyArrayObject *)src, cap) < 0) {
            Py_XDECREF(cap);
            Py_XDECREF(src);
            feed_out_free(out);
            free(out);
            return NULL;
        }
        out->sources = NULL; /* owned by the capsule now */
    }
    PyObject *d = out_to_dict(out);
    free(out);
    if (!with_source)
        return d;
    if (d == NULL) {
        Py_DECREF(src);
        return NULL;
    }
    return Py_BuildValue("(NN)", d, src);
}

static PyObject *FeedServer_send_results(FeedServerObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"source", "columns", "timeout", NULL};
    unsigned int source;
    PyObject *columns;
    double timeout = 60.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "IO|d:send_results", kwlist, &source, &columns,
                                     &timeout) ||
        feed_live(self) == NULL)
        return NULL;
    FeedBatch *b = malloc(sizeof *b);
    if (b == NULL)
        return PyErr_NoMemory();
    PyObject *keep = NULL;
    int rc = batch_from_dict(columns, "results", b, &keep);
    SgError err;
    if (rc == 0) {
        Py_BEGIN_ALLOW_THREADS
        rc = feed_server_send_results(self->srv, source, b, timeout, &err);
        Py_END_ALLOW_THREADS
        if (rc < 0)
            sg_raise(&err);
    }
    Py_XDECREF(keep);
    free(b);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *FeedServer_finish(FeedServerObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"input", NULL};
    const char *input = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|z:finish", kwlist, &input) ||
        feed_live(self) == NULL)
        return NULL;
    feed_server_finish(self->srv, input);
    Py_RETURN_NONE;
}

static PyObject *FeedServer_drained(FeedServerObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"input", NULL};
    const char *input = "train";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|s:drained", kwlist, &input) ||
        feed_live(self) == NULL)
        return NULL;
    return PyBool_FromLong(feed_server_drained(self->srv, input));
}

static PyObject *FeedServer_stats(FeedServerObject *self, PyObject *noargs)
{
    (void)noargs;
    if (feed_live(self) == NULL)
        return NULL;
    FeedStats st;
    feed_server_stats(self->srv, &st);
    return Py_BuildValue("{s:l, s:l, s:l, s:l, s:l, s:n, s:l, s:s}", "feeders", st.feeders, "ended",
                         st.ended, "batches", st.batches, "rows_in", st.rows_in, "rows_out",
                         st.rows_out, "queued_bytes", (Py_ssize_t)st.queued_bytes, "rejected",
                         st.rejected, "last_error", st.last_error);
}

static PyObject *FeedServer_close(FeedServerObject *self, PyObject *noargs)
{
    (void)noargs;
    if (self->srv != NULL) {
        Py_BEGIN_ALLOW_THREADS
        feed_server_stop(self->srv);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyMethodDef FeedServer_methods[] = {
    {"next_batch", (PyCFunction)(void (*)(void))FeedServer_next_batch, METH_VARARGS | METH_KEYWORDS,
     "next_batch(n, timeout, input='train', with_source=False, partial=False) -> dict[str, "
     "ndarray]: n rows, fewer (or none) once the input ended; partial=True: whatever is queued "
     "(up to n) as soon as there is a row."},
    {"send_results", (PyCFunction)(void (*)(void))FeedServer_send_results,
     METH_VARARGS | METH_KEYWORDS,
     "send_results(source, columns, timeout=60.0): result columns back to the feeder `source`."},
    {"finish", (PyCFunction)(void (*)(void))FeedServer_finish, METH_VARARGS | METH_KEYWORDS,
     "finish(input=None): every feeder is done (None: all inputs)."},
    {"drained", (PyCFunction)(void (*)(void))FeedServer_drained, METH_VARARGS | METH_KEYWORDS,
     "drained(input='train') -> bool: finished and nothing left."},
    {"stats", (PyCFunction)FeedServer_stats, METH_NOARGS, "stats() -> dict"},
    {"close", (PyCFunction)FeedServer_close, METH_NOARGS, "close(): stop serving feeders."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FeedServer_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sparkgrad._core.FeedServer",
    .tp_basicsize = sizeof(FeedServerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "FeedServer(listener, secret, capacity_bytes=256 MiB, expected_feeders=0, "
              "max_frame=64 MiB, auth_timeout=10.0, security=None)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)FeedServer_init,
    .tp_dealloc = (destructor)FeedServer_dealloc,
    .tp_methods = FeedServer_methods,
};

/* ---- FeedClient ------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    FeedClient *cli;
    char input[FEED_NAME_MAX + 1];
} FeedClientObject;

/* Fills b from a dict of arrays; *keep holds the contiguous arrays alive. */
static int batch_from_dict(PyObject *columns, const char *input, FeedBatch *b, PyObject **keep)
{
    if (!PyDict_Check(columns) || PyDict_Size(columns) < 1 ||
        PyDict_Size(columns) > FEED_MAX_COLUMNS) {
        PyErr_Format(PyExc_TypeError, "columns must be a dict of 1..%d name -> ndarray",
                     FEED_MAX_COLUMNS);
        return -1;
    }
    *keep = PyList_New(0);
    if (*keep == NULL)
        return -1;
    snprintf(b->input, sizeof b->input, "%s", input);
    b->ncols = 0;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(columns, &pos, &key, &value)) {
        const char *name = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        if (name == NULL || name[0] == '\0' || strlen(name) > FEED_NAME_MAX) {
            if (!PyErr_Occurred())
                sg_raise_code(SG_EINVAL, "column names must be non-empty str of at most %d bytes",
                              FEED_NAME_MAX);
            return -1;
        }
        PyObject *arr = PyArray_FROMANY(value, NPY_NOTYPE, 1, FEED_MAX_NDIM,
                                        NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED);
        if (arr == NULL || PyList_Append(*keep, arr) < 0) {
            Py_XDECREF(arr);
            return -1;
        }
        Py_DECREF(arr);
        PyArrayObject *a = (PyArrayObject *)arr;
        FeedColumn *c = &b->cols[b->ncols++];
        snprintf(c->name, sizeof c->name, "%s", name);
        c->dtype = (uint8_t)feed_code(PyArray_TYPE(a));
        if (c->dtype == 0) {
            sg_raise_code(
                SG_EINVAL,
                "column '%s' has dtype %s; supported: float32/64, int8/16/32/64, uint8/16, bool",
                name, PyArray_DESCR(a)->typeobj->tp_name);
            return -1;
        }
        c->ndim = (uint8_t)PyArray_NDIM(a);
        for (int k = 0; k < c->ndim; k++)
            c->dims[k] = (uint64_t)PyArray_DIM(a, k);
        c->data = PyArray_DATA(a);
        if (b->ncols == 1)
            b->rows = c->dims[0];
        else if (c->dims[0] != b->rows) {
            sg_raise_code(SG_EINVAL, "column '%s' has %lld rows but '%s' has %llu", name,
                          (long long)c->dims[0], b->cols[0].name, (unsigned long long)b->rows);
            return -1;
        }
    }
    return 0;
}

static int FeedClient_init(FeedClientObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"host", "port", "secret", "timeout", "input", "security", NULL};
    const char *host, *input = "train", *security = NULL;
    int port;
    Py_buffer secret;
    double timeout = 60.0;
    NetSecurity mode;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "siy*|dsz:FeedClient", kwlist, &host, &port, &secret,
                                     &timeout, &input, &security))
        return -1;
    if (py_net_security(security, &mode) < 0) {
        PyBuffer_Release(&secret);
        return -1;
    }
    if (strlen(input) == 0 || strlen(input) > FEED_NAME_MAX || self->cli != NULL) {
        PyBuffer_Release(&secret);
        sg_raise_code(self->cli != NULL ? SG_ESTATE : SG_EINVAL,
                      "bad input name or FeedClient already connected");
        return -1;
    }
    snprintf(self->input, sizeof self->input, "%s", input);
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = feed_client_connect(host, port, secret.buf, (size_t)secret.len, mode, timeout, &self->cli,
                             &err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&secret);
    if (rc < 0) {
        sg_raise(&err);
        return -1;
    }
    return 0;
}

static void FeedClient_dealloc(FeedClientObject *self)
{
    feed_client_free(self->cli);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *client_send(FeedClient *cli, PyObject *columns, const char *input)
{
    FeedBatch *b = malloc(sizeof *b);
    if (b == NULL)
        return PyErr_NoMemory();
    PyObject *keep = NULL;
    int rc = batch_from_dict(columns, input, b, &keep);
    SgError err;
    if (rc == 0) {
        Py_BEGIN_ALLOW_THREADS
        rc = feed_client_send(cli, b, &err);
        Py_END_ALLOW_THREADS
        if (rc < 0)
            sg_raise(&err);
    }
    Py_XDECREF(keep);
    free(b);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static FeedClient *client_live(FeedClientObject *self)
{
    if (self->cli == NULL)
        sg_raise_code(SG_ESTATE, "FeedClient is closed");
    return self->cli;
}

static PyObject *FeedClient_send(FeedClientObject *self, PyObject *args)
{
    PyObject *columns;
    if (!PyArg_ParseTuple(args, "O:send", &columns) || client_live(self) == NULL)
        return NULL;
    return client_send(self->cli, columns, self->input);
}

static PyObject *FeedClient_end(FeedClientObject *self, PyObject *noargs)
{
    (void)noargs;
    if (client_live(self) == NULL)
        return NULL;
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = feed_client_end(self->cli, self->input, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return sg_raise(&err);
    Py_RETURN_NONE;
}

static PyObject *FeedClient_recv_results(FeedClientObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"timeout", NULL};
    double timeout;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "d:recv_results", kwlist, &timeout) ||
        client_live(self) == NULL)
        return NULL;
    FeedBatch *b = malloc(sizeof *b);
    if (b == NULL)
        return PyErr_NoMemory();
    uint8_t *payload = NULL;
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = feed_client_recv_results(self->cli, timeout, b, &payload, &err);
    Py_END_ALLOW_THREADS
    PyObject *d = NULL;
    if (rc < 0) {
        sg_raise(&err);
    } else if (payload == NULL) {
        d = Py_None;
        Py_INCREF(d);
    } else {
        d = PyDict_New();
        for (int c = 0; d != NULL && c < b->ncols; c++) {
            const FeedColumn *col = &b->cols[c];
            npy_intp dims[FEED_MAX_NDIM];
            for (int k = 0; k < col->ndim; k++)
                dims[k] = (npy_intp)col->dims[k];
            PyObject *arr = PyArray_SimpleNew(col->ndim, dims, npy_code(col->dtype));
            if (arr != NULL)
                memcpy(PyArray_DATA((PyArrayObject *)arr), col->data,
                       (size_t)(col->dims[0] * col->row_bytes));
            if (arr == NULL || PyDict_SetItemString(d, col->name, arr) < 0)
                Py_CLEAR(d);
            Py_XDECREF(arr);
        }
    }
    free(payload);
    free(b);
    return d;
}

static PyObject *FeedClient_close(FeedClientObject *self, PyObject *noargs)
{
    (void)noargs;
    feed_client_free(self->cli);
    self->cli = NULL;
    Py_RETURN_NONE;
}

static PyMethodDef FeedClient_methods[] = {
    {"send", (PyCFunction)FeedClient_send, METH_VARARGS,
     "send(columns: dict[str, ndarray]): one batch."},
    {"end", (PyCFunction)FeedClient_end, METH_NOARGS,
     "end(): END for this input; waits for the worker's ACK."},
    {"recv_results", (PyCFunction)(void (*)(void))FeedClient_recv_results,
     METH_VARARGS | METH_KEYWORDS,
     "recv_results(timeout) -> dict[str, ndarray] | None: the next results the worker sent back."},
    {"close", (PyCFunction)FeedClient_close, METH_NOARGS, "close()"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FeedClient_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sparkgrad._core.FeedClient",
    .tp_basicsize = sizeof(FeedClientObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "FeedClient(host, port, secret, timeout=60.0, input='train', security=None): a "
              "feeder's connection to a worker (security: 'none', 'auth', 'encrypt'; None: the "
              "default; must be the worker's).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)FeedClient_init,
    .tp_dealloc = (destructor)FeedClient_dealloc,
    .tp_methods = FeedClient_methods,
};

/* feed_send(host, port, secret, columns, timeout=60.0, input='train', security=None): connect,
 * one batch, END, ACK. */
static PyObject *py_feed_send(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"host",    "port",  "secret",   "columns",
                             "timeout", "input", "security", NULL};
    PyObject *pargs = NULL, *pkw = NULL, *columns;
    const char *host, *input = "train", *security = NULL;
    int port;
    PyObject *secret;
    double timeout = 60.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "siSO|dsz:feed_send", kwlist, &host, &port, &secret,
                                     &columns, &timeout, &input, &security))
        return NULL;
    pargs = Py_BuildValue("(siOds)", host, port, secret, timeout, input);
    pkw = pargs != NULL && security != NULL ? Py_BuildValue("{ss}", "security", security) : NULL;
    FeedClientObject *c =
        pargs != NULL && (security == NULL || pkw != NULL)
            ? (FeedClientObject *)PyObject_Call((PyObject *)&FeedClient_Type, pargs, pkw)
            : NULL;
    Py_XDECREF(pargs);
    Py_XDECREF(pkw);
    if (c == NULL)
        return NULL;
    PyObject *r = client_send(c->cli, columns, c->input);
    if (r != NULL) {
        Py_DECREF(r);
        r = FeedClient_end(c, NULL);
    }
    Py_DECREF(c);
    return r;
}

/* pack_binary(values, width=-1) -> uint8[n, width]: the byte strings of a
 * binary column (Spark BinaryType rows) copied row by row into one array,
 * so a feeder never makes a Python object per byte. Every value must hold
 * width bytes (the first value's length when width is -1). */
static PyObject *py_pack_binary(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"values", "width", NULL};
    PyObject *values, *seq, *arr = NULL;
    Py_ssize_t width = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|n:pack_binary", kwlist, &values, &width))
        return NULL;
    seq = PySequence_Fast(values, "pack_binary: values must be a sequence of bytes-like objects");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_buffer view = {0};
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyObject_GetBuffer(items[i], &view, PyBUF_SIMPLE) < 0) {
            PyErr_Clear();
            sg_raise_code(SG_EINVAL, "pack_binary: row %zd is %s, not bytes", i,
                          Py_TYPE(items[i])->tp_name);
            goto cleanup;
        }
        if (width < 0)
            width = view.len;
        if (view.len != width) {
            sg_raise_code(SG_EINVAL,
                          "pack_binary: row %zd holds %zd bytes, expected %zd (every value of a "
                          "binary column must have the same length)",
                          i, view.len, width);
            goto cleanup;
        }
        if (arr == NULL) {
            npy_intp dims[2] = {(npy_intp)n, (npy_intp)width};
            arr = PyArray_SimpleNew(2, dims, NPY_UINT8);
            if (arr == NULL)
                goto cleanup;
        }
        memcpy((uint8_t *)PyArray_DATA((PyArrayObject *)arr) + (size_t)i * (size_t)width, view.buf,
               (size_t)width);
        PyBuffer_Release(&view);
    }
    if (arr == NULL) { /* no rows */
        npy_intp dims[2] = {0, width < 0 ? 0 : (npy_intp)width};
        arr = PyArray_SimpleNew(2, dims, NPY_UINT8);
    }
    Py_DECREF(seq);
    return arr;
cleanup:
    if (view.obj != NULL)
        PyBuffer_Release(&view);
    Py_XDECREF(arr);
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef feed_functions[] = {
    {"pack_binary", (PyCFunction)(void (*)(void))py_pack_binary, METH_VARARGS | METH_KEYWORDS,
     "pack_binary(values, width=-1) -> uint8[n, width]: equal-length byte strings as one array."},
    {"feed_send", (PyCFunction)(void (*)(void))py_feed_send, METH_VARARGS | METH_KEYWORDS,
     "feed_send(host, port, secret, columns, timeout=60.0, input='train', security=None): send "
     "one batch and END."},
    {NULL, NULL, 0, NULL},
};

int feed_module_init(PyObject *mod)
{
    if (PyModule_AddType(mod, &FeedServer_Type) < 0 || PyModule_AddType(mod, &FeedClient_Type) < 0)
        return -1;
    return PyModule_AddFunctions(mod, feed_functions);
}
