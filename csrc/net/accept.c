/*
 * accept.c - the shared accept gate of the servers (see accept.h): caps on
 * unauthenticated connections, per server and per peer address, and backoff
 * on accept errors instead of ending the server or spinning; the acceptor
 * state every server keeps beside its listener.
 */
#include "net/accept.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "net/auth.h"

int net_gate_init(NetGate *g, int max_unauth, int max_per_peer, SgError *err)
{
    memset(g, 0, sizeof *g);
    g->max_unauth = max_unauth;
    g->max_per_peer = max_per_peer;
    g->auth_timeout = NET_AUTH_TIMEOUT_DEFAULT;
    size_t slots = max_unauth > 0 ? (size_t)max_unauth : NET_GATE_MAX_UNAUTH;
    g->peers = calloc(slots, sizeof *g->peers);
    if (g->peers == NULL)
        return sg_fail(err, SG_ENOMEM, "allocating the accept gate for %zu peers", slots);
    pthread_mutex_init(&g->mu, NULL);
    return SG_OK;
}

void net_gate_free(NetGate *g)
{
    if (g->peers == NULL)
        return;
    free(g->peers);
    g->peers = NULL;
    pthread_mutex_destroy(&g->mu);
}

/* "ip:port" -> "ip" (the last colon separates the port, IPv6 included). */
static void peer_addr(const char *peer, char *out, size_t len)
{
    const char *colon = strrchr(peer, ':');
    size_t n = colon != NULL ? (size_t)(colon - peer) : strlen(peer);
    if (n >= len)
        n = len - 1;
    memcpy(out, peer, n);
    out[n] = '\0';
}

/* (g->mu held) The peer table entry of addr, or NULL. */
static NetGatePeer *peer_find(NetGate *g, const char *addr)
{
    for (int i = 0; i < g->npeers; i++)
        if (strcmp(g->peers[i].addr, addr) == 0)
            return &g->peers[i];
    return NULL;
}

int net_gate_poll_fd(NetGate *g, int lfd, int *ms)
{
    pthread_mutex_lock(&g->mu);
    double retry_at = g->retry_at;
    pthread_mutex_unlock(&g->mu);
    if (retry_at <= 0)
        return lfd;
    int left = sg_poll_ms(retry_at);
    if (left <= 0)
        return lfd;
    if (*ms < 0 || left < *ms)
        *ms = left;
    return -1;
}

/* (g->mu held) Out of descriptors or memory (or an unknown error): wait
 * before the listener is polled again. */
static void back_off(NetGate *g, int e)
{
    g->backoff = g->backoff <= 0 ? NET_GATE_BACKOFF_MIN : g->backoff * 2;
    if (g->backoff > NET_GATE_BACKOFF_MAX)
        g->backoff = NET_GATE_BACKOFF_MAX;
    g->retry_at = sg_now() + g->backoff;
    g->accept_errors++;
    g->last_errno = e;
}

