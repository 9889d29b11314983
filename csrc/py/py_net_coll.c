/*
 * py_net_coll.c - sparkgrad._core.Communicator: the ring collectives of
 * csrc/net/coll.h on NumPy arrays (in place where the result has the input's
 * shape) and bytes, and its gradient hook as a PyCapsule for the C training
 * loop (nn/nn_hook.h). Every collective runs with the GIL released.
 * _grad_hook_ready / _grad_hook_step call a hook capsule's functions from
 * Python, for tests (the training loop calls them from C).
 */
#include <string.h>

#include "net/coll.h"
#include "nn/nn_hook.h"
#include "py/py_net.h"
#include "py/py_nn.h"

#define BYTES_MAX ((size_t)1 << 40) /* broadcast_bytes: the same cap on every rank */

typedef struct {
    PyObject_HEAD
    CollComm *comm;
    PyObject *listener;
    int closed;
} CommObject;

static PyTypeObject Comm_Type;

static CollComm *comm_live(CommObject *self)
{
    if (self->comm == NULL)
        sg_raise_code(SG_ESTATE, "Communicator was not initialized");
    else if (self->closed)
        sg_raise_code(SG_ESTATE, "Communicator is closed");
    else
        return self->comm;
    return NULL;
}

/* None -> -1 (the communicator's default), else seconds >= 0. */
static int parse_timeout(PyObject *obj, double *out)
{
    *out = -1;
    if (obj == Py_None)
        return 0;
    double t = PyFloat_AsDouble(obj);
    if (t == -1 && PyErr_Occurred())
        return -1;
    if (!(t >= 0) || t > 1e9) {
        sg_raise_code(SG_EINVAL, "timeout must be None or 0..1e9 seconds, got %g", t);
        return -1;
    }
    *out = t;
    return 0;
}

static int Comm_init(CommObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"listener", "secret",   "rank",          "addresses",
                             "timeout",  "security", "shared_memory", NULL};
    PyObject *listener, *addresses;
    Py_buffer secret;
    int rank;
    double timeout = 60.0;
    const char *security = NULL;
    int shared_memory = 1;
    NetSecurity mode;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oy*iO|dzp:Communicator", kwlist, &listener, &secret,
                                     &rank, &addresses, &timeout, &security, &shared_memory))
        return -1;
    if (py_net_security(security, &mode) < 0) {
        PyBuffer_Release(&secret);
        return -1;
    }
    int fd = py_listener_fd(listener);
    PyObject *seq =
        fd >= 0 ? PySequence_Fast(addresses, "addresses must be a list of (host, port)") : NULL;
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
    if (ok && n == 0) {
        sg_raise_code(SG_EINVAL, "Communicator needs the address of every rank (got none)");
        ok = 0;
    }
    if (ok && self->comm != NULL) {
        sg_raise_code(SG_ESTATE, "Communicator is already initialized");
        ok = 0;
    }
    if (ok) {
        SgError err;
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = coll_comm_new(fd, secret.buf, (size_t)secret.len, mode, rank, (int)n, hosts, ports,
                           timeout, shared_memory, &self->comm, &err);
        Py_END_ALLOW_THREADS
        if (rc < 0) {
            sg_raise(&err);
            ok = 0;
        }
    }
    free(hosts);
    free(ports);
    Py_XDECREF(seq);
    PyBuffer_Release(&secret);
    if (!ok)
        return -1;
    Py_INCREF(listener);
    self->listener = listener;
    return 0;
}

