/*
 * rendezvous_internal.h - state shared by rendezvous_server.c (the I/O loop)
 * and rendezvous_registry.c (registration, spec, events, API waits).
 * Not a public header.
 */
#ifndef NET_RENDEZVOUS_INTERNAL_H
#define NET_RENDEZVOUS_INTERNAL_H

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdint.h>

#include "net/accept.h"
#include "net/auth.h"
#include "net/frame.h"
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
    double last_seen; /* sg_now() of the last frame */
    double deadline;  /* CONN_AUTH / CONN_CLOSING deadline */
} RdvConn;

typedef struct RdvNode {
    cJSON *info;   /* normalized registration; NULL = not registered */
    RdvConn *conn; /* NULL once disconnected */
} RdvNode;

typedef struct RdvEvent {
    char *json;
    struct RdvEvent *next;
} RdvEvent;

struct RdvServer {
    int lfd, port;
    char host[64];
    uint8_t *secret;
    size_t secret_len;
    NetSecurity mode; /* announced in every challenge; nodes must use the same */
    int num_nodes;
    uint32_t max_frame;
    int wake[2];
    pthread_t thread;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* spec complete, event queued, loop ended */
    int stopping, stopped, loop_done;
    SgError loop_err;
    double heartbeat_timeout;
    double auth_timeout; /* seconds an unauthenticated peer may take */
    NetGate gate;        /* caps on unauthenticated connections, accept backoff */
    double last_beat;    /* sg_now() of the last heartbeat sent to the nodes */
    RdvConn **conns;
    size_t nconns, capconns;
    RdvNode *nodes; /* [num_nodes], by executor_id */
    int registered;
    char *spec_json; /* set once every executor id registered */
    RdvEvent *ev_head, *ev_tail;
    long ev_count;
    RdvStats stats;
};

/* rendezvous_server.c */
int rdv_conn_queue_json(RdvConn *c, const cJSON *msg);
int rdv_conn_queue_text(RdvConn *c, const char *json);
void rdv_conn_drop(RdvServer *s, RdvConn *c, const char *reason);

/* rendezvous_registry.c (called with s->mu held) */
int rdv_handle_message(RdvServer *s, RdvConn *c, const cJSON *msg, const char *type, SgError *err);
void rdv_node_disconnected(RdvServer *s, RdvConn *c, const char *reason);
void rdv_registry_free(RdvServer *s);

#endif /* NET_RENDEZVOUS_INTERNAL_H */