int net_gate_accept(NetGate *g, int lfd, int *fd_out, char *peer, size_t peer_len)
{
    pthread_mutex_lock(&g->mu);
    if (g->retry_at > 0 && sg_now() < g->retry_at) {
        pthread_mutex_unlock(&g->mu);
        return 0;
    }
    pthread_mutex_unlock(&g->mu);
    int fd = -1;
    SgError err;
    /* bounded: each transient error consumes one pending connection of the backlog */
    for (int tries = 0; tries < 1024; tries++) {
        errno = 0;
        int rc = net_accept(lfd, &fd, peer, peer_len, &err);
        if (rc == 1)
            break;
        if (rc == 0)
            return 0;
        int e = errno; /* kept by net_accept */
        if (e == EINTR || e == ECONNABORTED || e == EPROTO || e == EPERM)
            continue; /* transient: the next pending connection, if any */
        pthread_mutex_lock(&g->mu);
        back_off(g, e); /* EMFILE, ENFILE, ENOMEM, ENOBUFS, or a listener in trouble */
        pthread_mutex_unlock(&g->mu);
        return 0;
    }
    if (fd < 0)
        return 0;
    char addr[NET_PEER_MAX];
    peer_addr(peer, addr, sizeof addr);
    pthread_mutex_lock(&g->mu);
    g->backoff = 0;
    g->retry_at = 0;
    NetGatePeer *p = peer_find(g, addr);
    int slots = g->max_unauth > 0 ? g->max_unauth : NET_GATE_MAX_UNAUTH;
    int over = (g->max_unauth > 0 && g->unauth >= g->max_unauth) ||
               (g->max_per_peer > 0 && p != NULL && p->n >= g->max_per_peer) ||
               (p == NULL && g->npeers >= slots);
    if (over) {
        g->refused++;
    } else {
        if (p == NULL) {
            p = &g->peers[g->npeers++];
            snprintf(p->addr, sizeof p->addr, "%s", addr);
            p->n = 0;
        }
        p->n++;
        g->unauth++;
    }
    pthread_mutex_unlock(&g->mu);
    if (over) {
        close(fd); /* nothing is sent: the peer sees the connection close */
        return 2;
    }
    *fd_out = fd;
    return 1;
}

void net_gate_release(NetGate *g, const char *peer)
{
    char addr[NET_PEER_MAX];
    peer_addr(peer, addr, sizeof addr);
    pthread_mutex_lock(&g->mu);
    NetGatePeer *p = peer_find(g, addr);
    if (p != NULL) {
        g->unauth--;
        if (--p->n == 0)
            *p = g->peers[--g->npeers];
    }
    pthread_mutex_unlock(&g->mu);
}

/* Either way the connection leaves the unauthenticated count. */
void net_gate_authenticated(NetGate *g, const char *peer)
{
    net_gate_release(g, peer);
}

int net_gate_unauth(NetGate *g)
{
    pthread_mutex_lock(&g->mu);
    int n = g->unauth;
    pthread_mutex_unlock(&g->mu);
    return n;
}

void net_gate_accept_ready(NetGate *g, int lfd, int ready, NetGateAdd add, void *ctx)
{
    for (int i = 0; i < NET_GATE_BURST && ready; i++) {
        int fd;
        char peer[NET_PEER_MAX];
        int a = net_gate_accept(g, lfd, &fd, peer, sizeof peer);
        if (a == 0)
            break;
        if (a == 1)
            add(ctx, fd, peer);
    }
}

void net_gate_set_auth_timeout(NetGate *g, double seconds)
{
    pthread_mutex_lock(&g->mu);
    g->auth_timeout = seconds;
    pthread_mutex_unlock(&g->mu);
}

double net_gate_auth_deadline(NetGate *g)
{
    pthread_mutex_lock(&g->mu);
    double deadline = sg_now() + g->auth_timeout;
    pthread_mutex_unlock(&g->mu);
    return deadline;
}

int net_acceptor_init(NetAcceptor *a, int lfd, const uint8_t *secret, size_t secret_len,
                      NetSecurity mode, SgError *err)
{
    *a = (NetAcceptor){.lfd = lfd, .mode = mode, .wake = {-1, -1}};
    int rc = net_auth_check_secret(secret_len, err);
    if (rc == 0 && (a->secret = malloc(secret_len)) == NULL)
        rc = sg_fail(err, SG_ENOMEM, "allocating a server's secret");
    if (rc < 0)
        return rc;
    memcpy(a->secret, secret, a->secret_len = secret_len);
    if ((rc = net_gate_init(&a->gate, NET_GATE_MAX_UNAUTH, NET_GATE_MAX_PER_PEER, err)) == 0)
        rc = net_wake_pipe(a->wake, err);
    return rc;
}

void net_acceptor_free(NetAcceptor *a)
{
    net_close(&a->wake[0]);
    net_close(&a->wake[1]);
    if (a->secret != NULL)
        OPENSSL_cleanse(a->secret, a->secret_len);
    free(a->secret);
    a->secret = NULL;
    net_gate_free(&a->gate);
}