static void Comm_dealloc(CommObject *self)
{
    if (self->comm != NULL) {
        Py_BEGIN_ALLOW_THREADS
        coll_comm_close(self->comm);
        coll_comm_free(self->comm);
        Py_END_ALLOW_THREADS
    }
    Py_XDECREF(self->listener);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The collective dtype of a native-order numeric array, or 0 with an
 * exception set. */
static CollDtype array_dtype(PyArrayObject *a, const char *what)
{
    PyArray_Descr *d = PyArray_DESCR(a);
    int size = (int)PyArray_ITEMSIZE(a);
    if (PyArray_ISNOTSWAPPED(a)) {
        if (d->kind == 'f' && size == 4)
            return COLL_F32;
        if (d->kind == 'f' && size == 8)
            return COLL_F64;
        if (d->kind == 'i' && size == 4)
            return COLL_I32;
        if (d->kind == 'i' && size == 8)
            return COLL_I64;
    }
    sg_raise_code(SG_EINVAL, "%s takes float32, float64, int32 or int64 arrays, got %s", what,
                  d->typeobj->tp_name);
    return 0;
}

static PyArrayObject *inplace_array(PyObject *obj, const char *what)
{
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s takes a numpy.ndarray, got %s", what,
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    PyArrayObject *a = (PyArrayObject *)obj;
    if (!PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISWRITEABLE(a)) {
        sg_raise_code(SG_EINVAL, "%s works in place: the array must be C-contiguous and writable",
                      what);
        return NULL;
    }
    return a;
}

static int parse_op(const char *s, CollOp *op)
{
    static const char *names[] = {"sum", "average", "min", "max"};
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0) {
            *op = (CollOp)(COLL_SUM + i);
            return 0;
        }
    sg_raise_code(SG_EINVAL, "op must be 'sum', 'average', 'min' or 'max', got '%s'", s);
    return -1;
}

static int parse_comp(PyObject *obj, CollCompression *out)
{
    *out = COLL_COMP_NONE;
    if (obj == Py_None)
        return 0;
    const char *s = PyUnicode_Check(obj) ? PyUnicode_AsUTF8(obj) : NULL;
    if (s != NULL && strcmp(s, "fp16") == 0)
        *out = COLL_COMP_FP16;
    else if (s != NULL && strcmp(s, "bf16") == 0)
        *out = COLL_COMP_BF16;
    else if (s != NULL && strcmp(s, "none") == 0)
        *out = COLL_COMP_NONE;
    else {
        PyErr_Clear();
        sg_raise_code(SG_EINVAL, "compression must be None, 'fp16' or 'bf16'");
        return -1;
    }
    return 0;
}

static PyObject *Comm_allreduce(CommObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"array", "op", "compression", "timeout", NULL};
    PyObject *arr, *compobj = Py_None, *tobj = Py_None;
    const char *opname = "sum";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|sOO:allreduce", kwlist, &arr, &opname, &compobj,
                                     &tobj))
        return NULL;
    CollOp op;
    CollCompression comp;
    double timeout;
    PyArrayObject *a;
    CollDtype dt;
    if (comm_live(self) == NULL || parse_op(opname, &op) < 0 || parse_comp(compobj, &comp) < 0 ||
        parse_timeout(tobj, &timeout) < 0 || (a = inplace_array(arr, "allreduce")) == NULL ||
        (dt = array_dtype(a, "allreduce")) == 0)
        return NULL;
    if (comp != COLL_COMP_NONE && dt != COLL_F32)
        return sg_raise_code(SG_EINVAL, "compression applies to float32 arrays only");
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = coll_allreduce(self->comm, PyArray_DATA(a), (size_t)PyArray_SIZE(a), dt, op, comp, timeout,
                        &err);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return sg_raise(&err);
    return Py_NewRef(arr);
}

static PyObject *Comm_broadcast(CommObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"array", "root", "timeout", NULL};
    PyObject *arr, *tobj = Py_None;
    int root = 0;
    double timeout;
    PyArrayObject *a;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|iO:broadcast", kwlist, &arr, &root, &tobj) ||
        comm_live(self) == NULL || parse_timeout(tobj, &timeout) < 0 ||
        (a = inplace_array(arr, "broadcast")) == NULL)
        return NULL;
    SgError err;
    int rc;
    uint32_t tag = (uint32_t)PyArray_TYPE(a);
    Py_BEGIN_ALLOW_THREADS
    rc = coll_broadcast(self->comm, PyArray_DATA(a), (size_t)PyArray_NBYTES(a), root, tag, timeout,
                        &err);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return sg_raise(&err);
    return Py_NewRef(arr);
}

