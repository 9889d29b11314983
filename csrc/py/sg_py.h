/*
 * sg_py.h - what the binding files of sparkgrad._core share: the NumPy C-API
 * import symbol, the status-to-exception raiser and each file's init hook.
 * One .c file per exposed type or function group; each defines
 * `<name>_module_init(PyObject *mod)`, called in order from PyInit__core.
 */
#ifndef SG_PY_H
#define SG_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Built against NumPy 2 headers, loadable from NumPy 1.21 on: the NumPy of
 * Databricks 13.3 LTS is 1.21.5 (C-API 0xe, shared by 1.20 and 1.21). */
#define NPY_NO_DEPRECATED_API  NPY_1_21_API_VERSION
#define NPY_TARGET_VERSION     NPY_1_21_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL sparkgrad_ARRAY_API
#ifndef SG_PY_MODULE_MAIN
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#include "common/sg_status.h"

/* Raises the sparkgrad.errors class that SG_STATUS_LIST names for err->code,
 * with err->msg; always returns NULL. */
PyObject *sg_raise(const SgError *err);

/* As sg_raise, with keyword details for the exception's constructor
 * (a dict, or NULL), e.g. RestError's status and error_code. */
PyObject *sg_raise_details(const SgError *err, PyObject *details);

/* As sg_raise, from a code and a printf-style message. */
PyObject *sg_raise_code(int code, const char *fmt, ...);

/* Module init hooks, one per binding file; each returns 0 or -1 with an
 * exception set. */
int info_module_init(PyObject *mod);
int record_module_init(PyObject *mod);
int record_example_module_init(PyObject *mod);
int record_dataset_module_init(PyObject *mod);
int record_sequence_module_init(PyObject *mod);
int nn_module_init(PyObject *mod);
int nn_optim_module_init(PyObject *mod);
int nn_prep_module_init(PyObject *mod);
int net_module_init(PyObject *mod);
int rdv_module_init(PyObject *mod);
int ctl_module_init(PyObject *mod);
int ps_module_init(PyObject *mod);
int coll_module_init(PyObject *mod);
int feed_module_init(PyObject *mod);
int rest_module_init(PyObject *mod);
int table_module_init(PyObject *mod);

#endif /* SG_PY_H */
