/*
 * py_net_rendezvous.c - sparkgrad._core.RendezvousServer, the driver side of
 * the cluster rendezvous (csrc/net/rendezvous.h). Every wait releases the GIL;
 * messages and events cross as JSON text (Python's json module on this side,
 * cJSON on the C side).
 */
#include <math.h>
#include <stdlib.h>

#include "net/rendezvous.h"
#include "py/py_net.h"

typedef struct {
    PyObject_HEAD
    RdvServer *srv;
    int num_nodes;
} RdvObject;

static RdvServer *live(RdvObject *self)
{
    if (self->srv == NULL)
        sg_raise_code(SG_ESTATE, "RendezvousServer was not initialized");
    return self->srv;
}

static int Rdv_init(RdvObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"secret",       "num_nodes", "host", "port",
                             "auth_timeout", "security",  NULL};
    Py_buffer secret;
    int num_nodes, port = 0;
    const char *host = "0.0.0.0", *security = NULL;
    double auth_timeout = 10.0;
    NetSecurity mode;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*i|sidz:RendezvousServer", kwlist, &secret,
                                     &num_nodes, &host, &port, &auth_timeout, &security))
        return -1;
    if (py_net_security(security, &mode) < 0) {
        PyBuffer_Release(&secret);
        return -1;
    }
    if (!isfinite(auth_timeout) || auth_timeout <= 0) {
        PyBuffer_Release(&secret);
        sg_raise_code(SG_EINVAL, "auth_timeout must be a positive number of seconds, got %g",
                      auth_timeout);
        return -1;
    }
    if (self->srv != NULL) {
        PyBuffer_Release(&secret);
        sg_raise_code(SG_ESTATE, "RendezvousServer is already initialized");
        return -1;
    }
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = rdv_server_start(secret.buf, (size_t)secret.len, mode, num_nodes, host, port, &self->srv,
                          &err);
    if (rc == 0)
        rdv_server_set_auth_timeout(self->srv, auth_timeout);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&secret);
    if (rc < 0) {
        sg_raise(&err);
        return -1;
    }
    self->num_nodes = num_nodes;
    return 0;
}

static void Rdv_dealloc(RdvObject *self)
{
    if (self->srv != NULL) {
        Py_BEGIN_ALLOW_THREADS
        rdv_server_free(self->srv);
        Py_END_ALLOW_THREADS
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Rdv_wait(RdvObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"timeout", NULL};
    double timeout;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "d:wait", kwlist, &timeout) || live(self) == NULL)
        return NULL;
    SgError err;
    char *spec = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = rdv_server_wait(self->srv, timeout, &spec, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return sg_raise(&err);
    PyObject *out = py_net_json_loads(spec);
    free(spec);
    return out;
}

static PyObject *Rdv_next_event(RdvObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"timeout", NULL};
    double timeout;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "d:next_event", kwlist, &timeout) ||
        live(self) == NULL)
        return NULL;
    SgError err;
    char *ev = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = rdv_server_next_event(self->srv, timeout, &ev, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return sg_raise(&err);
    if (ev == NULL)
        Py_RETURN_NONE;
    PyObject *out = py_net_json_loads(ev);
    free(ev);
    return out;
}

static char *message_text(PyObject *message)
{
    if (!PyDict_Check(message)) {
        PyErr_Format(PyExc_TypeError, "message must be a dict, got %s", Py_TYPE(message)->tp_name);
        return NULL;
    }
    return py_net_json_dumps(message);
}

static PyObject *Rdv_send(RdvObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"executor_id", "message", NULL};
    long eid;
    PyObject *message;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "lO:send", kwlist, &eid, &message) ||
        live(self) == NULL)
        return NULL;
    char *text = message_text(message);
    if (text == NULL)
        return NULL;
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = rdv_server_send(self->srv, eid, text, &err);
    Py_END_ALLOW_THREADS
    free(text);
    if (rc < 0)
        return sg_raise(&err);
    Py_RETURN_NONE;
}

static PyObject *Rdv_broadcast(RdvObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"message", NULL};
    PyObject *message;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:broadcast", kwlist, &message) ||
        live(self) == NULL)
        return NULL;
    char *text = message_text(message);
    if (text == NULL)
        return NULL;
    SgError err;
    int rc, sent = 0;
    Py_BEGIN_ALLOW_THREADS
    rc = rdv_server_broadcast(self->srv, text, &sent, &err);
    Py_END_ALLOW_THREADS
    free(text);
    if (rc < 0)
        return sg_raise(&err);
    return PyLong_FromLong(sent);
}

