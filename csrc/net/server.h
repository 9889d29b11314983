/*
 * server.h - the one server of the request/response protocols, whose
 * handlers are the parameter server (ps_server.c) and the feed
 * (feed_server.c): an accept thread admits connections through the gate of
 * accept.h, each connection's thread runs the handshake, then the handler
 * (open, serve once per readable request, close); ended connections are
 * freed at once. start and end do not block; wait does, until the end or a
 * timeout. Not here: the rendezvous' poll loop (rendezvous_server.c).
 */
#ifndef NET_SERVER_H
#define NET_SERVER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"
#include "net/session.h"
#include "net/sock.h"

typedef struct NetServer NetServer;

/* A connection: the first member of the handler's own (conn_size bytes, zeroed). */
typedef struct NetConn {
    NetServer *srv;
    uint32_t id; /* 1, 2, ... in accept order */
    int fd;
    char peer[NET_PEER_MAX];
    NetSession session;      /* keyed by the handshake; wiped when the connection is freed */
    pthread_mutex_t send_mu; /* for handlers whose frames leave from several threads */
    int authed;              /* the handshake succeeded (set before open) */
    int ended, refs;         /* the server's, under its mutex */
    double auth_deadline;
    pthread_t thread;
} NetConn;

typedef struct NetHandler {
    void *ctx;
    size_t conn_size; /* >= sizeof(NetConn) */
    /* After the handshake (optional): per-connection state; a failure ends the connection. */
    int (*open)(void *ctx, NetConn *c, SgError *err);
    /* One request (the socket is readable): 0 to go on, or a status that ends the connection. */
    int (*serve)(void *ctx, NetConn *c, SgError *err);
    /* The end, before the socket is shut down (optional; frees what open allocated): rc is
     * 1 when the server closes it, SG_EPEER when the peer left, else the error in err. */
    void (*close)(void *ctx, NetConn *c, int rc, const SgError *err);
    /* The server is ending (optional): wake the handler's own waits. Called once, from the
     * accept thread, before the connections are shut down. */
    void (*stopping)(void *ctx);
} NetHandler;

enum { NET_SERVER_DONE = 1, NET_SERVER_STOPPED = 2 };

/* A server on lfd in `mode` (peers with another are refused, both modes
 * named); name ("ps shard") names it in errors. Starts nothing. */
int net_server_new(int lfd, const uint8_t *secret, size_t secret_len, NetSecurity mode,
                   const char *name, const NetHandler *h, NetServer **out, SgError *err);
/* Seconds a later connection may take to authenticate (default NET_AUTH_TIMEOUT_DEFAULT). */
void net_server_set_auth_timeout(NetServer *s, double seconds);

/* Starts the accept thread; SG_ESTATE the second time. An end asked for
 * before ends it at once. start, wait and free are called in sequence. */
int net_server_start(NetServer *s, SgError *err);
/* Thread-safe, idempotent, non-blocking: the accept thread ends; the first
 * reason (NET_SERVER_DONE / NET_SERVER_STOPPED) is the one wait reports. */
void net_server_end(NetServer *s, int reason);
/* Blocks until the accept thread ended (every connection freed) or timeout
 * seconds passed (< 0: none): the reason, 0 on timeout or when never
 * started, or the status of a failed accept loop (err filled). */
int net_server_wait(NetServer *s, double timeout, SgError *err);

/* The authenticated connection with id, held (neither freed nor waited for
 * at the end) until net_server_conn_put; NULL, with *gone set when the id
 * was given, or while the server ends. */
NetConn *net_server_conn_get(NetServer *s, uint32_t id, int *gone);
void net_server_conn_put(NetServer *s, NetConn *c);

/* Ends, waits and frees; the secret is wiped. */
void net_server_free(NetServer *s);

#endif /* NET_SERVER_H */
