/*
 * accept.h - the accept side every server of the cluster transport shares:
 * backoff on resource exhaustion and caps on unauthenticated connections.
 *
 * A NetGate counts the connections it admitted that have not authenticated
 * yet, in total and per peer address (the "ip" of "ip:port"); a connection
 * over either cap is closed at once, before a byte is sent to it. Accept
 * errors that mean "out of descriptors / memory" (EMFILE, ENFILE, ENOMEM,
 * ENOBUFS), or anything unexpected, do not end the server: the gate leaves
 * the listener out of the poll set for a backoff (5 ms, doubling up to
 * 100 ms, reset by the next accept), so the loop neither spins on a readable
 * listener nor gives up; the pending connection waits in the kernel's
 * backlog meanwhile. Transient errors (EINTR, ECONNABORTED, EPROTO, EPERM)
 * are skipped.
 *
 * The gate also keeps the deadline of the handshake (auth_timeout), and a
 * NetAcceptor what every server keeps beside its listener: the secret and
 * mode of the handshake, the gate, and a wake-up pipe for its loop.
 *
 * Thread-safe (one mutex): connection threads report authentication and
 * their end while the accept loop runs. Not here: the handshake (auth.c).
 */
#ifndef NET_ACCEPT_H
#define NET_ACCEPT_H

#include <pthread.h>
#include <stddef.h>

#include "common/sg_status.h"
#include "net/session.h"
#include "net/sock.h"

#define NET_GATE_MAX_UNAUTH      256 /* unauthenticated connections per server */
#define NET_GATE_MAX_PER_PEER    32  /* ... and per peer address */
#define NET_GATE_BACKOFF_MIN     0.005
#define NET_GATE_BACKOFF_MAX     0.1
#define NET_AUTH_TIMEOUT_DEFAULT 10.0 /* seconds a peer may take to authenticate */

typedef struct NetGatePeer {
    char addr[NET_PEER_MAX];
    int n;
} NetGatePeer;

typedef struct NetGate {
    pthread_mutex_t mu;
    int max_unauth, max_per_peer; /* <= 0: no cap */
    int unauth;                   /* admitted, not yet authenticated nor ended */
    NetGatePeer *peers;           /* addresses with unauthenticated connections */
    int npeers;
    double auth_timeout; /* seconds an admitted connection may take to authenticate */
    double backoff;      /* seconds of the current backoff, 0 when none */
    double retry_at;     /* sg_now() before which the listener is not polled */
    long refused;        /* closed over a cap */
    long accept_errors;
    int last_errno;
} NetGate;

/* max_unauth / max_per_peer <= 0: no cap of that kind. */
int net_gate_init(NetGate *g, int max_unauth, int max_per_peer, SgError *err);
void net_gate_free(NetGate *g);

/* For building a poll set: the listener fd to poll now (-1 while backing
 * off) and *ms (a poll timeout, < 0 = infinite) lowered to the end of the
 * backoff. */
int net_gate_poll_fd(NetGate *g, int lfd, int *ms);

/* Accepts one connection from the non-blocking listener: 1 when fd_out/peer
 * hold a connection admitted as unauthenticated (the caller reports it with
 * net_gate_authenticated or net_gate_release exactly once), 2 when one was
 * closed over a cap (call again), 0 when none is pending or the gate is
 * backing off. Never fails. */
int net_gate_accept(NetGate *g, int lfd, int *fd_out, char *peer, size_t peer_len);

/* A server loop's accept step: when `ready` (the listener polled readable, or
 * out of the poll set), accepts up to NET_GATE_BURST pending connections and
 * hands each admitted one to add(ctx, fd, peer), which owns it from then on. */
#define NET_GATE_BURST 64
typedef void (*NetGateAdd)(void *ctx, int fd, const char *peer);
void net_gate_accept_ready(NetGate *g, int lfd, int ready, NetGateAdd add, void *ctx);

/* The admitted connection from peer authenticated / ended unauthenticated:
 * it no longer counts against the caps. */
void net_gate_authenticated(NetGate *g, const char *peer);
void net_gate_release(NetGate *g, const char *peer);

/* Current number of unauthenticated connections. */
int net_gate_unauth(NetGate *g);

/* Seconds an admitted connection may take to authenticate
 * (NET_AUTH_TIMEOUT_DEFAULT until set), and the deadline (sg_now()) of one
 * admitted now. */
void net_gate_set_auth_timeout(NetGate *g, double seconds);
double net_gate_auth_deadline(NetGate *g);

typedef struct NetAcceptor {
    int lfd;         /* the listener (the acceptor's owner decides who closes it) */
    uint8_t *secret; /* a copy, wiped when freed */
    size_t secret_len;
    NetSecurity mode; /* announced in every challenge; peers must use the same */
    NetGate gate;     /* NET_GATE_MAX_UNAUTH, NET_GATE_MAX_PER_PEER */
    int wake[2];      /* wakes the server's loop */
} NetAcceptor;

/* Checks and copies the secret, sets up the gate and the pipe. On failure
 * *a is safe to free. */
int net_acceptor_init(NetAcceptor *a, int lfd, const uint8_t *secret, size_t secret_len,
                      NetSecurity mode, SgError *err);
/* Frees all but lfd; idempotent. */
void net_acceptor_free(NetAcceptor *a);

#endif /* NET_ACCEPT_H */
