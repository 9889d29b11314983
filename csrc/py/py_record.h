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

#endif /* SG_PY_RECORD_H */
