/*
 * server.h - the one server of the cluster transport's request/response
 * protocols: the parameter server (ps_server.c) and the feed
 * (feed_server.c) are handlers of it.
 *
 * A NetServer owns an accept thread on a listening socket (not owned): the
 * gate of accept.h (caps on unauthenticated connections, backoff on
 * EMFILE & co), one thread per connection, and the table of connections,
 * whose ended members are joined and freed as soon as they end. A
 * connection's thread runs the handshake (auth.c, with the server's
 * deadline), then the handler: open once, serve once per incoming request
 * (the thread waits for the socket to be readable, checking every second
 * whether the server is closing), close once with the reason it ended.
 *
 * Life: net_server_start (non-blocking) starts the accept thread;
 * net_server_stop (non-blocking, any thread) or net_server_done (a handler:
 * its work is over) ends it; net_server_wait blocks until it ended or a
 * timeout. On its way out the accept thread tells the handler (`stopping`),
 * shuts every connection down, waits for the users of net_server_conn_get
 * and frees the connections. A server starts once.
 *
 * Not here: the rendezvous, whose one poll loop holds every node connection
 * of the job (rendezvous_server.c), and the ring's acceptor (coll.c).
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

/* A connection; handlers embed it as the first member of their own
 * (NetHandler.conn_size bytes, zeroed). */
typedef struct NetConn {
    NetServer *srv;
    uint32_t id; /* 1, 2, ... in accept order */
    int fd;
    char peer[NET_PEER_MAX];
    NetSession session;      /* keyed by the handshake; wiped when the connection is freed */
    pthread_mutex_t send_mu; /* for handlers whose frames leave from several threads */
    int authed;              /* the handshake succeeded (set before open) */
    /* the server's, under its mutex */
    int ended, refs;
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
    /* The connection ends (optional), before its socket is shut down: rc is 1 when the server
     * closes it, SG_EPEER when the peer left, else the error in err. */
    void (*close)(void *ctx, NetConn *c, int rc, const SgError *err);
    /* Frees the handler's members of c (optional); its thread has been joined. */
    void (*free)(void *ctx, NetConn *c);
    /* The server is ending (optional): wake the handler's own waits. Called once, from the
     * accept thread, before the connections are shut down. */
    void (*stopping)(void *ctx);
} NetHandler;

enum { NET_SERVER_DONE = 1, NET_SERVER_STOPPED = 2 };

/* A server on lfd in `mode` (peers with another are refused, both modes
 * named); name ("ps shard") names it in errors. Starts nothing. */
int net_server_new(int lfd, const uint8_t *secret, size_t secret_len, NetSecurity mode,
                   const char *name, const NetHandler *h, NetServer **out, SgError *err);

/* Seconds a connection may take to authenticate (default
 * NET_AUTH_TIMEOUT_DEFAULT; later connections). */
void net_server_set_auth_timeout(NetServer *s, double seconds);

/* Starts the accept thread; SG_ESTATE if it was started before. A stop
 * that came first ends it at once. */
int net_server_start(NetServer *s, SgError *err);

/* Thread-safe, idempotent, non-blocking: the accept thread ends. The first
 * of stop and done is the reason wait reports. */
void net_server_stop(NetServer *s);
void net_server_done(NetServer *s);

/* Blocks until the accept thread ended (every connection closed and freed)
 * or timeout seconds passed (timeout < 0: none). Returns NET_SERVER_DONE or
 * NET_SERVER_STOPPED, 0 on timeout (or when never started), or the status of
 * a failed accept loop (err filled). */
int net_server_wait(NetServer *s, double timeout, SgError *err);

/* The authenticated connection with id, held until net_server_conn_put (it
 * is neither freed nor, at the end, waited for meanwhile), or NULL: then
 * *gone says whether the id was ever given. NULL while the server ends. */
NetConn *net_server_conn_get(NetServer *s, uint32_t id, int *gone);
void net_server_conn_put(NetServer *s, NetConn *c);

/* Stops, waits and frees; the secret is wiped. */
void net_server_free(NetServer *s);

#endif /* NET_SERVER_H */
