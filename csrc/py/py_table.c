/*
 * py_table.c - sparkgrad._core.TableReader: Arrow record batches in (through
 * the C data interface, no copy: the PyCapsules of pyarrow >= 14, or the
 * structs older pyarrow's _export_to_c fills; a chunk of binary values keeps
 * its batch instead of copying them), shuffled batches of NumPy
 * arrays out. Wrapped by sparkgrad.data.ParquetDataset, which reads the
 * files and plans epochs and shards; converting and gathering run with the
 * GIL released.
 */
#include "py/sg_py.h"

#include <stdlib.h>
#include <string.h>

#include "table/batcher.h"
#include "table/pool.h"
#include "table/table.h"

typedef struct {
    PyObject_HEAD
    TblPool *pool;
} TablePoolObject;

static PyObject *pool_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"max_bytes", NULL};
    Py_ssize_t max_bytes;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n:TablePool", kwlist, &max_bytes))
        return NULL;
    if (max_bytes < 0)
        return sg_raise_code(SG_EINVAL, "TablePool: max_bytes %zd must be >= 0", max_bytes);
    TablePoolObject *self = (TablePoolObject *)type->tp_alloc(type, 0);
    SgError err = {0};
    if (self != NULL && tbl_pool_new(&self->pool, (size_t)max_bytes, &err) < 0) {
        Py_DECREF(self);
        return sg_raise(&err);
    }
    return (PyObject *)self;
}

static void pool_dealloc(TablePoolObject *self)
{
    tbl_pool_free(self->pool);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *pool_bytes(TablePoolObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromSize_t(tbl_pool_bytes(self->pool));
}

static PyGetSetDef pool_getset[] = {
    {"bytes", (getter)pool_bytes, NULL, "bytes of free buffers held", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TablePoolType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sparkgrad._core.TablePool",
    .tp_basicsize = sizeof(TablePoolObject),
    .tp_dealloc = (destructor)pool_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "TablePool(max_bytes): chunk buffers reused by the TableReaders given it (thread-safe).",
    .tp_getset = pool_getset,
    .tp_new = pool_new,
};

typedef struct {
    PyObject_HEAD
    TablePoolObject *pool; /* or NULL */
    TblPlan *plans;
    PyObject **names; /* [nplans] the plans' names as bytes, owning plans[i].name */
    size_t nplans;
    TblBatcher *batcher;
    TblRelease *lent; /* the batches chunks borrowed, released with the GIL held */
    int busy;         /* a call runs without the GIL */
} TableReaderObject;

static void reader_free_plans(TableReaderObject *self)
{
    for (size_t i = 0; self->names != NULL && i < self->nplans; i++)
        Py_XDECREF(self->names[i]);
    PyMem_Free(self->names);
    PyMem_Free(self->plans);
    self->names = NULL;
    self->plans = NULL;
}

/* plans: a sequence of (name, width, truncate, nulls, fill, pad[, ints]). */
static int parse_plans(TableReaderObject *self, PyObject *plans)
{
    PyObject *seq = PySequence_Fast(plans, "plans must be a sequence of tuples");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    self->nplans = (size_t)n;
    self->plans = PyMem_Calloc((size_t)n + 1, sizeof *self->plans);
    self->names = PyMem_Calloc((size_t)n + 1, sizeof *self->names);
    if (self->plans == NULL || self->names == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name;
        Py_ssize_t width;
        int truncate, nulls, ints = 0;
        double fill, pad;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "O&npidd|p:plan",
                              PyUnicode_FSConverter, &name, &width, &truncate, &nulls, &fill, &pad,
                              &ints)) {
            Py_DECREF(seq);
            return -1;
        }
        self->names[i] = name;
        if (width < 0 || nulls < TBL_NULLS_ERROR || nulls > TBL_NULLS_SKIP) {
            Py_DECREF(seq);
            sg_raise_code(SG_EINVAL, "plan of column '%s': width %zd, nulls %d",
                          PyBytes_AS_STRING(name), width, nulls);
            return -1;
        }
        self->plans[i] = (TblPlan){.name = PyBytes_AS_STRING(name),
                                   .width = (size_t)width,
                                   .truncate = truncate,
                                   .nulls = (TblNulls)nulls,
                                   .fill = (float)fill,
                                   .pad = (float)pad,
                                   .ints = ints};
    }
    Py_DECREF(seq);
    return 0;
}

