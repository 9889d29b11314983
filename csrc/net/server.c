/*
 * server.c - the thread-per-connection server of server.h: the accept
 * thread, the connection table and its reaping, the connection threads
 * that run the handshake and then the handler.
 *
 * Locking: s->mu is a leaf lock: no handler callback runs under it, so a
 * handler may call net_server_end or net_server_conn_get under its own.
 */
#include "net/server.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/sg_grow.h"
#include "net/accept.h"
#include "net/auth.h"

struct NetServer {
    NetAcceptor acc; /* lfd not owned */
    char name[32];
    NetHandler h;
    pthread_t thread;
    int started;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* loop ended, a reference dropped */
    int reason;        /* NET_SERVER_DONE / NET_SERVER_STOPPED once asked to end */
    int closing;       /* the accept thread is closing the connections */
    int loop_done;
    SgError loop_err;
    NetConn **conns; /* live connections; ended ones are reaped at once */
    size_t nconns, capconns;
    uint32_t next_id; /* ids given so far */
};

/* ---- connection threads ---------------------------------------------------- */

/* Waits until c's socket is readable: 0, or 1 once the server closes. */
static int wait_request(NetServer *s, NetConn *c, SgError *err)
{
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int closing = s->closing;
        pthread_mutex_unlock(&s->mu);
        if (closing)
            return 1;
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        int n = poll(&p, 1, 1000);
        if (n == -1 && errno != EINTR)
            return sg_fail_errno(err, SG_EIO, errno, "poll on the connection from %s", c->peer);
        if (n > 0)
            return SG_OK;
    }
}

static void *conn_main(void *arg)
{
    NetConn *c = arg;
    NetServer *s = c->srv;
    SgError err;
    int rc = net_auth_server(c->fd, s->acc.secret, s->acc.secret_len, s->acc.mode, c->auth_deadline,
                             c->peer, &c->session, &err);
    pthread_mutex_lock(&s->mu);
    c->authed = rc == 0;
    pthread_mutex_unlock(&s->mu);
    if (c->authed)
        net_gate_authenticated(&s->acc.gate, c->peer);
    else
        net_gate_release(&s->acc.gate, c->peer);
    if (rc == 0 && s->h.open != NULL)
        rc = s->h.open(s->h.ctx, c, &err);
    while (rc == 0 && (rc = wait_request(s, c, &err)) == 0)
        rc = s->h.serve(s->h.ctx, c, &err);
    if (s->h.close != NULL)
        s->h.close(s->h.ctx, c, rc, &err);
    shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_lock(&s->mu);
    c->ended = 1;
    net_wake(s->acc.wake[1]); /* the accept thread reaps it */
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void conn_free(NetConn *c)
{
    pthread_join(c->thread, NULL);
    net_close(&c->fd);
    net_session_free(&c->session);
    pthread_mutex_destroy(&c->send_mu);
    free(c);
}

/* Starts a thread for an admitted (unauthenticated) connection; on failure
 * closes it and gives its place in the gate back. */
static void add_conn(void *ctx, int fd, const char *peer)
{
    NetServer *s = ctx;
    NetConn *c = calloc(1, s->h.conn_size);
    pthread_mutex_lock(&s->mu);
    int ok = c != NULL && sg_grow(&s->conns, &s->capconns, s->nconns + 1, sizeof *s->conns, 8) == 0;
    if (ok) {
        c->srv = s, c->id = ++s->next_id, c->fd = fd;
        c->auth_deadline = net_gate_auth_deadline(&s->acc.gate);
        snprintf(c->peer, sizeof c->peer, "%s", peer);
        pthread_mutex_init(&c->send_mu, NULL);
        ok = pthread_create(&c->thread, NULL, conn_main, c) == 0;
        if (ok)
            s->conns[s->nconns++] = c;
        else
            pthread_mutex_destroy(&c->send_mu);
    }
    pthread_mutex_unlock(&s->mu);
    if (!ok) {
        free(c);
        close(fd);
        net_gate_release(&s->acc.gate, peer);
    }
}

/* Joins and frees the ended connections nobody holds: their socket, thread
 * and buffers go as soon as the peer is done, not at shutdown. Only the
 * accept thread shrinks the table. */
static void reap_conns(NetServer *s)
{
    NetConn *ended[64];
    size_t n = 0, j = 0;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nconns; i++) {
        NetConn *c = s->conns[i];
        if (c->ended && c->refs == 0 && n < sizeof ended / sizeof *ended)
            ended[n++] = c;
        else
            s->conns[j++] = c;
    }
    s->nconns = j;
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < n; i++)
        conn_free(ended[i]);
}

/* ---- the accept thread ----------------------------------------------------- */

