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
    /* send and end may come from different threads; net.rd queues ACK and
     * RESULT frames, and its err (code != 0) is the worker's ERROR, or the end */
    NetClient net;
    double timeout;
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
                     c->net.peer, net_frame_type_name(h->type), h->flags);
    else if (h->flags == FEED_OP_ERROR && h->length < 4)
        rc = sg_fail(err, SG_EPROTO, "worker %s sent a malformed feed error", c->net.peer);
    else if (h->flags == FEED_OP_ERROR) {
        int32_t code = (int32_t)sg_get_le32(payload);
        rc = sg_fail(err, code < 0 && code > -100 ? code : SG_EPROTO,
                     "worker %s refused the feed: %.*s", c->net.peer,
                     (int)(h->length - 4 > 900 ? 900 : h->length - 4), (const char *)payload + 4);
    }
    if (rc < 0) {
        free(payload);
        return rc;
    }
    pthread_mutex_lock(&c->net.mu);
    if ((rc = net_msgq_push(&c->net.rd.q, h->flags, payload, h->length)) < 0)
        sg_fail(err, rc, "queueing a frame from %s", c->net.peer);
    pthread_cond_broadcast(&c->net.cv);
    pthread_mutex_unlock(&c->net.mu);
    return rc;
}
/* Waits for the first queued frame with op (removed and returned), the
 * connection's error, or the deadline. */
static int wait_msg(FeedClient *c, uint16_t op, double deadline, NetMsg **out, const char *what,
                    SgError *err)
{
    pthread_mutex_lock(&c->net.mu);
    while ((*out = net_msgq_take(&c->net.rd.q, op)) == NULL && c->net.rd.err.code == 0 &&
           sg_cond_wait(&c->net.cv, &c->net.mu, deadline) != ETIMEDOUT)
        ;
    int rc = SG_OK;
    if (*out == NULL && c->net.rd.err.code != 0)
        rc = sg_fail(err, c->net.rd.err.code, "%s", c->net.rd.err.msg);
    else if (*out == NULL && what != NULL)
        rc =
            sg_fail(err, SG_ETIMEOUT, "timed out waiting for %s from worker %s", what, c->net.peer);
    pthread_mutex_unlock(&c->net.mu);
    return rc;
}

/* ---- API ----------------------------------------------------------------- */

int feed_client_connect(const char *host, int port, const uint8_t *secret, size_t secret_len,
                        NetSecurity mode, double timeout, FeedClient **out, SgError *err)
{
    double deadline;
    int rc;
    if ((rc = net_auth_check_secret(secret_len, err)) < 0 ||
        (rc = sg_deadline(timeout, "FeedClient", &deadline, err)) < 0)
        return rc;
    FeedClient *c = calloc(1, sizeof *c);
    if (c == NULL)
        return sg_fail(err, SG_ENOMEM, "allocating a feed client");
    c->timeout = timeout;
    const NetReader reader = {.who = "worker",
                              .what = "feed",
                              .max_frame = FEED_CLIENT_MAX_FRAME,
                              .ctx = c,
                              .frame = on_frame};
    rc = net_client_open(&c->net, host, port, secret, secret_len, mode, deadline, "feed: ", &reader,
                         err);
    if (rc == 0)
        rc = net_reader_start(&c->net.rd, err);
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
    pthread_mutex_lock(&c->net.send_mu);
    int rc = feed_send_batch(c->net.fd, &c->net.session, FEED_OP_BATCH, b, sg_now() + c->timeout,
                             c->net.peer, err);
    pthread_mutex_unlock(&c->net.send_mu);
    if (rc == SG_ETIMEOUT)
        sg_context(err, "the worker's feed queue stayed full (is it consuming?): ");
    else if (rc < 0)
        rc = explain_failure(c, rc, err);
    return rc;
}

int feed_client_end(FeedClient *c, const char *input, SgError *err)
{
    double deadline = sg_now() + c->timeout;
    int rc =
        net_client_send(&c->net, NET_FRAME_FEED, FEED_OP_END, input, strlen(input), deadline, err);
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
    int rc = sg_deadline(timeout, "FeedClient.recv_results", &deadline, err);
    *payload = NULL;
    NetMsg *m = NULL;
    if (rc < 0 || (rc = wait_msg(c, FEED_OP_RESULT, deadline, &m, NULL, err)) < 0 || m == NULL)
        return rc;
    rc = feed_batch_decode(m->payload, m->len, out, err);
    if (rc < 0) {
        sg_context(err, "results from worker %s: ", c->net.peer);
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
    net_client_free(&c->net);
    free(c);
}
