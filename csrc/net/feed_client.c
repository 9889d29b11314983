/*
 * feed_client.c - the feeder side of feed.h: connect + authenticate, send
 * batches straight from the caller's column buffers (net_frame_sendv pieces:
 * no copy, plain or protected alike), END and wait for the worker's ACK,
 * receive RESULT batches.
 *
 * A reader thread owns the receiving half of the socket: it queues ACK and
 * RESULT frames and records the worker's ERROR (or the connection's end), so
 * results never back up behind a feeder that is still sending, and a failed
 * send reports the worker's reason rather than a bare broken pipe.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

#include "net/auth.h"
#include "net/feed.h"
#include "net/frame.h"
#include "net/sock.h"

#define FEED_CLIENT_MAX_FRAME (256u << 20)

typedef struct FeedMsg {
    uint16_t op;
    uint8_t *payload;
    uint32_t len;
    struct FeedMsg *next;
} FeedMsg;

struct FeedClient {
    int fd;
    NetSession session;      /* keyed by the handshake; send half under send_mu */
    pthread_mutex_t send_mu; /* send and end may come from different threads */
    int wake[2];
    char peer[NET_PEER_MAX];
    double timeout;
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    FeedMsg *head, *tail; /* ACK and RESULT frames in arrival order */
    int stopping;
    SgError io_err; /* code != 0: the worker's ERROR, or the connection ended */
};

int feed_send_batch(int fd, NetSession *s, int op, const FeedBatch *b, double deadline,
                    const char *peer, SgError *err)
{
    size_t meta_cap =
        16 + FEED_NAME_MAX + (size_t)b->ncols * (FEED_NAME_MAX + 16 + 8 * FEED_MAX_NDIM);
    uint8_t *meta = malloc(meta_cap);
    struct iovec *iov = malloc(2 * (size_t)FEED_MAX_COLUMNS * sizeof *iov);
    int rc = SG_OK;
    if (meta == NULL || iov == NULL) {
        rc = sg_fail(err, SG_ENOMEM, "encoding a feed batch");
        goto cleanup;
    }
    long len = feed_batch_encode(b, meta, meta_cap, iov, err);
    if (len < 0) {
        rc = (int)len;
        goto cleanup;
    }
    if ((unsigned long)len > UINT32_MAX) {
        rc = sg_fail(err, SG_EFRAME,
                     "feed batch of %ld bytes exceeds the 4 GiB frame limit: send smaller batches",
                     len);
        goto cleanup;
    }
    /* The pieces: metadata interleaved with the caller's column buffers. */
    rc = net_frame_sendv(fd, s, NET_FRAME_FEED, (uint16_t)op, iov, 2 * b->ncols, deadline, peer,
                         op == FEED_OP_RESULT ? "a feed result batch" : "a feed batch", err);
cleanup:
    free(meta);
    free(iov);
    return rc;
}

/* ---- the reader thread ------------------------------------------------- */

