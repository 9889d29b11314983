/*
 * py_net.c - sparkgrad._core.Listener (a TCP socket bound and listening from
 * construction until close, so no other process can take its port between
 * registration and use) and the frame codec helpers the tests and fuzz
 * reproducers call (_frame_encode, _frame_decode).
 */
#include "py/py_net.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "net/frame.h"
#include "net/sock.h"

typedef struct {
    PyObject_HEAD
    int fd;
    int port;
    char host[64];
} ListenerObject;

static PyTypeObject Listener_Type;

int py_listener_fd(PyObject *obj)
{
    if (!PyObject_TypeCheck(obj, &Listener_Type)) {
        PyErr_Format(PyExc_TypeError, "expected a sparkgrad._core.Listener, got %s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    ListenerObject *l = (ListenerObject *)obj;
    if (l->fd < 0) {
        sg_raise_code(SG_ESTATE, "Listener on port %d is closed", l->port);
        return -1;
    }
    return l->fd;
}

static PyObject *json_module_call(const char *fn, PyObject *arg)
{
    PyObject *json = PyImport_ImportModule("json");
    if (json == NULL)
        return NULL;
    PyObject *out = PyObject_CallMethod(json, fn, "O", arg);
    Py_DECREF(json);
    return out;
}

PyObject *py_net_json_loads(const char *text)
{
    PyObject *s = PyUnicode_FromString(text);
    if (s == NULL)
        return NULL;
    PyObject *out = json_module_call("loads", s);
    Py_DECREF(s);
    return out;
}

char *py_net_json_dumps(PyObject *obj)
{
    PyObject *s = json_module_call("dumps", obj);
    if (s == NULL)
        return NULL;
    const char *utf8 = PyUnicode_AsUTF8(s);
    char *out = utf8 != NULL ? strdup(utf8) : NULL;
    if (utf8 != NULL && out == NULL)
        PyErr_NoMemory();
    Py_DECREF(s);
    return out;
}

static int Listener_init(ListenerObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"host", "port", NULL};
    const char *host = "0.0.0.0";
    int port = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|si:Listener", kwlist, &host, &port))
        return -1;
    if (self->fd >= 0)
        close(self->fd);
    self->fd = -1;
    SgError err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = net_listen(host, port, 1024, &self->fd, &self->port, self->host, sizeof self->host, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        sg_raise(&err);
        return -1;
    }
    return 0;
}

static PyObject *Listener_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)args, (void)kw;
    ListenerObject *self = (ListenerObject *)type->tp_alloc(type, 0);
    if (self != NULL)
        self->fd = -1;
    return (PyObject *)self;
}

static void Listener_dealloc(ListenerObject *self)
{
    net_close(&self->fd);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Listener_close(ListenerObject *self, PyObject *noargs)
{
    (void)noargs;
    net_close(&self->fd);
    Py_RETURN_NONE;
}

static PyObject *Listener_fileno(ListenerObject *self, PyObject *noargs)
{
    (void)noargs;
    if (self->fd < 0)
        return sg_raise_code(SG_ESTATE, "Listener on port %d is closed", self->port);
    return PyLong_FromLong(self->fd);
}

static PyObject *Listener_enter(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    Py_INCREF(self);
    return self;
}

static PyObject *Listener_exit(ListenerObject *self, PyObject *args)
{
    (void)args;
    net_close(&self->fd);
    Py_RETURN_FALSE;
}

static PyObject *Listener_repr(ListenerObject *self)
{
    return PyUnicode_FromFormat("<Listener %s:%d%s>", self->host, self->port,
                                self->fd < 0 ? " closed" : "");
}

static PyObject *Listener_get_host(ListenerObject *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(self->host);
}

static PyObject *Listener_get_port(ListenerObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromLong(self->port);
}

static PyObject *Listener_get_closed(ListenerObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->fd < 0);
}

