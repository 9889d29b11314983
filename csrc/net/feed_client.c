/*
 * feed_client.c - the feeder side of feed.h: connect + authenticate, send
 * batches straight from the caller's column buffers (net_frame_sendv pieces:
 * no copy, plain or protected alike), END and wait for the worker's ACK,
 * receive RESULT batches.
 *
 * The connection's reader thread (reader.h) owns the receiving half of the
 * socket: it queues ACK and RESULT frames and records the worker's ERROR (or
 * the connection's end), so results never back up behind a feeder that is
 * still sending, and a failed send reports the worker's reason rather than
 * a bare broken pipe.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "common/sg_le.h"
#include "net/auth.h"
#include "net/feed.h"
#include "net/reader.h"

#define FEED_CLIENT_MAX_FRAME (256u << 20)

struct FeedClient {
    int fd;
    NetSession session;      /* keyed by the handshake; send half under send_mu */
    pthread_mutex_t send_mu; /* send and end may come from different threads */
    char peer[NET_PEER_MAX];
    double timeout;
    NetReader rd; /* ACK and RESULT frames; rd.err, code != 0: the worker's ERROR, or the end */
    pthread_mutex_t mu;
    pthread_cond_t cv;
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

/* ---- the reader thread's callback ---------------------------------------- */

static int on_frame(void *ctx, const NetFrameHeader *h, uint8_t *payload, SgError *err)
{
    FeedClient *c = ctx;
    int rc = SG_OK;
    if (h->type != NET_FRAME_FEED ||
        (h->flags != FEED_OP_ACK && h->flags != FEED_OP_RESULT && h->flags != FEED_OP_ERROR))
        rc = sg_fail(err, SG_EPROTO, "worker %s sent a %s frame (op %u) on the feed connection",
                     c->peer, net_frame_type_name(h->type), h->flags);
    else if (h->flags == FEED_OP_ERROR && h->length < 4)
        rc = sg_fail(err, SG_EPROTO, "worker %s sent a malformed feed error", c->peer);
    else if (h->flags == FEED_OP_ERROR) {
        int32_t code = (int32_t)sg_get_le32(payload);
        rc = sg_fail(err, code < 0 && code > -100 ? code : SG_EPROTO,
                     "worker %s refused the feed: %.*s", c->peer,
                     (int)(h->length - 4 > 900 ? 900 : h->length - 4), (const char *)payload + 4);
    }
    if (rc < 0) {
        free(payload);
        return rc;
    }
    pthread_mutex_lock(&c->mu);
    if ((rc = net_reader_queue(&c->rd, h, payload)) < 0)
        sg_fail(err, rc, "queueing a frame from %s", c->peer);
    pthread_mutex_unlock(&c->mu);
    return rc;
}
/* Waits for the first queued frame with op (removed and returned), the
 * connection's error, or the deadline. */
static int wait_msg(FeedClient *c, uint16_t op, double deadline, NetMsg **out, const char *what,
                    SgError *err)
{
    pthread_mutex_lock(&c->mu);
    while ((*out = net_reader_take(&c->rd, op)) == NULL && c->rd.err.code == 0 &&
           net_cond_wait(&c->cv, &c->mu, deadline) != ETIMEDOUT)
        ;
    int rc = SG_OK;
    if (*out == NULL && c->rd.err.code != 0)
        rc = sg_fail(err, c->rd.err.code, "%s", c->rd.err.msg);
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
    c->fd = -1;
    c->timeout = timeout;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->send_mu, NULL);
    net_cond_init(&c->cv);
    snprintf(c->peer, sizeof c->peer, "%s:%d", host, port);
    rc = net_connect_auth(host, port, secret, secret_len, mode, deadline, &c->fd, &c->session,
                          c->peer, "feed: ", err);
    c->rd = (NetReader){.fd = c->fd,
                        .session = &c->session,
                        .peer = c->peer,
                        .who = "worker",
                        .what = "feed",
                        .max_frame = FEED_CLIENT_MAX_FRAME,
                        .mu = &c->mu,
                        .cv = &c->cv,
                        .ctx = c,
                        .frame = on_frame};
    if (rc == 0)
        rc = net_reader_start(&c->rd, err);
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
    NetMsg *m;
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
    NetMsg *m;
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
    NetMsg *m = NULL;
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
    net_reader_free(&c->rd);
    net_close(&c->fd);
    net_session_free(&c->session);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->send_mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}