static PyObject *reader_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"plans", "batch_size", "shuffle_buffer", "seed", "pool", NULL};
    PyObject *plans, *pool = Py_None;
    Py_ssize_t batch_size, shuffle = 0;
    unsigned long long seed = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "On|nKO:TableReader", kwlist, &plans,
                                     &batch_size, &shuffle, &seed, &pool))
        return NULL;
    if (pool != Py_None && !PyObject_TypeCheck(pool, &TablePoolType))
        return sg_raise_code(SG_EINVAL, "TableReader: pool must be a TablePool or None");
    if (batch_size < 1 || shuffle < 0)
        return sg_raise_code(SG_EINVAL,
                             "TableReader: batch_size %zd must be >= 1, shuffle_buffer %zd >= 0",
                             batch_size, shuffle);
    TableReaderObject *self = (TableReaderObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    if (pool != Py_None) {
        Py_INCREF(pool);
        self->pool = (TablePoolObject *)pool;
    }
    if (parse_plans(self, plans) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    SgError err = {0};
    if (tbl_batcher_new(&self->batcher, (size_t)batch_size, (size_t)shuffle, (uint64_t)seed, &err) <
            0 ||
        tbl_release_new(&self->lent, &err) < 0) {
        Py_DECREF(self);
        return sg_raise(&err);
    }
    return (PyObject *)self;
}

/* The record batch of obj.__arrow_c_array__() (pyarrow >= 14), moved out of
 * its two capsules. */
static int import_capsules(PyObject *batch, struct ArrowSchema *schema, struct ArrowArray *array)
{
    PyObject *pair = PyObject_CallMethod(batch, "__arrow_c_array__", NULL);
    if (pair == NULL)
        return -1;
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
        Py_DECREF(pair);
        sg_raise_code(SG_EINVAL, "__arrow_c_array__() must return (schema capsule, array capsule)");
        return -1;
    }
    struct ArrowSchema *s = PyCapsule_GetPointer(PyTuple_GET_ITEM(pair, 0), "arrow_schema");
    struct ArrowArray *a =
        s != NULL ? PyCapsule_GetPointer(PyTuple_GET_ITEM(pair, 1), "arrow_array") : NULL;
    if (a == NULL || s->release == NULL || a->release == NULL) {
        Py_DECREF(pair);
        if (!PyErr_Occurred())
            sg_raise_code(SG_EINVAL, "the Arrow capsules were already consumed");
        return -1;
    }
    *schema = *s; /* moved: the capsules' destructors see them released */
    *array = *a;
    s->release = NULL;
    a->release = NULL;
    Py_DECREF(pair);
    return 0;
}

/* The record batch obj._export_to_c(array address, schema address) writes
 * into the caller's structs (pyarrow before 14, which has no capsules; the
 * buffers are shared, not copied, as through capsules). The caller releases
 * them as it does moved ones; on failure whichever of the two the producer
 * filled is released here. */
static int import_exported(PyObject *batch, struct ArrowSchema *schema, struct ArrowArray *array)
{
    memset(schema, 0, sizeof *schema);
    memset(array, 0, sizeof *array);
    PyObject *res =
        PyObject_CallMethod(batch, "_export_to_c", "KK", (unsigned long long)(uintptr_t)array,
                            (unsigned long long)(uintptr_t)schema);
    if (res == NULL)
        goto fail;
    Py_DECREF(res);
    if (array->release != NULL && schema->release != NULL)
        return 0;
    sg_raise_code(SG_EINVAL, "_export_to_c() did not fill both the ArrowArray and the ArrowSchema");
fail:
    if (array->release != NULL)
        array->release(array);
    if (schema->release != NULL)
        schema->release(schema);
    return -1;
}

/* push(batch, file, row_group, first_row, capsule=True) -> rows kept:
 * converts one record batch, a pyarrow.RecordBatch or any object with
 * __arrow_c_array__ (capsule), or with _export_to_c (not capsule: pyarrow
 * before 14). */
