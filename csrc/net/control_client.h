/*
 * control_client.h - a node's control connection to the driver's rendezvous
 * server (protocol in rendezvous.h).
 *
 * ctl_client_register connects, authenticates, registers and waits for the
 * cluster spec; a background thread then sends heartbeats every
 * heartbeat_interval and queues whatever the driver sends until
 * ctl_client_stop. The driver sends a heartbeat every second; after
 * driver_timeout seconds without any frame from it the connection counts as
 * broken (SG_ETIMEOUT from recv), so a node never outlives a vanished driver. Sending and receiving
 * are thread-safe and bounded.
 */
#ifndef NET_CONTROL_CLIENT_H
#define NET_CONTROL_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"
#include "net/session.h"

typedef struct CtlClient CtlClient;

/* node_json: {"host","port","role","index","executor_id","pid"}. mode
 * (session.h) must be the driver's: every frame after the handshake, both
 * ways, is protected by the connection's session. Fails with
 * SG_ERDV_TIMEOUT (no spec in time; says how many had registered),
 * SG_EAUTH (wrong secret, another security mode, or a frame from the driver
 * that failed its integrity check, naming driver, frame type and seq), SG_EIO / SG_ETIMEOUT (cannot
 * connect; names host:port), SG_ECLUSTER (the driver rejected the registration) or SG_ECANCELLED.
 */
int ctl_client_register(const char *host, int port, const uint8_t *secret, size_t secret_len,
                        NetSecurity mode, const char *node_json, double timeout,
                        double heartbeat_interval, double driver_timeout, CtlClient **out,
                        SgError *err);

/* The latest cluster spec as a JSON array, malloc'd for the caller (NULL
 * only when out of memory). */
char *ctl_client_spec(CtlClient *c);

/* Messages to the driver; each blocks at most timeout seconds. */
/* stream: NULL for the node's stdout, else the stream's name ("stderr"), passed on in the event. */
int ctl_client_log(CtlClient *c, const char *line, const char *stream, double timeout,
                   SgError *err);
int ctl_client_metric(CtlClient *c, const char *name, double value, long step, double timeout,
                      SgError *err);
int ctl_client_done(CtlClient *c, const char *result, double timeout, SgError *err);
int ctl_client_error(CtlClient *c, const char *message, const char *traceback, const char *host,
                     double timeout, SgError *err);

/* Next message from the driver as JSON text (malloc'd), or NULL after
 * timeout; once the queue is empty a broken connection is reported
 * (SG_EPEER naming the driver). */
int ctl_client_recv(CtlClient *c, double timeout, char **json, SgError *err);

/* Makes a recv that is waiting (or the next one) return at once with no
 * message, so a thread that polls recv can be told to look at its own state
 * without waiting out its timeout. */
void ctl_client_interrupt(CtlClient *c);

/* A backstop for a node that is its own process: once the connection has
 * broken (the driver gone, or silent for driver_timeout), a thread of its own
 * waits `after` more seconds and, unless ctl_client_stop came first, writes
 * `message` (and a newline) to fd 2 and ends the process with `status`
 * (_exit). It needs no other thread, so it ends a process whose Python is
 * stuck with the GIL held. Once per client: SG_ESTATE the second time;
 * SG_EINVAL for after outside (0, 86400] or status outside [0, 255]. */
int ctl_client_exit_when_orphaned(CtlClient *c, double after, int status, const char *message,
                                  SgError *err);

/* Stops the heartbeat thread and closes the connection (idempotent);
 * ctl_client_free stops if needed and frees. */
void ctl_client_stop(CtlClient *c);
void ctl_client_free(CtlClient *c);

#endif /* NET_CONTROL_CLIENT_H */