/* allgather of raw bytes: (malloc'd concatenation, lens[size]) or -1. */
static int gather(CommObject *self, const void *data, size_t len, double timeout, void **out,
                  uint64_t **lens)
{
    int n = coll_comm_size(self->comm);
    *lens = calloc((size_t)n, sizeof **lens);
    if (*lens == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = coll_allgather(self->comm, data, len, *lens, out, timeout, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        free(*lens);
        *lens = NULL;
        sg_raise(&err);
        return -1;
    }
    return 0;
}

static void capsule_free(PyObject *cap)
{
    free(PyCapsule_GetPointer(cap, "sparkgrad.coll"));
}

static PyObject *Comm_allgather_bytes(CommObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"data", "timeout", NULL};
    Py_buffer data;
    PyObject *tobj = Py_None;
    double timeout;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|O:allgather_bytes", kwlist, &data, &tobj))
        return NULL;
    void *out = NULL;
    uint64_t *lens = NULL;
    PyObject *list = NULL;
    if (comm_live(self) != NULL && parse_timeout(tobj, &timeout) == 0 &&
        gather(self, data.buf, (size_t)data.len, timeout, &out, &lens) == 0) {
        int n = coll_comm_size(self->comm);
        list = PyList_New(n);
        size_t off = 0;
        for (int i = 0; list != NULL && i < n; i++) {
            PyObject *b = PyBytes_FromStringAndSize((char *)out + off, (Py_ssize_t)lens[i]);
            off += (size_t)lens[i];
            if (b == NULL)
                Py_CLEAR(list);
            else
                PyList_SET_ITEM(list, i, b);
        }
    }
    free(out);
    free(lens);
    PyBuffer_Release(&data);
    return list;
}

/* "float32[*,3,4]": what must match across ranks in allgather. */
static int shape_meta(PyArrayObject *a, char *out, size_t cap)
{
    PyObject *s = PyObject_Str((PyObject *)PyArray_DESCR(a));
    const char *name = s != NULL ? PyUnicode_AsUTF8(s) : NULL;
    if (name == NULL) {
        Py_XDECREF(s);
        return -1;
    }
    int len = snprintf(out, cap, "%s[*", name);
    Py_DECREF(s);
    for (int i = 1; i < PyArray_NDIM(a) && len < (int)cap; i++)
        len += snprintf(out + len, cap - (size_t)len, ",%lld", (long long)PyArray_DIM(a, i));
    if (len < (int)cap)
        snprintf(out + len, cap - (size_t)len, "]");
    return 0;
}

static PyObject *Comm_allgather(CommObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"array", "timeout", NULL};
    PyObject *arr, *tobj = Py_None;
    double timeout;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:allgather", kwlist, &arr, &tobj) ||
        comm_live(self) == NULL || parse_timeout(tobj, &timeout) < 0)
        return NULL;
    PyArrayObject *a = (PyArrayObject *)PyArray_FROMANY(arr, NPY_NOTYPE, 0, 0,
                                                        NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED);
    if (a == NULL)
        return NULL;
    if (PyArray_NDIM(a) < 1 || PyArray_NDIM(a) > NPY_MAXDIMS - 1 || PyArray_DESCR(a)->kind == 'O') {
        Py_DECREF(a);
        return sg_raise_code(SG_EINVAL, "allgather takes a numeric array of at least one "
                                        "dimension (rows along axis 0)");
    }
    /* Phase 1: every rank's row count and "dtype[*,trailing]". */
    struct {
        uint64_t rows;
        char meta[120];
    } mine;
    memset(&mine, 0, sizeof mine);
    mine.rows = (uint64_t)PyArray_DIM(a, 0);
    void *metas = NULL, *data = NULL;
    uint64_t *lens = NULL, *dlens = NULL;
    PyObject *result = NULL;
    int n = coll_comm_size(self->comm);
    if (shape_meta(a, mine.meta, sizeof mine.meta) < 0 ||
        gather(self, &mine, sizeof mine, timeout, &metas, &lens) < 0)
        goto done;
    uint64_t rows = 0;
    const char *m0 = (const char *)metas + sizeof(uint64_t); /* rank 0's */
    for (int i = 0; i < n; i++) {
        const char *mi = (const char *)metas + (size_t)i * sizeof mine + sizeof(uint64_t);
        uint64_t ri;
        memcpy(&ri, (const char *)metas + (size_t)i * sizeof mine, sizeof ri);
        if (lens[i] != sizeof mine || strncmp(mi, m0, sizeof mine.meta) != 0) {
            sg_raise_code(SG_ECLUSTER,
                          "allgather: rank %d has %.120s, rank 0 has %.120s (dtype and trailing "
                          "shape must match on every rank)",
                          i, lens[i] == sizeof mine ? mi : "?", m0);
            goto done;
        }
        rows += ri;
    }
    /* Phase 2: the rows themselves. */
    if (gather(self, PyArray_DATA(a), (size_t)PyArray_NBYTES(a), timeout, &data, &dlens) < 0)
        goto done;
    npy_intp dims[NPY_MAXDIMS];
    dims[0] = (npy_intp)rows;
    for (int i = 1; i < PyArray_NDIM(a); i++)
        dims[i] = PyArray_DIM(a, i);
    PyArray_Descr *descr = PyArray_DESCR(a);
    Py_INCREF(descr);
    result = PyArray_NewFromDescr(&PyArray_Type, descr, PyArray_NDIM(a), dims, NULL, data,
                                  NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_WRITEABLE, NULL);
    PyObject *cap = result != NULL ? PyCapsule_New(data, "sparkgrad.coll", capsule_free) : NULL;
    if (cap == NULL || PyArray_SetBaseObject((PyArrayObject *)result, cap) < 0) {
        Py_XDECREF(cap);
        Py_CLEAR(result);
    } else {
        data = NULL; /* owned by the capsule */
    }
