/*
 * rendezvous.h - the driver's rendezvous server.
 *
 * Nodes connect, pass the HMAC challenge (auth.h) and send
 *   {"type":"register","node":{"host","port","role","index","executor_id","pid"[,"comm_port"]}}
 * (comm_port, optional: a second listening port, the allreduce communicator's; kept in the spec)
 * The server answers {"type":"registered","registered":k,"num_nodes":n}, and
 * when num_nodes distinct executor ids (0..num_nodes-1) have registered it
 * sends every node {"type":"spec","spec":[node, ...]} (sorted by executor_id).
 * Connections stay open: nodes send heartbeat frames and
 * log/metric/done/error messages, which become events stamped with the
 * sender's executor_id, role and index; a connection that drops, or sends
 * nothing for heartbeat_timeout, before "done"/"error" becomes a "lost"
 * event. A bad message gets {"type":"reject","reason":...} and a close.
 * After the handshake every frame both ways is protected by the
 * connection's session (session.h); a frame that fails its seq or tag
 * closes that connection with a reject naming it (counted in
 * integrity_failures), and the server goes on serving the others.
 *
 * All I/O runs in one background thread polling every connection; the API
 * below is thread-safe and every wait is bounded.
 */
#ifndef NET_RENDEZVOUS_H
#define NET_RENDEZVOUS_H

#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"
#include "net/session.h"

typedef struct RdvServer RdvServer;

typedef struct RdvStats {
    long accepted;           /* TCP connections accepted */
    long auth_failures;      /* peers that failed or abandoned the HMAC challenge */
    long protocol_errors;    /* authenticated peers that broke the protocol */
    long integrity_failures; /* frames after the handshake that failed their seq or tag */
    long registrations;      /* register messages accepted (re-registrations too) */
    long events_dropped;     /* log/metric events dropped because the queue was full */
    int registered;          /* distinct executor ids registered now */
    char last_rejection[512];
} RdvStats;

/* Binds host:port, then starts the serving thread. mode (session.h) protects
 * every frame after each node's handshake; a node with another mode is
 * refused in the handshake (SG_EAUTH on the node naming both modes). */
int rdv_server_start(const uint8_t *secret, size_t secret_len, NetSecurity mode, int num_nodes,
                     const char *host, int port, RdvServer **out, SgError *err);

int rdv_server_port(const RdvServer *s);
const char *rdv_server_host(const RdvServer *s);

/* Waits until the spec is complete; *spec_json (malloc'd) is the JSON array.
 * SG_ERDV_TIMEOUT names the registered and missing executor ids. */
int rdv_server_wait(RdvServer *s, double timeout, char **spec_json, SgError *err);

/* Next event as JSON text (malloc'd) or *event_json = NULL after timeout. */
int rdv_server_next_event(RdvServer *s, double timeout, char **event_json, SgError *err);

/* Queues a JSON object (text) to one node or to every connected node
 * (*sent = how many). SG_ECLUSTER if executor_id is not connected. */
int rdv_server_send(RdvServer *s, long executor_id, const char *json, SgError *err);
int rdv_server_broadcast(RdvServer *s, const char *json, int *sent, SgError *err);

void rdv_server_set_heartbeat_timeout(RdvServer *s, double seconds);
double rdv_server_heartbeat_timeout(RdvServer *s);
/* Seconds a connection may take to authenticate (default 10; later
 * connections). Unauthenticated connections are capped (accept.h). */
void rdv_server_set_auth_timeout(RdvServer *s, double seconds);
void rdv_server_stats(RdvServer *s, RdvStats *out);

/* Stops the thread, closes every socket; later calls fail with SG_ESTATE.
 * Idempotent. rdv_server_free stops (if needed) and frees. */
void rdv_server_stop(RdvServer *s);
void rdv_server_free(RdvServer *s);

#endif /* NET_RENDEZVOUS_H */