static void set_io_err(FeedClient *c, const SgError *e)
{
    pthread_mutex_lock(&c->mu);
    if (c->io_err.code == 0)
        c->io_err = *e;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static int on_frame(FeedClient *c, const NetFrameHeader *h, uint8_t *payload, SgError *err)
{
    if (h->type != NET_FRAME_FEED ||
        (h->flags != FEED_OP_ACK && h->flags != FEED_OP_RESULT && h->flags != FEED_OP_ERROR))
        return sg_fail(err, SG_EPROTO, "worker %s sent a %s frame (op %u) on the feed connection",
                       c->peer, net_frame_type_name(h->type), h->flags);
    if (h->flags == FEED_OP_ERROR) {
        if (h->length < 4)
            return sg_fail(err, SG_EPROTO, "worker %s sent a malformed feed error", c->peer);
        int32_t code = (int32_t)((uint32_t)payload[0] | (uint32_t)payload[1] << 8 |
                                 (uint32_t)payload[2] << 16 | (uint32_t)payload[3] << 24);
        return sg_fail(err, code < 0 && code > -100 ? code : SG_EPROTO,
                       "worker %s refused the feed: %.*s", c->peer,
                       (int)(h->length - 4 > 900 ? 900 : h->length - 4), (const char *)payload + 4);
    }
    FeedMsg *m = malloc(sizeof *m);
    if (m == NULL)
        return sg_fail(err, SG_ENOMEM, "queueing a frame from %s", c->peer);
    *m = (FeedMsg){.op = h->flags, .payload = payload, .len = h->length};
    pthread_mutex_lock(&c->mu);
    if (c->tail != NULL)
        c->tail->next = m;
    else
        c->head = m;
    c->tail = m;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return SG_OK;
}

static void *reader_main(void *arg)
{
    FeedClient *c = arg;
    NetFrameParser p;
    net_frame_parser_init(&p, FEED_CLIENT_MAX_FRAME);
    net_frame_parser_protect(&p, &c->session, FEED_CLIENT_MAX_FRAME, c->peer);
    uint8_t buf[65536];
    SgError err;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        int stop = c->stopping;
        pthread_mutex_unlock(&c->mu);
        if (stop)
            break;
        struct pollfd pfd[2] = {{.fd = c->fd, .events = POLLIN},
                                {.fd = c->wake[0], .events = POLLIN}};
        int n = poll(pfd, 2, 1000);
        if (n == -1 && errno != EINTR) {
            sg_fail_errno(&err, SG_EIO, errno, "poll on the feed connection to %s", c->peer);
            set_io_err(c, &err);
            break;
        }
        if (n <= 0 || !(pfd[0].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        long got = net_read_some(c->fd, buf, sizeof buf, c->peer, &err);
        int rc = got < 0 ? (int)got : SG_OK;
        for (size_t off = 0; rc == 0 && off < (size_t)got;) {
            size_t used = 0;
            rc = net_frame_parser_feed(&p, buf + off, (size_t)got - off, &used, &err);
            off += used;
            if (rc == 1) {
                NetFrameHeader h;
                uint8_t *payload;
                net_frame_parser_take(&p, &h, &payload);
                rc = on_frame(c, &h, payload, &err);
                if (rc < 0 || h.flags == FEED_OP_ERROR)
                    free(payload);
            }
        }
        if (rc < 0) {
            if (rc == SG_EPEER)
                sg_fail(&err, SG_EPEER, "worker %s closed the feed connection", c->peer);
            set_io_err(c, &err);
            break;
        }
    }
    net_frame_parser_free(&p);
    return NULL;
}

/* Waits for the first queued frame with op (removed and returned), the
 * connection's error, or the deadline. */
static int wait_msg(FeedClient *c, uint16_t op, double deadline, FeedMsg **out, const char *what,
                    SgError *err)
{
    *out = NULL;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        FeedMsg *prev = NULL, *m = c->head;
        while (m != NULL && m->op != op)
            prev = m, m = m->next;
        if (m != NULL) {
            if (prev != NULL)
                prev->next = m->next;
            else
                c->head = m->next;
            if (c->tail == m)
                c->tail = prev;
            *out = m;
            break;
        }
        double left = deadline - sg_now();
        if (c->io_err.code != 0 || left <= 0)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double whole = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + (left < 1.0 ? left : 1.0);
        ts.tv_sec = (time_t)whole;
        ts.tv_nsec = (long)((whole - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    }
    int rc = SG_OK;
    if (*out == NULL && c->io_err.code != 0)
        rc = sg_fail(err, c->io_err.code, "%s", c->io_err.msg);
    else if (*out == NULL && what != NULL)
        rc = sg_fail(err, SG_ETIMEOUT, "timed out waiting for %s from worker %s", what, c->peer);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- API ----------------------------------------------------------------- */

int feed_client_connect(const char *host, int port, const uint8_t *secret, size_t secret_len,
                        NetSecurity mode, double timeout, FeedClient **out, SgError *err)
{
    double deadline;
    int rc;
    if ((rc = net_auth_check_secret(secret_len, err)) < 0 ||
        (rc = net_deadline(timeout, "FeedClient", &deadline, err)) < 0)
        return rc;
    FeedClient *c = calloc(1, sizeof *c);
    if (c == NULL)
        return sg_fail(err, SG_ENOMEM, "allocating a feed client");
    c->fd = c->wake[0] = c->wake[1] = -1;
    c->timeout = timeout;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->send_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    snprintf(c->peer, sizeof c->peer, "%s:%d", host, port);
    if ((rc = net_connect_auth(host, port, secret, secret_len, mode, deadline, &c->fd, &c->session,
                               c->peer, "feed: ", err)) == 0 &&
        (rc = net_wake_pipe(c->wake, err)) == 0) {
        if (pthread_create(&c->thread, NULL, reader_main, c) != 0)
            rc = sg_fail(err, SG_EIO, "cannot start the feed client's reader thread");
        else
            c->started = 1;
    }
    if (rc < 0) {
        feed_client_free(c);
        return rc;
    }
    *out = c;
    return SG_OK;
}

/* After a failed send: the worker's reason, if it gave one in time. */
static int explain_failure(FeedClient *c, int rc, SgError *err)
{
    FeedMsg *m;
    SgError why;
    if (wait_msg(c, 0, sg_now() + 0.5, &m, NULL, &why) < 0)
        *err = why, rc = why.code;
    return rc;
}

int feed_client_send(FeedClient *c, const FeedBatch *b, SgError *err)
{
    pthread_mutex_lock(&c->send_mu);
    int rc =
        feed_send_batch(c->fd, &c->session, FEED_OP_BATCH, b, sg_now() + c->timeout, c->peer, err);
    pthread_mutex_unlock(&c->send_mu);
    if (rc == SG_ETIMEOUT)
        sg_context(err, "the worker's feed queue stayed full (is it consuming?): ");
    else if (rc < 0)
        rc = explain_failure(c, rc, err);
    return rc;
}

int feed_client_end(FeedClient *c, const char *input, SgError *err)
{
    double deadline = sg_now() + c->timeout;
    pthread_mutex_lock(&c->send_mu);
    int rc = net_frame_send(c->fd, &c->session, NET_FRAME_FEED, FEED_OP_END, input, strlen(input),
                            deadline, c->peer, err);
    pthread_mutex_unlock(&c->send_mu);
    if (rc < 0)
        return explain_failure(c, rc, err);
    FeedMsg *m;
    char what[FEED_NAME_MAX + 64];
    snprintf(what, sizeof what, "the acknowledgement of the end of input '%s'", input);
    if ((rc = wait_msg(c, FEED_OP_ACK, deadline, &m, what, err)) < 0)
        return rc;
    free(m->payload);
    free(m);
    return SG_OK;
}

int feed_client_recv_results(FeedClient *c, double timeout, FeedBatch *out, uint8_t **payload,
                             SgError *err)
{
    double deadline;
    int rc = net_deadline(timeout, "FeedClient.recv_results", &deadline, err);
    *payload = NULL;
    FeedMsg *m = NULL;
    if (rc < 0 || (rc = wait_msg(c, FEED_OP_RESULT, deadline, &m, NULL, err)) < 0 || m == NULL)
        return rc;
    rc = feed_batch_decode(m->payload, m->len, out, err);
    if (rc < 0) {
        sg_context(err, "results from worker %s: ", c->peer);
        free(m->payload);
    } else {
        *payload = m->payload;
    }
    free(m);
    return rc;
}

void feed_client_free(FeedClient *c)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->mu);
    c->stopping = 1;
    pthread_mutex_unlock(&c->mu);
    if (c->started) {
        net_wake(c->wake[1]);
        pthread_join(c->thread, NULL);
    }
    net_close(&c->fd);
    net_session_free(&c->session);
    net_close(&c->wake[0]);
    net_close(&c->wake[1]);
    while (c->head != NULL) {
        FeedMsg *m = c->head;
        c->head = m->next;
        free(m->payload);
        free(m);
    }
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->send_mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}