done:
    free(metas);
    free(lens);
    if (result == NULL)
        free(data);
    free(dlens);
    Py_DECREF(a);
    return result;
}

static PyObject *Comm_broadcast_bytes(CommObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"data", "root", "timeout", NULL};
    PyObject *dobj = Py_None, *tobj = Py_None;
    int root = 0;
    double timeout;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OiO:broadcast_bytes", kwlist, &dobj, &root,
                                     &tobj) ||
        comm_live(self) == NULL || parse_timeout(tobj, &timeout) < 0)
        return NULL;
    Py_buffer data = {0};
    int is_root = coll_comm_rank(self->comm) == root;
    if (is_root && dobj == Py_None)
        return sg_raise_code(SG_EINVAL, "broadcast_bytes: the root (rank %d) must give bytes",
                             root);
    if (is_root && PyObject_GetBuffer(dobj, &data, PyBUF_SIMPLE) < 0)
        return NULL;
    void *out = NULL;
    size_t len = 0;
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = coll_broadcast_var(self->comm, data.buf, (size_t)data.len, root, BYTES_MAX, &out, &len,
                            timeout, &err);
    Py_END_ALLOW_THREADS
    if (is_root)
        PyBuffer_Release(&data);
    if (rc < 0)
        return sg_raise(&err);
    PyObject *b = PyBytes_FromStringAndSize(out, (Py_ssize_t)len);
    free(out);
    return b;
}

static PyObject *Comm_barrier(CommObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"timeout", NULL};
    PyObject *tobj = Py_None;
    double timeout;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:barrier", kwlist, &tobj) ||
        comm_live(self) == NULL || parse_timeout(tobj, &timeout) < 0)
        return NULL;
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = coll_barrier(self->comm, timeout, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return sg_raise(&err);
    Py_RETURN_NONE;
}

/* ---- the gradient hook capsule -------------------------------------------------------- */

static void hook_release(void *ctx)
{
    coll_hook_free(ctx);
}

static PyObject *Comm_grad_hook(CommObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"op",           "compression",   "backward_passes_per_step",
                             "bucket_bytes", "sparse_tables", NULL};
    const char *opname = "average";
    PyObject *compobj = Py_None;
    int k = 1, sparse_tables = 1;
    Py_ssize_t bucket = 0;
    CollOp op;
    CollCompression comp;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|sOinp:grad_hook", kwlist, &opname, &compobj, &k,
                                     &bucket, &sparse_tables) ||
        comm_live(self) == NULL || parse_op(opname, &op) < 0 || parse_comp(compobj, &comp) < 0)
        return NULL;
    if (bucket < 0)
        return sg_raise_code(SG_EINVAL, "bucket_bytes must be >= 0 (0: no overlap), got %zd",
                             bucket);
    CollHook *h;
    SgError err;
    if (coll_hook_new(self->comm, op, comp, k, (size_t)bucket, sparse_tables, &h, &err) < 0)
        return sg_raise(&err);
    return nn_grad_hook_capsule((PyObject *)self, coll_hook_iface(h), hook_release);
}