static PyObject *Rdv_stats(RdvObject *self, PyObject *noargs)
{
    (void)noargs;
    if (live(self) == NULL)
        return NULL;
    RdvStats st;
    rdv_server_stats(self->srv, &st);
    return Py_BuildValue("{s:l, s:l, s:l, s:l, s:l, s:l, s:i, s:s}", "accepted", st.accepted,
                         "auth_failures", st.auth_failures, "protocol_errors", st.protocol_errors,
                         "integrity_failures", st.integrity_failures, "registrations",
                         st.registrations, "events_dropped", st.events_dropped, "registered",
                         st.registered, "last_rejection", st.last_rejection);
}

static PyObject *Rdv_close(RdvObject *self, PyObject *noargs)
{
    (void)noargs;
    if (self->srv != NULL) {
        Py_BEGIN_ALLOW_THREADS
        rdv_server_stop(self->srv);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *Rdv_enter(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    Py_INCREF(self);
    return self;
}

static PyObject *Rdv_exit(RdvObject *self, PyObject *args)
{
    (void)args;
    PyObject *r = Rdv_close(self, NULL);
    Py_XDECREF(r);
    if (r == NULL)
        return NULL;
    Py_RETURN_FALSE;
}

static PyObject *Rdv_get_host(RdvObject *self, void *closure)
{
    (void)closure;
    return live(self) ? PyUnicode_FromString(rdv_server_host(self->srv)) : NULL;
}

static PyObject *Rdv_get_port(RdvObject *self, void *closure)
{
    (void)closure;
    return live(self) ? PyLong_FromLong(rdv_server_port(self->srv)) : NULL;
}

static PyObject *Rdv_get_num_nodes(RdvObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromLong(self->num_nodes);
}

static PyObject *Rdv_get_hb(RdvObject *self, void *closure)
{
    (void)closure;
    return live(self) ? PyFloat_FromDouble(rdv_server_heartbeat_timeout(self->srv)) : NULL;
}

static int Rdv_set_hb(RdvObject *self, PyObject *value, void *closure)
{
    (void)closure;
    if (live(self) == NULL)
        return -1;
    double v = value != NULL ? PyFloat_AsDouble(value) : -1.0;
    if (v == -1.0 && PyErr_Occurred())
        return -1;
    if (!isfinite(v) || v <= 0) {
        sg_raise_code(SG_EINVAL, "heartbeat_timeout must be a positive number of seconds, got %g",
                      v);
        return -1;
    }
    rdv_server_set_heartbeat_timeout(self->srv, v);
    return 0;
}

static PyMethodDef Rdv_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))Rdv_wait, METH_VARARGS | METH_KEYWORDS,
     "wait(timeout) -> list[dict]: the cluster spec once every executor id registered."},
    {"next_event", (PyCFunction)(void (*)(void))Rdv_next_event, METH_VARARGS | METH_KEYWORDS,
     "next_event(timeout) -> dict | None: the next log/metric/done/error/lost event."},
    {"send", (PyCFunction)(void (*)(void))Rdv_send, METH_VARARGS | METH_KEYWORDS,
     "send(executor_id, message: dict): queue a message to one node."},
    {"broadcast", (PyCFunction)(void (*)(void))Rdv_broadcast, METH_VARARGS | METH_KEYWORDS,
     "broadcast(message: dict) -> int: queue a message to every connected node."},
    {"stats", (PyCFunction)Rdv_stats, METH_NOARGS,
     "stats() -> dict: accepted, auth_failures, protocol_errors, integrity_failures, "
     "registrations, ..."},
    {"close", (PyCFunction)Rdv_close, METH_NOARGS, "close(): stop the thread, close every socket."},
    {"__enter__", (PyCFunction)Rdv_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Rdv_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Rdv_getset[] = {
    {"host", (getter)Rdv_get_host, NULL, "bound address", NULL},
    {"port", (getter)Rdv_get_port, NULL, "bound port", NULL},
    {"num_nodes", (getter)Rdv_get_num_nodes, NULL, "nodes expected", NULL},
    {"heartbeat_timeout", (getter)Rdv_get_hb, (setter)Rdv_set_hb,
     "seconds of silence after which a node is lost (default 10)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Rdv_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sparkgrad._core.RendezvousServer",
    .tp_basicsize = sizeof(RdvObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RendezvousServer(secret, num_nodes, host='0.0.0.0', port=0, auth_timeout=10.0, "
              "security=None): the driver's rendezvous (security: 'none', 'auth', 'encrypt'; "
              "None: the default).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Rdv_init,
    .tp_dealloc = (destructor)Rdv_dealloc,
    .tp_methods = Rdv_methods,
    .tp_getset = Rdv_getset,
};

int rdv_module_init(PyObject *mod)
{
    if (PyModule_AddType(mod, &Rdv_Type) < 0)
        return -1;
    return 0;
}
