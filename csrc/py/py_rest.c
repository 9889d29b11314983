/*
 * py_rest.c - sparkgrad._core.RestClient: the transport of the Databricks
 * client (csrc/rest/rest_client.h). call() releases the GIL for all attempts
 * and backoff sleeps, taking it back every 100 ms only to run signal handlers
 * (Ctrl-C stops a call); a failure raises sparkgrad.errors.RestError with
 * status, error_code, message, method, path and attempts. Endpoints, config
 * and token refresh are Python (sparkgrad/databricks/).
 */
#include <stdlib.h>
#include <string.h>

#include "py/sg_py.h"
#include "rest/rest_client.h"

typedef struct {
    PyObject_HEAD
    char *host;
    char *user_agent;
    RestClientConfig cfg;
} RestClientObject;

static char *dup_or_null(const char *s)
{
    return s != NULL ? strdup(s) : NULL;
}

static int RestClient_init(RestClientObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {
        "host",       "timeout", "budget", "backoff", "max_response", "allow_http_loopback",
        "user_agent", NULL};
    const char *host, *agent = NULL;
    double timeout = 60, budget = 300, backoff = 1;
    Py_ssize_t max_response = (Py_ssize_t)256 << 20;
    int allow_http = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|$dddnpz:RestClient", kwlist, &host, &timeout,
                                     &budget, &backoff, &max_response, &allow_http, &agent))
        return -1;
    if (self->host != NULL) {
        sg_raise_code(SG_ESTATE, "RestClient is already initialized");
        return -1;
    }
    if (max_response <= 0) {
        sg_raise_code(SG_EINVAL, "max_response must be > 0 bytes");
        return -1;
    }
    RestClientConfig cfg = {.host = host,
                            .timeout_s = timeout,
                            .budget_s = budget,
                            .backoff_s = backoff,
                            .max_response = (size_t)max_response,
                            .allow_http_loopback = allow_http};
    SgError err;
    if (rest_config_check(&cfg, &err) < 0) {
        sg_raise(&err);
        return -1;
    }
    self->host = dup_or_null(host);
    self->user_agent = dup_or_null(agent);
    if (self->host == NULL || (agent != NULL && self->user_agent == NULL)) {
        PyErr_NoMemory();
        return -1;
    }
    cfg.host = self->host;
    cfg.user_agent = self->user_agent;
    /* libcurl is loaded here, not at import; without it every call says why */
    if (rest_pool_new(&cfg.pool, &err) < 0)
        cfg.pool = NULL;
    self->cfg = cfg;
    return 0;
}