static float *hook_grads(PyObject *obj, const char *what)
{
    PyArrayObject *a = inplace_array(obj, what);
    if (a == NULL)
        return NULL;
    if (PyArray_TYPE(a) != NPY_FLOAT32) {
        sg_raise_code(SG_EINVAL, "%s: gradients and parameters are float32", what);
        return NULL;
    }
    return PyArray_DATA(a);
}

static PyObject *py_hook_ready(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *cap, *garr;
    Py_ssize_t off, cnt;
    if (!PyArg_ParseTuple(args, "OOnn:_grad_hook_ready", &cap, &garr, &off, &cnt))
        return NULL;
    NnGradHook *g = PyCapsule_GetPointer(cap, NN_GRAD_HOOK_CAPSULE);
    float *grads = g != NULL ? hook_grads(garr, "_grad_hook_ready") : NULL;
    if (grads == NULL)
        return NULL;
    if (off < 0 || cnt < 0 || off + cnt > PyArray_SIZE((PyArrayObject *)garr))
        return sg_raise_code(SG_EINVAL, "range [%zd, %zd) outside the %lld gradients", off,
                             off + cnt, (long long)PyArray_SIZE((PyArrayObject *)garr));
    SgError err;
    int rc = 0;
    if (g->ready != NULL) {
        Py_BEGIN_ALLOW_THREADS
        rc = g->ready(g->ctx, grads, (size_t)off, (size_t)cnt, &err);
        Py_END_ALLOW_THREADS
    }
    if (rc < 0)
        return sg_raise(&err);
    Py_RETURN_NONE;
}

static PyObject *py_hook_step(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *cap, *parr, *garr;
    long long gstep = 0;
    if (!PyArg_ParseTuple(args, "OOO|L:_grad_hook_step", &cap, &parr, &garr, &gstep))
        return NULL;
    NnGradHook *g = PyCapsule_GetPointer(cap, NN_GRAD_HOOK_CAPSULE);
    float *params = g != NULL ? hook_grads(parr, "_grad_hook_step") : NULL;
    float *grads = params != NULL ? hook_grads(garr, "_grad_hook_step") : NULL;
    if (grads == NULL)
        return NULL;
    if (PyArray_SIZE((PyArrayObject *)parr) != PyArray_SIZE((PyArrayObject *)garr))
        return sg_raise_code(SG_EINVAL, "params and grads differ in size");
    size_t n = (size_t)PyArray_SIZE((PyArrayObject *)garr);
    int64_t step = gstep;
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = g->step(g->ctx, params, grads, n, NULL, 0, &step, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return sg_raise(&err);
    return Py_BuildValue("(iL)", rc, (long long)step);
}

#define HOOK_MAX_TABLES 64

/* The hook's union ids of tables[0..nt) as a list of int32 arrays. */
static PyObject *union_ids(const OptimRows *t, int nt)
{
    PyObject *out = PyList_New(nt);
    for (int i = 0; out != NULL && i < nt; i++) {
        npy_intp len = (npy_intp)t[i].nids;
        PyObject *a = PyArray_SimpleNew(1, &len, NPY_INT32);
        if (a == NULL) {
            Py_CLEAR(out);
            break;
        }
        if (len > 0)
            memcpy(PyArray_DATA((PyArrayObject *)a), t[i].ids, (size_t)len * sizeof(int32_t));
        PyList_SET_ITEM(out, i, a);
    }
    return out;
}

static PyObject *py_hook_step_rows(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *cap, *parr, *garr, *seq, *res = NULL;
    long long gstep = 0;
    if (!PyArg_ParseTuple(args, "OOOO|L:_grad_hook_step_rows", &cap, &parr, &garr, &seq, &gstep))
        return NULL;
    NnGradHook *g = PyCapsule_GetPointer(cap, NN_GRAD_HOOK_CAPSULE);
    float *params = g != NULL ? hook_grads(parr, "_grad_hook_step_rows") : NULL;
    float *grads = params != NULL ? hook_grads(garr, "_grad_hook_step_rows") : NULL;
    PyObject *fast = grads != NULL ? PySequence_Fast(seq, "tables must be a sequence") : NULL;
    if (fast == NULL)
        return NULL;
    const Py_ssize_t nt = PySequence_Fast_GET_SIZE(fast);
    OptimRows t[HOOK_MAX_TABLES];
    PyObject *keep[HOOK_MAX_TABLES] = {NULL};
    Py_ssize_t got = 0;
    if (!g->sparse)
        sg_raise_code(SG_EINVAL, "_grad_hook_step_rows: the hook is dense (sparse_tables=False)");
    else if (nt > HOOK_MAX_TABLES)
        sg_raise_code(SG_EINVAL, "_grad_hook_step_rows: %zd tables, at most %d", nt,
                      HOOK_MAX_TABLES);
    else if (PyArray_SIZE((PyArrayObject *)parr) != PyArray_SIZE((PyArrayObject *)garr))
        sg_raise_code(SG_EINVAL, "params and grads differ in size");
    else
        for (; got < nt; got++) {
            Py_ssize_t off, rows, dim;
            PyObject *ids;
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, got), "nnnO", &off, &rows, &dim,
                                  &ids))
                break;
            keep[got] = PyArray_FROM_OTF(ids, NPY_INT32, NPY_ARRAY_IN_ARRAY);
            if (keep[got] == NULL)
                break;
            if (off < 0 || rows < 0 || dim < 0) {
                sg_raise_code(SG_EINVAL, "table %zd: negative offset or shape", got);
                break;
            }
            t[got] = (OptimRows){(size_t)off, (size_t)rows, (size_t)dim,
                                 PyArray_DATA((PyArrayObject *)keep[got]),
                                 (size_t)PyArray_SIZE((PyArrayObject *)keep[got])};
        }
    if (got == nt && !PyErr_Occurred()) {
        size_t n = (size_t)PyArray_SIZE((PyArrayObject *)garr);
        int64_t step = gstep;
        SgError err;
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = g->step(g->ctx, params, grads, n, t, (int)nt, &step, &err);
        Py_END_ALLOW_THREADS
        if (rc < 0) {
            sg_raise(&err);
        } else {
            PyObject *ids = union_ids(t, (int)nt);
            res = ids != NULL ? Py_BuildValue("(iLN)", rc, (long long)step, ids) : NULL;
        }
    }
    for (Py_ssize_t i = 0; i < nt && i < HOOK_MAX_TABLES; i++)
        Py_XDECREF(keep[i]);
    Py_DECREF(fast);
    return res;
}

