/*
 * py_record.h - what the record binding files (py_record*.c) share.
 */
#ifndef SG_PY_RECORD_H
#define SG_PY_RECORD_H

#include "py/sg_py.h"

/* sg_raise(err), then sets `path` (if not NULL) and `offset` (if >= 0) on the
 * exception, so callers can inspect where a file went wrong. Returns NULL. */
PyObject *record_raise(const SgError *err, const char *path, long long offset);

/* Parses compression=None|"ZLIB"|"GZIP"|"" into *out (PyArg "O&" converter). */
int record_compression_converter(PyObject *obj, void *out);

#include "record/example_parse.h"

/* A compiled parsing schema (sparkgrad._core.Schema). */
typedef struct {
    PyObject_HEAD
    ExSchema schema;
    PyObject *names;  /* list of str, one per spec */
    PyObject *shapes; /* list of tuples: the per-record shape of each spec */
} SchemaObject;

extern PyTypeObject SchemaType;

/* The NumPy type number of a numeric output dtype. */
int record_typenum(ExDtype t);

/* Bytes value k of concatenated values, as a new bytes object. */
PyObject *record_bytes_value(const ExValues *v, size_t k);

/* Turns the batch's columns into a dict name -> ndarray (FIXED, RAW) or
 * (values, row_splits) (VARLEN), taking over the column buffers; the batch is
 * reset for reuse. Needs the GIL. */
PyObject *record_batch_to_dict(SchemaObject *schema, ExBatch *batch);
#endif /* SG_PY_RECORD_H */
