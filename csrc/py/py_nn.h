/*
 * py_nn.h - what the two nn binding files share: the Optimizer object (used
 * by Model.train_steps) and the float32-array argument check.
 */
#ifndef PY_NN_H
#define PY_NN_H

#include "py/sg_py.h"

#include "nn/nn_hook.h"
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

/* A capsule named NN_GRAD_HOOK_CAPSULE holding a copy of *hook (nn/nn_hook.h)
 * and a reference to owner, whose state the hook points into. When the
 * capsule dies, release(hook->ctx) runs with the GIL released (NULL: nothing
 * to release) and owner is released. On failure release runs at once and NULL
 * is returned with an exception set. */
PyObject *nn_grad_hook_capsule(PyObject *owner, const NnGradHook *hook, void (*release)(void *ctx));

#endif /* PY_NN_H */