static PyMethodDef Listener_methods[] = {
    {"close", (PyCFunction)Listener_close, METH_NOARGS, "close(): release the port."},
    {"fileno", (PyCFunction)Listener_fileno, METH_NOARGS, "fileno() -> int: the listening socket."},
    {"__enter__", (PyCFunction)Listener_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Listener_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Listener_getset[] = {
    {"host", (getter)Listener_get_host, NULL, "numeric address the socket is bound to", NULL},
    {"port", (getter)Listener_get_port, NULL, "port actually bound", NULL},
    {"closed", (getter)Listener_get_closed, NULL, "True after close()", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Listener_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sparkgrad._core.Listener",
    .tp_basicsize = sizeof(ListenerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Listener(host='0.0.0.0', port=0): a TCP socket bound and listening until close().",
    .tp_new = Listener_new,
    .tp_init = (initproc)Listener_init,
    .tp_dealloc = (destructor)Listener_dealloc,
    .tp_repr = (reprfunc)Listener_repr,
    .tp_methods = Listener_methods,
    .tp_getset = Listener_getset,
};

/* _frame_encode(type, flags, payload) -> bytes (header + payload). */
static PyObject *py_frame_encode(PyObject *self, PyObject *args)
{
    (void)self;
    int type, flags;
    Py_buffer payload;
    if (!PyArg_ParseTuple(args, "iiy*:_frame_encode", &type, &flags, &payload))
        return NULL;
    if (type < 0 || type > 255 || flags < 0 || flags > 65535 || (size_t)payload.len > UINT32_MAX) {
        PyBuffer_Release(&payload);
        return sg_raise_code(SG_EINVAL, "frame type 0..255, flags 0..65535, payload < 4 GiB");
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, NET_FRAME_HEADER_SIZE + payload.len);
    if (out != NULL) {
        uint8_t *p = (uint8_t *)PyBytes_AS_STRING(out);
        net_frame_header_encode(p, (uint8_t)type, (uint16_t)flags, (uint32_t)payload.len);
        memcpy(p + NET_FRAME_HEADER_SIZE, payload.buf, (size_t)payload.len);
    }
    PyBuffer_Release(&payload);
    return out;
}

/* _frame_decode(data, max_payload) -> list of (type, flags, payload) for the
 * complete frames in data, fed to the resumable parser in chunks of `chunk`
 * bytes, and the count of trailing bytes of an incomplete frame. */
static PyObject *py_frame_decode(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer data;
    unsigned int max_payload = NET_FRAME_MAX_DEFAULT;
    Py_ssize_t chunk = 0;
    if (!PyArg_ParseTuple(args, "y*|In:_frame_decode", &data, &max_payload, &chunk))
        return NULL;
    NetFrameParser p;
    net_frame_parser_init(&p, max_payload);
    SgError err;
    int rc = 0;
    PyObject *frames = PyList_New(0);
    const uint8_t *buf = data.buf;
    size_t off = 0, len = (size_t)data.len, step = chunk > 0 ? (size_t)chunk : len;
    while (frames != NULL && off < len) {
        size_t n = len - off < step ? len - off : step, used = 0;
        rc = net_frame_parser_feed(&p, buf + off, n, &used, &err);
        off += used;
        if (rc < 0)
            break;
        if (rc == 1) {
            NetFrameHeader h;
            uint8_t *payload;
            net_frame_parser_take(&p, &h, &payload);
            PyObject *t = Py_BuildValue("(iiy#)", h.type, h.flags, payload ? (char *)payload : "",
                                        (Py_ssize_t)h.length);
            free(payload);
            if (t == NULL || PyList_Append(frames, t) < 0)
                Py_CLEAR(frames);
            Py_XDECREF(t);
        }
    }
    size_t pending = p.hdr_have + p.payload_have;
    net_frame_parser_free(&p);
    PyBuffer_Release(&data);
    if (frames == NULL)
        return NULL;
    if (rc < 0) {
        Py_DECREF(frames);
        return sg_raise(&err);
    }
    PyObject *out = Py_BuildValue("(Nn)", frames, (Py_ssize_t)pending);
    return out;
}

static PyMethodDef net_methods[] = {
    {"_frame_encode", py_frame_encode, METH_VARARGS,
     "_frame_encode(type, flags, payload) -> bytes: one wire frame."},
    {"_frame_decode", py_frame_decode, METH_VARARGS,
     "_frame_decode(data, max_payload=64 MiB, chunk=0) -> ([(type, flags, payload)], "
     "pending_bytes)."},
    {NULL, NULL, 0, NULL},
};

int py_net_security(const char *text, NetSecurity *mode)
{
    if (text == NULL) {
        *mode = NET_SEC_DEFAULT;
        return 0;
    }
    SgError err;
    if (net_security_parse(text, mode, &err) < 0) {
        PyErr_SetString(PyExc_ValueError, err.msg);
        return -1;
    }
    return 0;
}

int net_module_init(PyObject *mod)
{
    if (PyModule_AddType(mod, &Listener_Type) < 0)
        return -1;
    if (PyModule_AddIntConstant(mod, "FRAME_MAX_DEFAULT", NET_FRAME_MAX_DEFAULT) < 0 ||
        PyModule_AddIntConstant(mod, "FRAME_HEADER_SIZE", NET_FRAME_HEADER_SIZE) < 0 ||
        PyModule_AddStringConstant(mod, "SECURITY_DEFAULT", net_security_name(NET_SEC_DEFAULT)) < 0)
        return -1;
    return PyModule_AddFunctions(mod, net_methods);
}