static void close_conns(NetServer *s)
{
    pthread_mutex_lock(&s->mu);
    s->closing = 1;
    pthread_mutex_unlock(&s->mu);
    if (s->h.stopping != NULL)
        s->h.stopping(s->h.ctx);
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nconns; i++)
        shutdown(s->conns[i]->fd, SHUT_RDWR);
    for (size_t i = 0; i < s->nconns; i++)
        while (s->conns[i]->refs > 0) /* their users fail fast on the shut sockets */
            pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < s->nconns; i++)
        conn_free(s->conns[i]);
    s->nconns = 0;
}

static void *accept_main(void *arg)
{
    NetServer *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int reason = s->reason;
        pthread_mutex_unlock(&s->mu);
        if (reason != 0)
            break;
        int ms = 1000;
        /* the listener is left out while the gate backs off (EMFILE & co) */
        struct pollfd p[2] = {
            {.fd = net_gate_poll_fd(&s->acc.gate, s->acc.lfd, &ms), .events = POLLIN},
            {.fd = s->acc.wake[0], .events = POLLIN}};
        if (poll(p, 2, ms) == -1) {
            if (errno == EINTR)
                continue;
            pthread_mutex_lock(&s->mu);
            sg_fail_errno(&s->loop_err, SG_EIO, errno, "poll on the %s listener", s->name);
            pthread_mutex_unlock(&s->mu);
            break;
        }
        if (p[1].revents)
            net_wake_drain(s->acc.wake[0]);
        reap_conns(s);
        net_gate_accept_ready(&s->acc.gate, s->acc.lfd, p[0].fd < 0 || (p[0].revents & POLLIN),
                              add_conn, s);
    }
    close_conns(s);
    pthread_mutex_lock(&s->mu);
    s->loop_done = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- API --------------------------------------------------------------------- */

int net_server_new(int lfd, const uint8_t *secret, size_t secret_len, NetSecurity mode,
                   const char *name, const NetHandler *h, NetServer **out, SgError *err)
{
    NetServer *s = calloc(1, sizeof *s);
    if (s == NULL)
        return sg_fail(err, SG_ENOMEM, "allocating a %s", name);
    s->h = *h;
    snprintf(s->name, sizeof s->name, "%s", name);
    pthread_mutex_init(&s->mu, NULL);
    sg_cond_init(&s->cv);
    int rc = net_acceptor_init(&s->acc, lfd, secret, secret_len, mode, err);
    if (rc < 0) {
        net_server_free(s);
        return rc;
    }
    *out = s;
    return SG_OK;
}

void net_server_set_auth_timeout(NetServer *s, double seconds)
{
    net_gate_set_auth_timeout(&s->acc.gate, seconds);
}

int net_server_start(NetServer *s, SgError *err)
{
    if (s->started) /* the caller serializes start, wait and free */
        return sg_fail(err, SG_ESTATE, "%s already served and closed", s->name);
    if (pthread_create(&s->thread, NULL, accept_main, s) != 0)
        return sg_fail(err, SG_EIO, "cannot start the %s thread", s->name);
    s->started = 1;
    return SG_OK;
}

void net_server_end(NetServer *s, int reason)
{
    pthread_mutex_lock(&s->mu);
    if (s->reason == 0)
        s->reason = reason;
    net_wake(s->acc.wake[1]);
    pthread_mutex_unlock(&s->mu);
}

int net_server_wait(NetServer *s, double timeout, SgError *err)
{
    double deadline = sg_now() + (timeout < 0 ? 1e9 : timeout);
    pthread_mutex_lock(&s->mu);
    while (s->started && !s->loop_done && sg_cond_wait(&s->cv, &s->mu, deadline) != ETIMEDOUT)
        ;
    int rc = s->started && !s->loop_done ? 0 : s->reason;
    if (s->loop_err.code != 0)
        rc = sg_fail(err, s->loop_err.code, "%s", s->loop_err.msg);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

NetConn *net_server_conn_get(NetServer *s, uint32_t id, int *gone)
{
    NetConn *c = NULL;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; !s->closing && i < s->nconns && c == NULL; i++)
        if (s->conns[i]->id == id && s->conns[i]->authed)
            c = s->conns[i];
    if (c != NULL)
        c->refs++;
    *gone = c == NULL && !s->closing && id >= 1 && id <= s->next_id;
    pthread_mutex_unlock(&s->mu);
    return c;
}

void net_server_conn_put(NetServer *s, NetConn *c)
{
    pthread_mutex_lock(&s->mu);
    if (--c->refs == 0 && c->ended)
        net_wake(s->acc.wake[1]); /* reap it now */
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void net_server_free(NetServer *s)
{
    if (s == NULL)
        return;
    net_server_end(s, NET_SERVER_STOPPED);
    if (s->started)
        pthread_join(s->thread, NULL);
    net_acceptor_free(&s->acc);
    free(s->conns);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
