/*
 * py_net_control.c - sparkgrad._core.ControlClient, a node's control
 * connection to the driver (csrc/net/control_client.h). Built only through
 * ControlClient.register(...); every network call releases the GIL.
 */
#include <stdlib.h>

#include "net/control_client.h"
#include "py/py_net.h"

#define CTL_SEND_TIMEOUT 30.0 /* default bound on one message to the driver */

typedef struct {
    PyObject_HEAD
    CtlClient *cli;
    PyObject *spec; /* list[dict], parsed on first access */
} CtlObject;

static PyTypeObject Ctl_Type;

static PyObject *Ctl_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)type, (void)args, (void)kw;
    PyErr_SetString(PyExc_TypeError,
                    "use ControlClient.register(host, port, secret, node, timeout)");
    return NULL;
}

static PyObject *Ctl_register(PyObject *cls, PyObject *args, PyObject *kw)
{
    (void)cls;
    static char *kwlist[] = {"host",           "port",     "secret",
                             "node",           "timeout",  "heartbeat_interval",
                             "driver_timeout", "security", NULL};
    const char *host, *security = NULL;
    int port;
    Py_buffer secret;
    PyObject *node;
    double timeout, hb = 1.0, driver_timeout = 30.0;
    NetSecurity mode;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "siy*O!d|ddz:register", kwlist, &host, &port,
                                     &secret, &PyDict_Type, &node, &timeout, &hb, &driver_timeout,
                                     &security))
        return NULL;
    if (py_net_security(security, &mode) < 0) {
        PyBuffer_Release(&secret);
        return NULL;
    }
    char *node_json = py_net_json_dumps(node);
    if (node_json == NULL) {
        PyBuffer_Release(&secret);
        return NULL;
    }
    SgError err;
    CtlClient *cli = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ctl_client_register(host, port, secret.buf, (size_t)secret.len, mode, node_json, timeout,
                             hb, driver_timeout, &cli, &err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&secret);
    free(node_json);
    if (rc < 0)
        return sg_raise(&err);
    CtlObject *self = PyObject_New(CtlObject, &Ctl_Type);
    if (self == NULL) {
        Py_BEGIN_ALLOW_THREADS
        ctl_client_free(cli);
        Py_END_ALLOW_THREADS
        return NULL;
    }
    self->cli = cli;
    self->spec = NULL;
    return (PyObject *)self;
}

static void Ctl_dealloc(CtlObject *self)
{
    Py_BEGIN_ALLOW_THREADS
    ctl_client_free(self->cli);
    Py_END_ALLOW_THREADS
    Py_XDECREF(self->spec);
    PyObject_Free(self);
}

static PyObject *finish(int rc, const SgError *err)
{
    if (rc < 0)
        return sg_raise(err);
    Py_RETURN_NONE;
}

static PyObject *Ctl_log(CtlObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"line", "timeout", "stream", NULL};
    const char *line, *stream = NULL;
    double timeout = CTL_SEND_TIMEOUT;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|dz:log", kwlist, &line, &timeout, &stream))
        return NULL;
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ctl_client_log(self->cli, line, stream, timeout, &err);
    Py_END_ALLOW_THREADS
    return finish(rc, &err);
}

static PyObject *Ctl_metric(CtlObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"name", "value", "step", "timeout", NULL};
    const char *name;
    double value, timeout = CTL_SEND_TIMEOUT;
    long step;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sdl|d:metric", kwlist, &name, &value, &step,
                                     &timeout))
        return NULL;
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ctl_client_metric(self->cli, name, value, step, timeout, &err);
    Py_END_ALLOW_THREADS
    return finish(rc, &err);
}

static PyObject *Ctl_done(CtlObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"result", "timeout", NULL};
    const char *result;
    double timeout = CTL_SEND_TIMEOUT;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|d:done", kwlist, &result, &timeout))
        return NULL;
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ctl_client_done(self->cli, result, timeout, &err);
    Py_END_ALLOW_THREADS
    return finish(rc, &err);
}

static PyObject *Ctl_error(CtlObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"message", "traceback", "host", "timeout", NULL};
    const char *message, *traceback, *host = "";
    double timeout = CTL_SEND_TIMEOUT;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ss|sd:error", kwlist, &message, &traceback, &host,
                                     &timeout))
        return NULL;
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ctl_client_error(self->cli, message, traceback, host, timeout, &err);
    Py_END_ALLOW_THREADS
    return finish(rc, &err);
}

