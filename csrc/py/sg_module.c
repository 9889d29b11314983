/*
 * sg_module.c - PyInit__core and the one status-to-exception table.
 *
 * The exception classes live in sparkgrad/errors.py; the table below names
 * them by the strings in SG_STATUS_LIST and looks them up when an error is
 * raised, so the module keeps no global Python state.
 */
#define SG_PY_MODULE_MAIN
#include "py/sg_py.h"

#include <stdarg.h>
#include <stdio.h>

typedef struct ExceptionEntry {
    int code;
    const char *name;
} ExceptionEntry;

static const ExceptionEntry exception_table[] = {
#define SG_EXC_ENTRY(name, value, pyname) {name, pyname},
    SG_STATUS_LIST(SG_EXC_ENTRY)
#undef SG_EXC_ENTRY
};

static const char *exception_name(int code)
{
    for (size_t i = 0; i < sizeof exception_table / sizeof *exception_table; i++)
        if (exception_table[i].code == code)
            return exception_table[i].name;
    return "SparkgradError";
}

PyObject *sg_raise(const SgError *err)
{
    return sg_raise_details(err, NULL);
}

PyObject *sg_raise_details(const SgError *err, PyObject *details)
{
    if (err->code == SG_ENOMEM)
        return PyErr_NoMemory();
    PyObject *errors = PyImport_ImportModule("sparkgrad.errors");
    if (errors == NULL)
        return NULL;
    PyObject *cls = PyObject_GetAttrString(errors, exception_name(err->code));
    Py_DECREF(errors);
    if (cls == NULL)
        return NULL;
    PyObject *args = Py_BuildValue("(s)", err->msg);
    PyObject *exc = args != NULL ? PyObject_Call(cls, args, details) : NULL;
    Py_XDECREF(args);
    Py_DECREF(cls);
    if (exc == NULL)
        return NULL;
    PyObject *code = PyLong_FromLong(err->code);
    if (code != NULL) {
        PyObject_SetAttrString(exc, "code", code);
        Py_DECREF(code);
    }
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
    return NULL;
}

PyObject *sg_raise_code(int code, const char *fmt, ...)
{
    SgError err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err.msg, sizeof err.msg, fmt, ap);
    va_end(ap);
    err.code = code;
    return sg_raise(&err);
}

/* _raise_status(code, message): raise the exception mapped to a status code.
 * Lets tests pin the table without provoking every failure. */
static PyObject *py_raise_status(PyObject *self, PyObject *args)
{
    int code;
    const char *msg;
    (void)self;
    if (!PyArg_ParseTuple(args, "is:_raise_status", &code, &msg))
        return NULL;
    return sg_raise_code(code, "%s", msg);
}

static PyObject *py_status_codes(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < sizeof exception_table / sizeof *exception_table; i++) {
        PyObject *code = PyLong_FromLong(exception_table[i].code);
        int rc = code == NULL ? -1 : PyDict_SetItemString(out, exception_table[i].name, code);
        Py_XDECREF(code);
        if (rc < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static PyMethodDef module_methods[] = {
    {"_raise_status", py_raise_status, METH_VARARGS,
     "_raise_status(code, message): raise the exception mapped to a C status."},
    {"status_codes", py_status_codes, METH_NOARGS,
     "status_codes() -> dict: exception class name -> C status code."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "sparkgrad._core",
    .m_doc = "sparkgrad's C core: records, network engine, cluster transport.",
    .m_size = 0,
    .m_methods = module_methods,
};

typedef int (*ModuleInit)(PyObject *mod);

static const ModuleInit module_inits[] = {
    info_module_init,
    record_module_init,
    record_example_module_init,
    record_dataset_module_init,
    record_sequence_module_init,
    nn_optim_module_init,
    nn_module_init,
    nn_prep_module_init,
    net_module_init,
    rdv_module_init,
    ctl_module_init,
    ps_module_init,
    coll_module_init,
    feed_module_init,
    rest_module_init,
    table_module_init,
};

PyMODINIT_FUNC PyInit__core(void)
{
    import_array();
    PyObject *mod = PyModule_Create(&core_module);
    if (mod == NULL)
        return NULL;
    for (size_t i = 0; i < sizeof module_inits / sizeof *module_inits; i++) {
        if (module_inits[i](mod) < 0) {
            Py_DECREF(mod);
            return NULL;
        }
    }
    if (PyErr_Occurred()) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
