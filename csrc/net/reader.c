/*
 * reader.c - the client connection and its reader thread (reader.h).
 */
#include "net/reader.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>

#include "net/auth.h"

/* Reads what is there and hands over every frame it completes. */
static int read_frames(NetReader *r, NetFrameParser *p, SgError *err)
{
    uint8_t buf[65536];
    long n = net_read_some(r->fd, buf, sizeof buf, r->peer, err);
    if (n == SG_EPEER)
        return sg_fail(err, SG_EPEER, "%s %s closed the %s connection", r->who, r->peer, r->what);
    if (n < 0)
        return (int)n;
    for (size_t off = 0; off < (size_t)n;) {
        size_t used = 0;
        int rc = net_frame_parser_feed(p, buf + off, (size_t)n - off, &used, err);
        off += used;
        if (rc == SG_EAUTH)
            return rc; /* the session's message names the peer, frame type and seq */
        if (rc < 0)
            return sg_context(err, "from %s %s: ", r->who, r->peer);
        if (rc == 1) {
            NetFrameHeader h;
            uint8_t *payload;
            net_frame_parser_take(p, &h, &payload);
            if ((rc = r->frame(r->ctx, &h, payload, err)) < 0)
                return rc;
        }
    }
    return SG_OK;
}

static void *reader_main(void *arg)
{
    NetReader *r = arg;
    NetFrameParser parser;
    net_frame_parser_init(&parser, r->max_frame);
    net_frame_parser_protect(&parser, r->session, r->max_frame, r->label);
    SgError err;
    int rc = SG_OK;
    while (rc == 0) {
        pthread_mutex_lock(r->mu);
        int stop = r->stopping;
        pthread_mutex_unlock(r->mu);
        if (stop)
            break;
        double wake_at = sg_now() + 1.0;
        if (r->tick != NULL && (rc = r->tick(r->ctx, &wake_at, &err)) < 0)
            break;
        struct pollfd pfd[2] = {{.fd = r->fd, .events = POLLIN},
                                {.fd = r->wake[0], .events = POLLIN}};
        if (poll(pfd, 2, sg_poll_ms(wake_at)) == -1) {
            if (errno != EINTR)
                rc = sg_fail_errno(&err, SG_EIO, errno, "poll on the %s connection to %s", r->what,
                                   r->peer);
            continue;
        }
        if (pfd[1].revents)
            net_wake_drain(r->wake[0]);
        if (pfd[0].revents & (POLLIN | POLLHUP | POLLERR))
            rc = read_frames(r, &parser, &err);
    }
    if (rc < 0) {
        pthread_mutex_lock(r->mu);
        if (r->err.code == 0)
            r->err = err;
        pthread_cond_broadcast(r->cv);
        pthread_mutex_unlock(r->mu);
    }
    net_frame_parser_free(&parser);
    return NULL;
}

int net_reader_start(NetReader *r, SgError *err)
{
    snprintf(r->label, sizeof r->label, "%s %s", r->who, r->peer);
    int rc = net_wake_pipe(r->wake, err);
    if (rc == 0 && pthread_create(&r->thread, NULL, reader_main, r) != 0) {
        net_close(&r->wake[0]);
        net_close(&r->wake[1]);
        rc = sg_fail(err, SG_EIO, "cannot start the %s connection's reader thread", r->what);
    }
    r->started = rc == 0;
    return rc;
}

static void reader_stop(NetReader *r)
{
    pthread_mutex_lock(r->mu);
    r->stopping = 1;
    pthread_mutex_unlock(r->mu);
    if (r->started) {
        net_wake(r->wake[1]);
        pthread_join(r->thread, NULL);
        net_close(&r->wake[0]);
        net_close(&r->wake[1]);
        r->started = 0;
    }
}

int net_msgq_push(NetMsgQueue *q, uint16_t op, uint8_t *payload, uint32_t len)
{
    NetMsg *m = malloc(sizeof *m);
    if (m == NULL) {
        free(payload);
        return SG_ENOMEM;
    }
    *m = (NetMsg){.op = op, .payload = payload, .len = len};
    if (q->tail != NULL)
        q->tail->next = m;
    else
        q->head = m;
    q->tail = m;
    q->len++;
    return SG_OK;
}

NetMsg *net_msgq_take(NetMsgQueue *q, int op)
{
    NetMsg *prev = NULL, *m = q->head;
    while (m != NULL && op >= 0 && m->op != op)
        prev = m, m = m->next;
    if (m == NULL)
        return NULL;
    if (prev != NULL)
        prev->next = m->next;
    else
        q->head = m->next;
    if (q->tail == m)
        q->tail = prev;
    q->len--;
    return m;
}

void net_msgq_free(NetMsgQueue *q)
{
    for (NetMsg *m; (m = net_msgq_take(q, -1)) != NULL; free(m))
        free(m->payload);
}

int net_client_open(NetClient *c, const char *host, int port, const uint8_t *secret,
                    size_t secret_len, NetSecurity mode, double deadline, const char *context,
                    const NetReader *reader, SgError *err)
{
    c->fd = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->send_mu, NULL);
    sg_cond_init(&c->cv);
    snprintf(c->peer, sizeof c->peer, "%s:%d", host, port);
    c->rd = *reader;
    c->rd.session = &c->session, c->rd.peer = c->peer, c->rd.mu = &c->mu, c->rd.cv = &c->cv;
    int rc = net_connect_auth(host, port, secret, secret_len, mode, deadline, &c->fd, &c->session,
                              c->peer, context, err);
    c->rd.fd = c->fd;
    return rc;
}

int net_client_send(NetClient *c, uint8_t type, uint16_t flags, const void *buf, size_t len,
                    double deadline, SgError *err)
{
    pthread_mutex_lock(&c->send_mu);
    int rc =
        c->fd < 0
            ? sg_fail(err, SG_ESTATE, "%s connection to %s is closed", c->rd.what, c->peer)
            : net_frame_send(c->fd, &c->session, type, flags, buf, len, deadline, c->peer, err);
    pthread_mutex_unlock(&c->send_mu);
    return rc;
}

void net_client_close(NetClient *c)
{
    reader_stop(&c->rd);
    pthread_mutex_lock(&c->send_mu);
    net_close(&c->fd);
    net_session_free(&c->session);
    pthread_mutex_unlock(&c->send_mu);
}

void net_client_free(NetClient *c)
{
    net_client_close(c);
    net_msgq_free(&c->rd.q);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->send_mu);
    pthread_cond_destroy(&c->cv);
}
