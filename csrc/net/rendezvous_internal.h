/*
 * rendezvous_internal.h - state shared by rendezvous_server.c (the I/O loop)
 * and rendezvous_registry.c (registration, spec, events, API waits), and
 * what the registry offers the loop: the dependency goes one way, from the
 * server to the registry. Not a public header.
 */
#ifndef NET_RENDEZVOUS_INTERNAL_H
#define NET_RENDEZVOUS_INTERNAL_H

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdint.h>

#include "net/accept.h"
#include "net/auth.h"
#include "net/frame.h"
#include "net/reader.h"
#include "net/rendezvous.h"
#include "net/sock.h"

enum { CONN_AUTH, CONN_READY, CONN_CLOSING };

/* Longest "spark_executor" / "spark_host" a registration may carry (bytes). */
#define RDV_SPARK_FIELD_MAX 255

typedef struct RdvConn {
    int fd;
    char peer[NET_PEER_MAX];
    int state;
    uint8_t challenge[NET_AUTH_NONCE];
    NetSession session; /* keyed by the handshake: every frame after AUTH_OK, both ways */
    NetFrameParser parser;
    uint8_t *out; /* queued frames: out[out_off..out_len) not yet written */
    size_t out_len, out_off, out_cap;
    long executor_id; /* -1 until registered */
    int finished;     /* sent "done" or "error": closing is not a loss */
    int dead;         /* freed at the end of the loop iteration */
    int gated;        /* counted by the gate as unauthenticated */
    double last_seen; /* sg_now() of the last frame (CONN_AUTH: of the accept) */
    double deadline;  /* CONN_AUTH / CONN_CLOSING deadline */
} RdvConn;

typedef struct RdvNode {
    cJSON *info;   /* normalized registration; NULL = not registered */
    RdvConn *conn; /* NULL once disconnected */
} RdvNode;

struct RdvServer {
    NetAcceptor acc; /* the listener (owned, closed by stop), secret, mode, gate, wake-up pipe */
    int port;
    char host[64];
    int num_nodes;
    uint32_t max_frame;
    pthread_t thread;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* spec complete, event queued, loop ended */
    int stopping, stopped, loop_done;
    SgError loop_err;
    double heartbeat_timeout;
    double last_beat; /* sg_now() of the last heartbeat sent to the nodes */
    RdvConn **conns;
    size_t nconns, capconns;
    RdvNode *nodes; /* [num_nodes], by executor_id */
    int registered;
    char *spec_json;    /* set once every executor id registered */
    NetMsgQueue events; /* JSON texts */
    RdvStats stats;
};

/* rendezvous_registry.c, called with s->mu held. rdv_handle_message returns
 * 0, a negative status, or after a registration RDV_REGISTERED (the loop
 * acks it, and sends the spec to this node alone when there is one: a
 * re-registration) or RDV_SPEC_FIRST (the spec just completed: to every
 * node). A registration that replaces an older connection of its executor
 * id marks that one dead. */
enum { RDV_REGISTERED = 1, RDV_SPEC_FIRST = 2 };
int rdv_handle_message(RdvServer *s, RdvConn *c, const cJSON *msg, const char *type, SgError *err);
void rdv_node_disconnected(RdvServer *s, RdvConn *c, const char *reason);
int rdv_closed_error(RdvServer *s, SgError *err); /* SG_ESTATE, or the loop's error */
void rdv_registry_free(RdvServer *s);

#endif /* NET_RENDEZVOUS_INTERNAL_H */
