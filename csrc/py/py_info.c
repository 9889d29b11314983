/*
 * py_info.c - build_info(): the versions sparkgrad._core was built against
 * and runs on. Also the import-time check that the oneDNN runtime is not
 * older than the headers we compiled against.
 */
#include "py/sg_py.h"

#include <stdio.h>
#include <zlib.h>

#include "nn/nn_version.h"
#include "record/inflate.h"
#include "rest/rest_version.h"

#ifndef SG_VERSION
#error "SG_VERSION must be defined by the build (setup.py reads _version.py)"
#endif

static PyObject *py_build_info(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    NnVersion rt = nn_onednn_runtime_version();
    NnVersion bt = nn_onednn_build_version();
    char runtime[32], headers[32];
    snprintf(runtime, sizeof runtime, "%d.%d.%d", rt.major, rt.minor, rt.patch);
    snprintf(headers, sizeof headers, "%d.%d.%d", bt.major, bt.minor, bt.patch);
    /* The inflate backend a reader opened now would use (SPARKGRAD_INFLATE
     * read now); an invalid value is reported as such, not raised. */
    SgInflateBackend backend;
    SgError err;
    const char *inflate = sg_inflate_choose(&backend, &err) == 0 ? sg_inflate_backend_name(backend)
                                                                 : "invalid SPARKGRAD_INFLATE";
    const char *isal = sg_inflate_isal_version();
    return Py_BuildValue("{s:s, s:s, s:s, s:I, s:I, s:s, s:s, s:s, s:s, s:s, s:z}", "sparkgrad",
                         SG_VERSION, "onednn", runtime, "onednn_headers", headers, "numpy_abi",
                         (unsigned)NPY_ABI_VERSION, "numpy_runtime_api",
                         (unsigned)PyArray_GetNDArrayCFeatureVersion(), "libcurl",
                         rest_curl_version(), "cjson", rest_cjson_version(), "zlib", zlibVersion(),
                         "onednn_cpu_runtime", rt.cpu_runtime == 2u ? "OpenMP" : "other", "inflate",
                         inflate, "isal", isal);
}

static PyMethodDef info_methods[] = {
    {"build_info", py_build_info, METH_NOARGS,
     "build_info() -> dict: versions of sparkgrad and the libraries it links."},
    {NULL, NULL, 0, NULL},
};

int info_module_init(PyObject *mod)
{
    NnVersion rt = nn_onednn_runtime_version();
    NnVersion bt = nn_onednn_build_version();
    if (rt.major != bt.major || rt.minor < bt.minor) {
        PyErr_Format(PyExc_ImportError,
                     "sparkgrad._core was built against oneDNN %d.%d.%d but the "
                     "loaded libdnnl is %d.%d.%d; install onednn-cpu-gomp==2023.2.0",
                     bt.major, bt.minor, bt.patch, rt.major, rt.minor, rt.patch);
        return -1;
    }
    return PyModule_AddFunctions(mod, info_methods);
}
