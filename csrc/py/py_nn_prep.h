/*
 * py_nn_prep.h - what py_nn.c takes from py_nn_prep.c: the Prep type and
 * the raw columns of preprocessed inputs.
 */
#ifndef PY_NN_PREP_H
#define PY_NN_PREP_H

#include "py/sg_py.h"

#include "nn/nn_model.h"
#include "nn/nn_prep.h"

extern PyTypeObject PrepType;

/* preps (None, or a list of a Prep or None per input) into out[ninputs]
 * (borrowed: the caller keeps the list alive); -1 with an exception. */
int nn_py_prep_list(PyObject *preps, int ninputs, const NnPrep **out);

/* A raw column o into *a: a C-contiguous float32 / int32 / int64 array
 * [n, ...] of `row` values per row, or a string column (an object with
 * .offsets int32/int64 [n * row + 1] and .data uint8, as
 * sparkgrad.nn.preprocessing.StringColumn and Arrow lay it out). *n its
 * rows; *keep a new reference to hold while a is used (or NULL). */
int nn_py_raw_column(PyObject *o, size_t row, NnArray *a, size_t *n, PyObject **keep);

#endif /* PY_NN_PREP_H */
