/*
 * py_nn.h - what the two nn binding files share: the Optimizer object (used
 * by Model.train_steps) and the float32-array argument check.
 */
#ifndef PY_NN_H
#define PY_NN_H

#include "py/sg_py.h"

#include "nn/nn_model.h"
#include "nn/nn_optim.h"

typedef struct OptimizerObject {
    PyObject_HEAD
    Optimizer *opt;
    size_t n;
    int busy;
} OptimizerObject;

extern PyTypeObject OptimizerType;

/* The data pointer of a C-contiguous float32 array of n elements (n ==
 * (size_t)-1: any size), or NULL with TypeError/ValueError set. */
float *nn_float_array(PyObject *obj, const char *name, size_t n, int writable);

#endif /* PY_NN_H */
