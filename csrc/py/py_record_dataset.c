/*
 * py_record_dataset.c - sparkgrad._core.Dataset: the C input pipeline as a
 * Python iterator of dicts of NumPy arrays (wrapped by
 * sparkgrad.data.TFRecordDataset). Waiting for a batch releases the GIL and
 * wakes every 100 ms to let Ctrl-C through; `timeout` bounds the whole wait.
 */
#include "py/py_record.h"

#include <stdlib.h>

#include "common/sg_clock.h"
#include "record/dataset.h"

typedef struct {
    PyObject_HEAD
    Dataset *ds;
    SchemaObject *schema;
    double timeout;
    int busy;
} DatasetObject;

static PyObject *dataset_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"paths",          "schema",        "batch_size",  "shuffle_buffer",
                             "seed",           "epochs",        "shard_index", "num_shards",
                             "drop_remainder", "compression",   "prefetch",    "verify_crc",
                             "timeout",        "parse_threads", NULL};
    PyObject *paths;
    SchemaObject *schema;
    Py_ssize_t batch_size, shuffle = 0, shard_index = 0, num_shards = 1, prefetch = 2;
    Py_ssize_t parse_threads = 1;
    unsigned long long seed = 0;
    long long epochs = 1;
    int drop = 0, verify = 1;
    double timeout = 600.0;
    DsConfig cfg = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!n|nKLnnpO&npdn:Dataset", kwlist, &paths,
                                     &SchemaType, &schema, &batch_size, &shuffle, &seed, &epochs,
                                     &shard_index, &num_shards, &drop, record_compression_converter,
                                     &cfg.comp, &prefetch, &verify, &timeout, &parse_threads))
        return NULL;
    if (batch_size < 1 || shuffle < 0 || shard_index < 0 || num_shards < 1 || prefetch < 0 ||
        timeout <= 0 || parse_threads < 1)
        return sg_raise_code(SG_EINVAL,
                             "Dataset: batch_size (%zd), num_shards (%zd) and parse_threads "
                             "must be >= 1, "
                             "shuffle_buffer, shard_index and prefetch >= 0, timeout > 0",
                             batch_size, num_shards);
    PyObject *seq = PySequence_Fast(paths, "paths must be a list of file names");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **encoded = PyMem_Calloc((size_t)n + 1, sizeof *encoded);
    const char **names = PyMem_Calloc((size_t)n + 1, sizeof *names);
    DatasetObject *self = NULL;
    if (encoded == NULL || names == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(seq, i), &encoded[i]))
            goto done;
        names[i] = PyBytes_AS_STRING(encoded[i]);
    }
    cfg.paths = names;
    cfg.npaths = (size_t)n;
    cfg.verify_crc = verify;
    cfg.schema = &schema->schema;
    cfg.batch_size = (size_t)batch_size;
    cfg.shuffle_buffer = (size_t)shuffle;
    cfg.seed = seed;
    cfg.epochs = epochs;
    cfg.shard_index = (size_t)shard_index;
    cfg.num_shards = (size_t)num_shards;
    cfg.drop_remainder = drop;
    cfg.prefetch = (size_t)prefetch;
    cfg.parse_threads = (size_t)parse_threads;
    self = (DatasetObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        goto done;
    Py_INCREF(schema);
    self->schema = schema;
    self->timeout = timeout;
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ds_open(&self->ds, &cfg, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        sg_raise(&err);
        Py_CLEAR(self);
    }
done:
    if (encoded)
        for (Py_ssize_t i = 0; i < n; i++)
            Py_XDECREF(encoded[i]);
    PyMem_Free(encoded);
    PyMem_Free(names);
    Py_DECREF(seq);
    return (PyObject *)self;
}

static PyObject *dataset_iternext(DatasetObject *self)
{
    if (self->ds == NULL)
        return NULL;
    if (self->busy)
        return sg_raise_code(SG_ESTATE, "Dataset iterated from two threads at once");
    self->busy = 1;
    double start = sg_now();
    ExBatch *batch = NULL;
    SgError err;
    int rc;
    for (;;) {
        double left = self->timeout - (sg_now() - start);
        double slice = left < 0.1 ? left : 0.1;
        if (slice <= 0)
            slice = 0.001;
        Py_BEGIN_ALLOW_THREADS
        rc = ds_next(self->ds, &batch, slice, &err);
        Py_END_ALLOW_THREADS
        if (rc != SG_ETIMEOUT)
            break;
        if (sg_now() - start >= self->timeout) {
            self->busy = 0;
            return sg_raise_code(SG_ETIMEOUT,
                                 "waited %.1f s for the next batch from the reader thread "
                                 "(%zu files); raise timeout= for slow storage",
                                 self->timeout, ds_file_count(self->ds));
        }
        if (PyErr_CheckSignals() < 0) {
            self->busy = 0;
            return NULL;
        }
    }
    self->busy = 0;
    if (rc < 0)
        return sg_raise(&err);
    if (rc == 0)
        return NULL; /* StopIteration */
    PyObject *out = record_batch_to_dict(self->schema, batch);
    ds_release(self->ds, batch);
    return out;
}

static PyObject *dataset_close(DatasetObject *self, PyObject *noargs)
{
    (void)noargs;
    if (self->busy)
        return sg_raise_code(SG_ESTATE, "Dataset closed while another thread iterates it");
    Dataset *ds = self->ds;
    self->ds = NULL;
    int orphaned = 0;
    if (ds != NULL) {
        Py_BEGIN_ALLOW_THREADS
        orphaned = ds_close(ds);
        Py_END_ALLOW_THREADS
    }
    if (orphaned)
        Py_INCREF(self->schema); /* the blocked thread still parses with it */
    Py_RETURN_NONE;
}

static void dataset_dealloc(DatasetObject *self)
{
    int orphaned = 0;
    if (self->ds != NULL) {
        Py_BEGIN_ALLOW_THREADS
        orphaned = ds_close(self->ds);
        Py_END_ALLOW_THREADS
    }
    if (!orphaned) /* else the blocked thread still parses with it */
        Py_XDECREF(self->schema);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef dataset_methods[] = {
    {"close", (PyCFunction)dataset_close, METH_NOARGS,
     "close(): stop the reader thread and free the buffers"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DatasetType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sparkgrad._core.Dataset",
    .tp_basicsize = sizeof(DatasetObject),
    .tp_dealloc = (destructor)dataset_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Dataset(paths, schema, batch_size, ...): batches of parsed Examples "
              "(use sparkgrad.data.TFRecordDataset).",
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)dataset_iternext,
    .tp_methods = dataset_methods,
    .tp_new = dataset_new,
};

int record_dataset_module_init(PyObject *mod)
{
    return PyModule_AddType(mod, &DatasetType);
}
