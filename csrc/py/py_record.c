/*
 * py_record.c - TFRecordReader, TFRecordWriter and CRC32C for Python.
 *
 * The reader yields each record as bytes; file reads, decompression and CRC
 * checks run with the GIL released. A reader or writer is not meant to be
 * shared between threads: a second concurrent call raises StateError.
 */
#include "py/py_record.h"

#include <structmember.h>

#include "record/crc32c.h"
#include "record/tfrecord.h"

PyObject *record_raise(const SgError *err, const char *path, long long offset)
{
    sg_raise(err);
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value != NULL) {
        if (path != NULL) {
            PyObject *p = PyUnicode_DecodeFSDefault(path);
            if (p != NULL)
                PyObject_SetAttrString(value, "path", p);
            Py_XDECREF(p);
        }
        if (offset >= 0) {
            PyObject *o = PyLong_FromLongLong(offset);
            if (o != NULL)
                PyObject_SetAttrString(value, "offset", o);
            Py_XDECREF(o);
        }
        PyErr_Clear();
    }
    PyErr_Restore(type, value, tb);
    return NULL;
}

int record_compression_converter(PyObject *obj, void *out)
{
    TfrCompression *comp = out;
    if (obj == Py_None) {
        *comp = TFR_NONE;
        return 1;
    }
    if (!PyUnicode_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "compression must be None, 'ZLIB' or 'GZIP', not %.80s",
                     Py_TYPE(obj)->tp_name);
        return 0;
    }
    SgError err;
    const char *s = PyUnicode_AsUTF8(obj);
    if (s == NULL)
        return 0;
    if (tfr_compression_parse(s, comp, &err) < 0) {
        sg_raise(&err);
        return 0;
    }
    return 1;
}

/* ---- crc32c ---- */

static PyObject *py_crc32c(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    unsigned int start = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*|I:crc32c", &buf, &start))
        return NULL;
    uint32_t c;
    Py_BEGIN_ALLOW_THREADS
    c = crc32c_extend(start, buf.buf, (size_t)buf.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    return PyLong_FromUnsignedLong(c);
}

static PyObject *py_masked_crc32c(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*:masked_crc32c", &buf))
        return NULL;
    uint32_t c = crc32c_mask(crc32c(buf.buf, (size_t)buf.len));
    PyBuffer_Release(&buf);
    return PyLong_FromUnsignedLong(c);
}

static PyObject *py_crc32c_hardware(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return PyBool_FromLong(crc32c_hardware());
}

/* ---- TFRecordReader ---- */

typedef struct {
    PyObject_HEAD
    TfrReader *reader;
    Py_buffer mem; /* held while reading from memory */
    int has_mem;
    int busy;
} ReaderObject;

static void reader_dealloc(ReaderObject *self)
{
    tfr_reader_close(self->reader);
    if (self->has_mem)
        PyBuffer_Release(&self->mem);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *reader_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"path", "compression", "verify_crc", "data", "name", NULL};
    PyObject *path_obj = Py_None, *path_bytes = NULL;
    TfrCompression comp = TFR_NONE;
    int verify = 1;
    Py_buffer data = {0};
    const char *name = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO&py*z:TFRecordReader", kwlist, &path_obj,
                                     record_compression_converter, &comp, &verify, &data, &name))
        return NULL;
    if ((path_obj == Py_None) == (data.obj == NULL)) {
        if (data.obj)
            PyBuffer_Release(&data);
        PyErr_SetString(PyExc_TypeError, "TFRecordReader needs exactly one of path or data");
        return NULL;
    }
    ReaderObject *self = (ReaderObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        goto fail;
    SgError err;
    int rc;
    if (data.obj != NULL) {
        self->mem = data;
        self->has_mem = 1;
        data.obj = NULL;
        rc = tfr_reader_open_memory(&self->reader, self->mem.buf, (size_t)self->mem.len, comp,
                                    verify, name ? name : "<bytes>", &err);
    } else {
        if (!PyUnicode_FSConverter(path_obj, &path_bytes))
            goto fail;
        const char *path = PyBytes_AS_STRING(path_bytes);
        Py_BEGIN_ALLOW_THREADS
        rc = tfr_reader_open(&self->reader, path, comp, verify, &err);
        Py_END_ALLOW_THREADS
        if (rc < 0) {
            record_raise(&err, path, -1);
            goto fail;
        }
    }
    if (rc < 0) {
        sg_raise(&err);
        goto fail;
    }
    Py_XDECREF(path_bytes);
    return (PyObject *)self;
fail:
    if (data.obj)
        PyBuffer_Release(&data);
    Py_XDECREF(path_bytes);
    Py_XDECREF(self);
    return NULL;
}

static PyObject *reader_iternext(ReaderObject *self)
{
    if (self->reader == NULL)
        return NULL;
    if (self->busy)
        return sg_raise_code(SG_ESTATE, "TFRecordReader used from two threads at once");
    const uint8_t *d;
    size_t len;
    SgError err;
    int rc;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = tfr_reader_next(self->reader, &d, &len, &err);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    if (rc < 0)
        return record_raise(&err, tfr_reader_name(self->reader),
                            (long long)tfr_reader_position(self->reader));
    if (rc == 0)
        return NULL; /* StopIteration */
    return PyBytes_FromStringAndSize((const char *)d, (Py_ssize_t)len);
}

static PyObject *reader_get_offset(ReaderObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLongLong(tfr_reader_offset(self->reader));
}

static PyObject *reader_get_name(ReaderObject *self, void *closure)
{
    (void)closure;
    return PyUnicode_DecodeFSDefault(tfr_reader_name(self->reader));
}