static void RestClient_dealloc(RestClientObject *self)
{
    rest_pool_free(self->cfg.pool);
    free(self->host);
    free(self->user_agent);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* [(status or None, reason, wait_s), ...] of the retried attempts. */
static PyObject *trace_list(const RestTrace *trace)
{
    PyObject *out = PyList_New(trace->n);
    for (int i = 0; out != NULL && i < trace->n; i++) {
        long status = trace->at[i].status;
        PyObject *item =
            Py_BuildValue("(Nsd)", status ? PyLong_FromLong(status) : Py_NewRef(Py_None),
                          trace->at[i].reason, trace->at[i].wait_s);
        if (item == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, item);
    }
    return out;
}

static PyObject *raise_rest(const SgError *err, const RestFailure *fail, PyObject *retries,
                            const char *method, const char *path)
{
    if (err->code != SG_EREST)
        return sg_raise(err);
    PyObject *details = Py_BuildValue(
        "{s:N,s:s,s:s,s:s,s:s,s:i,s:O}", "status",
        fail->status ? PyLong_FromLong(fail->status) : Py_NewRef(Py_None), "error_code",
        fail->error_code, "message", fail->message[0] ? fail->message : err->msg, "method", method,
        "path", path, "attempts", fail->attempts, "retries", retries);
    if (details == NULL)
        return NULL;
    sg_raise_details(err, details);
    Py_DECREF(details);
    return NULL;
}

/* RestCancel of a call made with the GIL released: takes the GIL back for a
 * moment to run Python's signal handlers (Ctrl-C raises KeyboardInterrupt,
 * which stops the call). A no-op outside the main thread. */
static int signals_pending(void *ctx)
{
    PyThreadState **ts = ctx;
    PyEval_RestoreThread(*ts);
    int stop = PyErr_CheckSignals() < 0;
    *ts = PyEval_SaveThread();
    return stop;
}

static PyObject *RestClient_call(RestClientObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"method",        "path",       "body", "content_type",
                             "authorization", "idempotent", NULL};
    const char *method, *path, *ctype = NULL, *auth = NULL;
    PyObject *body_obj = Py_None;
    int idempotent = 0;
    if (self->host == NULL)
        return sg_raise_code(SG_ESTATE, "RestClient was not initialized");
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ss|O$zzp:call", kwlist, &method, &path, &body_obj,
                                     &ctype, &auth, &idempotent))
        return NULL;
    if (path[0] != '/')
        return sg_raise_code(SG_EINVAL, "path '%s' must start with '/'", path);
    Py_buffer body = {0};
    if (body_obj != Py_None && PyObject_GetBuffer(body_obj, &body, PyBUF_SIMPLE) < 0)
        return NULL;
    RestCall call = {.method = method,
                     .path = path,
                     .authorization = auth,
                     .content_type = ctype,
                     .body = body_obj != Py_None ? body.buf : NULL,
                     .body_len = body_obj != Py_None ? (size_t)body.len : 0,
                     .idempotent = idempotent};
    RestResult res;
    RestFailure fail;
    RestTrace trace;
    SgError err;
    PyThreadState *ts = PyEval_SaveThread(); /* the GIL is released for the whole call */
    RestCancel cancel = {.cancelled = signals_pending, .ctx = &ts};
    call.cancel = &cancel;
    int st = rest_client_call(&self->cfg, &call, &res, &fail, &trace, &err);
    PyEval_RestoreThread(ts);
    if (body_obj != Py_None)
        PyBuffer_Release(&body);
    if (st == SG_ECANCELLED && PyErr_Occurred())
        return NULL; /* KeyboardInterrupt (or what a signal handler raised) */
    PyObject *retries = trace_list(&trace), *out = NULL;
    if (retries != NULL && st < 0)
        raise_rest(&err, &fail, retries, method, path);
    else if (retries != NULL)
        out =
            Py_BuildValue("(ly#y#Od)", res.status, (const char *)res.body, (Py_ssize_t)res.body_len,
                          res.headers, (Py_ssize_t)res.headers_len, retries, res.elapsed_s);
    Py_XDECREF(retries);
    if (st == 0)
        rest_result_free(&res);
    return out;
}

static PyObject *RestClient_get_host(RestClientObject *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(self->host != NULL ? self->host : "");
}

static PyObject *RestClient_get_timeout(RestClientObject *self, void *closure)
{
    (void)closure;
    return PyFloat_FromDouble(self->cfg.timeout_s);
}

static PyObject *RestClient_get_budget(RestClientObject *self, void *closure)
{
    (void)closure;
    return PyFloat_FromDouble(self->cfg.budget_s);
}

static PyGetSetDef RestClient_getset[] = {
    {"host", (getter)RestClient_get_host, NULL, "the workspace URL", NULL},
    {"timeout", (getter)RestClient_get_timeout, NULL, "seconds per request", NULL},
    {"budget", (getter)RestClient_get_budget, NULL, "seconds for all attempts of a call", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef RestClient_methods[] = {
    {"call", (PyCFunction)(void (*)(void))RestClient_call, METH_VARARGS | METH_KEYWORDS,
     "call(method, path, body=None, *, content_type=None, authorization=None, "
     "idempotent=False) -> (status, body, headers, retries, elapsed_s): one call with "
     "retries (429 always; 503 and sent-then-dropped requests when idempotent) inside the "
     "budget; the GIL is released throughout. headers is the final response's raw "
     "'Name: value' lines; retries lists (status or None, reason, wait_s) of each retried "
     "attempt. Raises RestError (with .retries)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RestClient_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sparkgrad._core.RestClient",
    .tp_basicsize = sizeof(RestClientObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RestClient(host, *, timeout=60.0, budget=300.0, backoff=1.0, "
              "max_response=256 MiB, allow_http_loopback=False, user_agent=None): HTTPS "
              "transport to one Databricks workspace (libcurl, opened on first call).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)RestClient_init,
    .tp_dealloc = (destructor)RestClient_dealloc,
    .tp_methods = RestClient_methods,
    .tp_getset = RestClient_getset,
};

int rest_module_init(PyObject *mod)
{
    if (PyModule_AddType(mod, &RestClient_Type) < 0)
        return -1;
    return 0;
}