static PyObject *reader_push(TableReaderObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"batch", "file", "row_group", "first_row", "capsule", NULL};
    PyObject *batch, *file;
    long long row_group, first_row;
    int capsule = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO&LL|p:push", kwlist, &batch,
                                     PyUnicode_FSConverter, &file, &row_group, &first_row,
                                     &capsule))
        return NULL;
    if (self->busy) {
        Py_DECREF(file);
        return sg_raise_code(SG_ESTATE, "TableReader used by two threads at once");
    }
    struct ArrowSchema schema;
    struct ArrowArray array;
    int imported =
        capsule ? import_capsules(batch, &schema, &array) : import_exported(batch, &schema, &array);
    if (imported < 0) {
        Py_DECREF(file);
        return NULL;
    }
    TblWhere where = {PyBytes_AS_STRING(file), row_group, first_row};
    SgError err = {0};
    TblChunk *chunk = NULL;
    size_t kept = 0;
    int rc;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = tbl_chunk_from_arrow(&chunk, &schema, &array, self->plans, self->nplans, &where,
                              self->pool != NULL ? self->pool->pool : NULL, self->lent, &err);
    if (rc == 0) {
        kept = chunk->rows;
        rc = tbl_batcher_push(self->batcher, chunk, &err);
    }
    Py_END_ALLOW_THREADS
    self->busy = 0;
    /* with the GIL: the producer's buffers may hold Python objects. A chunk that borrowed the
     * array took it (release NULL here); those of chunks freed since are released now */
    if (array.release != NULL)
        array.release(&array);
    schema.release(&schema);
    tbl_release_drain(self->lent);
    Py_DECREF(file);
    if (rc < 0)
        return sg_raise(&err);
    return PyLong_FromSize_t(kept);
}

static void free_capsule(PyObject *cap)
{
    free(PyCapsule_GetPointer(cap, "sparkgrad.table"));
}

/* A NumPy array over malloc'ed data it then owns; *data is NULL afterwards. */
static PyObject *owned_array(void **data, int ndim, npy_intp *dims, int type)
{
    PyObject *arr = PyArray_SimpleNewFromData(ndim, dims, type, *data);
    PyObject *cap = arr != NULL ? PyCapsule_New(*data, "sparkgrad.table", free_capsule) : NULL;
    if (cap == NULL || PyArray_SetBaseObject((PyArrayObject *)arr, cap) < 0) {
        Py_XDECREF(cap); /* freed the data when it holds it */
        if (cap == NULL)
            free(*data);
        Py_XDECREF(arr);
        *data = NULL;
        return NULL;
    }
    *data = NULL;
    return arr;
}

/* One column of a batch: ("f", values float32 [rows, width], lengths [rows]
 * or None), ("i", ids int64 [rows, width], lengths or None) or ("s", offsets
 * int64 [rows + 1], bytes uint8). Takes its buffers. */
static PyObject *column_tuple(TblColumn *col, size_t rows)
{
    PyObject *a, *b;
    if (col->out == TBL_OUT_STR) {
        npy_intp no = (npy_intp)rows + 1, nb = (npy_intp)col->offsets[rows];
        a = owned_array((void **)&col->offsets, 1, &no, NPY_INT64);
        b = a != NULL ? owned_array((void **)&col->bytes, 1, &nb, NPY_UINT8) : NULL;
        return b != NULL ? Py_BuildValue("(sNN)", "s", a, b) : (Py_XDECREF(a), NULL);
    }
    npy_intp dims[2] = {(npy_intp)rows, (npy_intp)col->width}, nl = (npy_intp)rows;
    const char *kind = col->out == TBL_OUT_I64 ? "i" : "f";
    if (col->out == TBL_OUT_I64)
        a = owned_array((void **)&col->ints, 2, dims, NPY_INT64);
    else
        a = owned_array((void **)&col->values, 2, dims, NPY_FLOAT32);
    if (a == NULL)
        return NULL;
    if (col->lengths == NULL)
        return Py_BuildValue("(sNO)", kind, a, Py_None);
    b = owned_array((void **)&col->lengths, 1, &nl, NPY_INT32);
    return b != NULL ? Py_BuildValue("(sNN)", kind, a, b) : (Py_DECREF(a), NULL);
}