static PyGetSetDef reader_getset[] = {
    {"offset", (getter)reader_get_offset, NULL, "stream offset of the last record returned", NULL},
    {"name", (getter)reader_get_name, NULL, "the file (or name given for bytes) being read", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sparkgrad._core.TFRecordReader",
    .tp_basicsize = sizeof(ReaderObject),
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "TFRecordReader(path=None, compression=None, verify_crc=True, data=None, name=None)\n"
              "Iterates the records of a TFRecord file (or of bytes given as data) as bytes.",
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)reader_iternext,
    .tp_getset = reader_getset,
    .tp_new = reader_new,
};

/* ---- TFRecordWriter ---- */

typedef struct {
    PyObject_HEAD
    TfrWriter *writer;
    PyObject *path;
    int busy;
} WriterObject;

static int writer_ready(WriterObject *self)
{
    if (self->writer == NULL) {
        sg_raise_code(SG_ESTATE, "TFRecordWriter for %R is closed", self->path);
        return 0;
    }
    if (self->busy) {
        sg_raise_code(SG_ESTATE, "TFRecordWriter for %R used from two threads at once", self->path);
        return 0;
    }
    return 1;
}

static PyObject *writer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"path", "compression", NULL};
    PyObject *path_bytes = NULL;
    TfrCompression comp = TFR_NONE;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&|O&:TFRecordWriter", kwlist,
                                     PyUnicode_FSConverter, &path_bytes,
                                     record_compression_converter, &comp))
        return NULL;
    WriterObject *self = (WriterObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(path_bytes);
        return NULL;
    }
    self->path = PyUnicode_DecodeFSDefault(PyBytes_AS_STRING(path_bytes));
    SgError err;
    int rc;
    const char *path = PyBytes_AS_STRING(path_bytes);
    Py_BEGIN_ALLOW_THREADS
    rc = tfr_writer_open(&self->writer, path, comp, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        record_raise(&err, path, -1);
        Py_DECREF(path_bytes);
        Py_DECREF(self);
        return NULL;
    }
    Py_DECREF(path_bytes);
    return (PyObject *)self;
}

static PyObject *writer_write(WriterObject *self, PyObject *arg)
{
    if (!writer_ready(self))
        return NULL;
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    SgError err;
    int rc;
    self->busy = 1;
    if (buf.len < 65536) {
        rc = tfr_writer_write(self->writer, buf.buf, (size_t)buf.len, &err);
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = tfr_writer_write(self->writer, buf.buf, (size_t)buf.len, &err);
        Py_END_ALLOW_THREADS
    }
    self->busy = 0;
    PyBuffer_Release(&buf);
    if (rc < 0)
        return sg_raise(&err);
    Py_RETURN_NONE;
}

static PyObject *writer_flush(WriterObject *self, PyObject *noargs)
{
    (void)noargs;
    if (!writer_ready(self))
        return NULL;
    SgError err;
    int rc;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = tfr_writer_flush(self->writer, &err);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    if (rc < 0)
        return sg_raise(&err);
    Py_RETURN_NONE;
}

static PyObject *writer_close(WriterObject *self, PyObject *noargs)
{
    (void)noargs;
    if (self->writer == NULL)
        Py_RETURN_NONE;
    if (!writer_ready(self))
        return NULL;
    TfrWriter *w = self->writer;
    self->writer = NULL;
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = tfr_writer_close(w, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return sg_raise(&err);
    Py_RETURN_NONE;
}

static PyObject *writer_enter(WriterObject *self, PyObject *noargs)
{
    (void)noargs;
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *writer_exit(WriterObject *self, PyObject *args)
{
    (void)args;
    return writer_close(self, NULL);
}

static void writer_dealloc(WriterObject *self)
{
    tfr_writer_close(self->writer, NULL);
    Py_XDECREF(self->path);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef writer_methods[] = {
    {"write", (PyCFunction)writer_write, METH_O,
     "write(record): append one record (any bytes-like object)"},
    {"flush", (PyCFunction)writer_flush, METH_NOARGS,
     "flush(): hand buffered records to the OS (ends at a record boundary)"},
    {"close", (PyCFunction)writer_close, METH_NOARGS,
     "close(): finish the stream and close the file; closing again does nothing"},
    {"__enter__", (PyCFunction)writer_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)writer_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef writer_members[] = {
    {"path", T_OBJECT, offsetof(WriterObject, path), READONLY, "the path being written"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sparkgrad._core.TFRecordWriter",
    .tp_basicsize = sizeof(WriterObject),
    .tp_dealloc = (destructor)writer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "TFRecordWriter(path, compression=None): writes a TFRecord file byte-compatible with "
              "TensorFlow's (compression None, 'ZLIB' or 'GZIP'); a context manager, not for use "
              "from two threads at once.",
    .tp_methods = writer_methods,
    .tp_members = writer_members,
    .tp_new = writer_new,
};

static PyMethodDef record_methods[] = {
    {"crc32c", py_crc32c, METH_VARARGS,
     "crc32c(data, start=0) -> int: CRC32C (Castagnoli) of data, continuing from the CRC start "
     "(0: a fresh checksum)"},
    {"masked_crc32c", py_masked_crc32c, METH_VARARGS,
     "masked_crc32c(data) -> int: TFRecord's masked CRC32C (the CRC rotated right by 15 bits plus "
     "0xa282ead8)"},
    {"crc32c_hardware", py_crc32c_hardware, METH_NOARGS,
     "crc32c_hardware() -> bool: whether the SSE4.2 instruction is used"},
    {NULL, NULL, 0, NULL},
};

int record_module_init(PyObject *mod)
{
    if (PyModule_AddType(mod, &ReaderType) < 0 || PyModule_AddType(mod, &WriterType) < 0)
        return -1;
    return PyModule_AddFunctions(mod, record_methods);
}