static PyObject *Ctl_recv(CtlObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"timeout", NULL};
    double timeout;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "d:recv", kwlist, &timeout))
        return NULL;
    SgError err;
    char *msg = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ctl_client_recv(self->cli, timeout, &msg, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return sg_raise(&err);
    if (msg == NULL)
        Py_RETURN_NONE;
    PyObject *out = py_net_json_loads(msg);
    free(msg);
    return out;
}

static PyObject *Ctl_exit_when_orphaned(CtlObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"after", "status", "message", NULL};
    double after;
    int status;
    const char *message;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "dis:exit_when_orphaned", kwlist, &after, &status,
                                     &message))
        return NULL;
    SgError err;
    return finish(ctl_client_exit_when_orphaned(self->cli, after, status, message, &err), &err);
}

static PyObject *Ctl_interrupt(CtlObject *self, PyObject *noargs)
{
    (void)noargs;
    ctl_client_interrupt(self->cli); /* takes only the client's mutex, never held for long */
    Py_RETURN_NONE;
}

static PyObject *Ctl_close(CtlObject *self, PyObject *noargs)
{
    (void)noargs;
    Py_BEGIN_ALLOW_THREADS
    ctl_client_stop(self->cli);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *Ctl_enter(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    Py_INCREF(self);
    return self;
}

static PyObject *Ctl_exit(CtlObject *self, PyObject *args)
{
    (void)args;
    Py_DECREF(Ctl_close(self, NULL));
    Py_RETURN_FALSE;
}

static PyObject *Ctl_get_spec(CtlObject *self, void *closure)
{
    (void)closure;
    if (self->spec == NULL) {
        char *text = ctl_client_spec(self->cli);
        if (text == NULL)
            return PyErr_NoMemory();
        self->spec = py_net_json_loads(text);
        free(text);
        if (self->spec == NULL)
            return NULL;
    }
    Py_INCREF(self->spec);
    return self->spec;
}

static PyMethodDef Ctl_methods[] = {
    {"register", (PyCFunction)(void (*)(void))Ctl_register,
     METH_VARARGS | METH_KEYWORDS | METH_STATIC,
     "register(host, port, secret, node, timeout, heartbeat_interval=1.0, driver_timeout=30.0, "
     "security=None) -> ControlClient (security must be the driver's)"},
    {"log", (PyCFunction)(void (*)(void))Ctl_log, METH_VARARGS | METH_KEYWORDS,
     "log(line, timeout=30.0, stream=None): stream \"stderr\" marks a line of the node's stderr"},
    {"metric", (PyCFunction)(void (*)(void))Ctl_metric, METH_VARARGS | METH_KEYWORDS,
     "metric(name, value, step)"},
    {"done", (PyCFunction)(void (*)(void))Ctl_done, METH_VARARGS | METH_KEYWORDS,
     "done(result: str)"},
    {"error", (PyCFunction)(void (*)(void))Ctl_error, METH_VARARGS | METH_KEYWORDS,
     "error(message, traceback, host='')"},
    {"recv", (PyCFunction)(void (*)(void))Ctl_recv, METH_VARARGS | METH_KEYWORDS,
     "recv(timeout) -> dict | None: next message from the driver."},
    {"exit_when_orphaned", (PyCFunction)(void (*)(void))Ctl_exit_when_orphaned,
     METH_VARARGS | METH_KEYWORDS,
     "exit_when_orphaned(after, status, message): `after` seconds after the connection broke, "
     "unless close() came first, a thread that needs no GIL writes message to fd 2 and ends the "
     "process with status (_exit)."},
    {"interrupt", (PyCFunction)Ctl_interrupt, METH_NOARGS,
     "interrupt(): a waiting (or the next) recv returns None at once."},
    {"close", (PyCFunction)Ctl_close, METH_NOARGS,
     "close(): stop heartbeats, close the connection."},
    {"__enter__", (PyCFunction)Ctl_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Ctl_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Ctl_getset[] = {
    {"spec", (getter)Ctl_get_spec, NULL, "the cluster spec: list of node dicts", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Ctl_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sparkgrad._core.ControlClient",
    .tp_basicsize = sizeof(CtlObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "A node's authenticated control connection to the driver; see ControlClient.register.",
    .tp_new = Ctl_new,
    .tp_dealloc = (destructor)Ctl_dealloc,
    .tp_methods = Ctl_methods,
    .tp_getset = Ctl_getset,
};

int ctl_module_init(PyObject *mod)
{
    if (PyModule_AddType(mod, &Ctl_Type) < 0)
        return -1;
    return 0;
}