/* next(final=False) -> (rows, [column tuple, ...]) or None: the next batch,
 * None when more rows must be pushed (or, when final, none are left). */
static PyObject *reader_next(TableReaderObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"final", NULL};
    int final = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|p:next", kwlist, &final))
        return NULL;
    if (self->busy)
        return sg_raise_code(SG_ESTATE, "TableReader used by two threads at once");
    SgError err = {0};
    TblChunk *batch = NULL;
    int rc;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = tbl_batcher_next(self->batcher, final, &batch, &err);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    tbl_release_drain(self->lent); /* the batches of the chunks this batch emptied */
    if (rc < 0)
        return sg_raise(&err);
    if (rc == 0)
        Py_RETURN_NONE;
    PyObject *cols = PyList_New((Py_ssize_t)batch->ncols);
    for (size_t i = 0; cols != NULL && i < batch->ncols; i++) {
        PyObject *t = column_tuple(&batch->cols[i], batch->rows);
        if (t == NULL)
            Py_CLEAR(cols);
        else
            PyList_SET_ITEM(cols, (Py_ssize_t)i, t);
    }
    size_t rows = batch->rows;
    tbl_chunk_free(batch); /* the buffers taken are NULL in it */
    return cols != NULL ? Py_BuildValue("(nN)", (Py_ssize_t)rows, cols) : NULL;
}

/* widths() -> [(kind, width, lengths)]: what the chunks so far settled
 * ("f" / "s" / "" not yet known). */
static PyObject *reader_widths(TableReaderObject *self, PyObject *noargs)
{
    (void)noargs;
    PyObject *out = PyList_New((Py_ssize_t)self->nplans);
    for (size_t i = 0; out != NULL && i < self->nplans; i++) {
        const TblPlan *p = &self->plans[i];
        const char *kind = p->out == TBL_OUT_F32   ? "f"
                           : p->out == TBL_OUT_STR ? "s"
                           : p->out == TBL_OUT_I64 ? "i"
                                                   : "";
        PyObject *t =
            Py_BuildValue("(snO)", kind, (Py_ssize_t)p->width, p->lengths ? Py_True : Py_False);
        if (t == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, (Py_ssize_t)i, t);
    }
    return out;
}

static PyObject *reader_pending(TableReaderObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromSize_t(tbl_batcher_rows(self->batcher));
}

static void reader_dealloc(TableReaderObject *self)
{
    tbl_batcher_free(self->batcher); /* its chunks' buffers go back to the pool first */
    tbl_release_free(self->lent);    /* and their borrowed batches are released, with the GIL */
    reader_free_plans(self);
    Py_XDECREF(self->pool);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef reader_methods[] = {
    {"push", (PyCFunction)(void (*)(void))reader_push, METH_VARARGS | METH_KEYWORDS,
     "push(batch, file, row_group, first_row, capsule=True) -> rows kept: convert an Arrow record "
     "batch, taken through __arrow_c_array__ (capsule) or _export_to_c"},
    {"next", (PyCFunction)(void (*)(void))reader_next, METH_VARARGS | METH_KEYWORDS,
     "next(final=False) -> (rows, columns) or None: the next shuffled batch"},
    {"widths", (PyCFunction)reader_widths, METH_NOARGS,
     "widths() -> [(kind, width, lengths)]: each column's settled output"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef reader_getset[] = {
    {"pending", (getter)reader_pending, NULL, "rows pushed and not yet in a batch", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TableReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sparkgrad._core.TableReader",
    .tp_basicsize = sizeof(TableReaderObject),
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "TableReader(plans, batch_size, shuffle_buffer=0, seed=0, pool=None): Arrow record "
              "batches -> shuffled batches (use sparkgrad.data.ParquetDataset).",
    .tp_methods = reader_methods,
    .tp_getset = reader_getset,
    .tp_new = reader_new,
};

int table_module_init(PyObject *mod)
{
    if (PyModule_AddType(mod, &TablePoolType) < 0)
        return -1;
    return PyModule_AddType(mod, &TableReaderType);
}