/* ---- the rest ---------------------------------------------------------------------------- */

static PyObject *Comm_stats(CommObject *self, PyObject *noargs)
{
    (void)noargs;
    if (self->comm == NULL)
        return sg_raise_code(SG_ESTATE, "Communicator was not initialized");
    CollStats s;
    coll_comm_stats(self->comm, &s);
    return Py_BuildValue(
        "{sKsKsKsKsKsKsKsdsOsKsKsKsO}", "bytes_sent", (unsigned long long)s.bytes_sent,
        "bytes_received", (unsigned long long)s.bytes_received, "collectives",
        (unsigned long long)s.collectives, "allreduces", (unsigned long long)s.allreduces,
        "broadcasts", (unsigned long long)s.broadcasts, "allgathers",
        (unsigned long long)s.allgathers, "barriers", (unsigned long long)s.barriers, "seconds",
        s.seconds, "broken", s.broken ? Py_True : Py_False, "tables_as_rows",
        (unsigned long long)s.tables_as_rows, "tables_dense", (unsigned long long)s.tables_dense,
        "table_bytes_sent", (unsigned long long)s.table_bytes_sent, "shared_memory",
        coll_comm_shared_memory(self->comm) ? Py_True : Py_False);
}

static PyObject *Comm_close(CommObject *self, PyObject *noargs)
{
    (void)noargs;
    if (self->comm != NULL && !self->closed) {
        self->closed = 1;
        Py_BEGIN_ALLOW_THREADS
        coll_comm_close(self->comm);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *Comm_enter(CommObject *self, PyObject *noargs)
{
    (void)noargs;
    return comm_live(self) != NULL ? Py_NewRef(self) : NULL;
}

static PyObject *Comm_exit(CommObject *self, PyObject *args)
{
    (void)args;
    PyObject *r = Comm_close(self, NULL);
    Py_XDECREF(r);
    Py_RETURN_FALSE;
}

static PyObject *Comm_get_rank(CommObject *self, void *closure)
{
    (void)closure;
    return self->comm != NULL ? PyLong_FromLong(coll_comm_rank(self->comm))
                              : sg_raise_code(SG_ESTATE, "Communicator was not initialized");
}

static PyObject *Comm_get_size(CommObject *self, void *closure)
{
    (void)closure;
    return self->comm != NULL ? PyLong_FromLong(coll_comm_size(self->comm))
                              : sg_raise_code(SG_ESTATE, "Communicator was not initialized");
}

#define KW    METH_VARARGS | METH_KEYWORDS
#define FN(f) (PyCFunction)(void (*)(void))(f)

static PyMethodDef Comm_methods[] = {
    {"allreduce", FN(Comm_allreduce), KW,
     "allreduce(array, op='sum', compression=None, timeout=None) -> array, in place "
     "(float32/float64/int32/int64; op sum|average|min|max; compression None|'fp16'|'bf16' for "
     "float32)."},
    {"broadcast", FN(Comm_broadcast), KW,
     "broadcast(array, root=0, timeout=None) -> array: root's values, in place."},
    {"allgather", FN(Comm_allgather), KW,
     "allgather(array, timeout=None) -> ndarray: every rank's rows concatenated in rank order "
     "(rows may differ; dtype and trailing shape must match)."},
    {"allgather_bytes", FN(Comm_allgather_bytes), KW,
     "allgather_bytes(data, timeout=None) -> list of every rank's bytes."},
    {"broadcast_bytes", FN(Comm_broadcast_bytes), KW,
     "broadcast_bytes(data or None, root=0, timeout=None) -> root's bytes."},
    {"barrier", FN(Comm_barrier), KW, "barrier(timeout=None)"},
    {"grad_hook", FN(Comm_grad_hook), KW,
     "grad_hook(op='average', compression=None, backward_passes_per_step=1, bucket_bytes=0, "
     "sparse_tables=True) -> PyCapsule 'sparkgrad._core.NnGradHook' for the C training loop; "
     "sparse_tables: Embedding tables reduced as their touched rows (see csrc/net/coll.h)."},
    {"stats", (PyCFunction)Comm_stats, METH_NOARGS,
     "stats() -> {bytes_sent, bytes_received, collectives, allreduces, broadcasts, allgathers, "
     "barriers, seconds, broken, tables_as_rows, tables_dense, table_bytes_sent}"},
    {"close", (PyCFunction)Comm_close, METH_NOARGS, "close(): later calls raise StateError."},
    {"__enter__", (PyCFunction)Comm_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Comm_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Comm_getset[] = {
    {"rank", (getter)Comm_get_rank, NULL, "this rank", NULL},
    {"size", (getter)Comm_get_size, NULL, "number of ranks", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Comm_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sparkgrad._core.Communicator",
    .tp_basicsize = sizeof(CommObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Communicator(listener, secret, rank, addresses, timeout=60.0, security=None, "
              "shared_memory=True): this rank of a ring of len(addresses) ranks; addresses[i] is "
              "rank i's listener (host, port). With shared_memory, ranks that all share one host "
              "move their data through /dev/shm when every rank can (stats()['shared_memory']).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Comm_init,
    .tp_dealloc = (destructor)Comm_dealloc,
    .tp_methods = Comm_methods,
    .tp_getset = Comm_getset,
};

static PyMethodDef coll_functions[] = {
    {"_grad_hook_ready", py_hook_ready, METH_VARARGS,
     "_grad_hook_ready(hook, grads, offset, count): call the hook's ready() (tests)."},
    {"_grad_hook_step_rows", py_hook_step_rows, METH_VARARGS,
     "_grad_hook_step_rows(hook, params, grads, tables, global_step=0) -> (rc, global_step, ids): "
     "call a sparse hook's step() with tables [(offset, rows, dim, ids int32)], getting the rows "
     "each table's reduced gradient holds (tests)."},
    {"_grad_hook_step", py_hook_step, METH_VARARGS,
     "_grad_hook_step(hook, params, grads, global_step=0) -> (rc, global_step): call the hook's "
     "step() (tests); rc 1 means the loop would skip its optimizer."},
    {NULL, NULL, 0, NULL},
};

int coll_module_init(PyObject *mod)
{
    if (PyModule_AddType(mod, &Comm_Type) < 0)
        return -1;
    return PyModule_AddFunctions(mod, coll_functions);
}
