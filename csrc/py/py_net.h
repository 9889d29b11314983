/*
 * py_net.h - helpers shared by the network bindings (py_net*.c): the
 * Listener type's fd, JSON conversion through Python's json module, and
 * secret/timeout argument checks.
 */
#ifndef PY_NET_H
#define PY_NET_H

#include "net/session.h"
#include "py/sg_py.h"

/* The listening fd of a sparkgrad._core.Listener (-1 with TypeError /
 * StateError set if obj is not an open Listener). */
int py_listener_fd(PyObject *obj);

/* json.loads(text) / json.dumps(obj) -> malloc'd UTF-8; NULL with an
 * exception set on failure. */
PyObject *py_net_json_loads(const char *text);
char *py_net_json_dumps(PyObject *obj);

/* The security= argument of every server and client: NULL (not given) is
 * NET_SEC_DEFAULT, else "none", "auth" or "encrypt". Returns 0, or -1 with
 * ValueError naming the text. */
int py_net_security(const char *text, NetSecurity *mode);

#endif /* PY_NET_H */
