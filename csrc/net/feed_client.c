/*
 * feed_client.c - the feeder side of feed.h: connect + authenticate, send
 * batches straight from the caller's column buffers (writev, no copy), END
 * and wait for the worker's ACK. When the worker refuses a batch it sends an
 * ERROR frame before closing; a failed send looks for it so the feeder
 * reports the worker's reason instead of a bare broken pipe.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "net/auth.h"
#include "net/feed.h"
#include "net/frame.h"
#include "net/sock.h"

struct FeedClient {
    int fd;
    char peer[NET_PEER_MAX];
    double timeout;
};

/* Decodes an ERROR frame payload into err. */
static int worker_error(FeedClient *c, const uint8_t *p, size_t len, SgError *err)
{
    if (len < 4)
        return sg_fail(err, SG_EPROTO, "worker %s sent a malformed feed error", c->peer);
    int32_t code = (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                             (uint32_t)p[3] << 24);
    return sg_fail(err, code < 0 && code > -100 ? code : SG_EPROTO,
                   "worker %s refused the feed: %.*s", c->peer,
                   (int)(len - 4 > 900 ? 900 : len - 4), (const char *)p + 4);
}

/* After a failed send: the worker's ERROR frame, if one is waiting. */
static int explain_failure(FeedClient *c, int rc, SgError *err)
{
    NetFrameHeader h;
    uint8_t *p = NULL;
    SgError e;
    if (net_frame_recv(c->fd, 4 + SG_ERROR_MAX, net_now() + 0.5, c->peer, &h, &p, &e) == 0 &&
        h.type == NET_FRAME_FEED && h.flags == FEED_OP_ERROR)
        rc = worker_error(c, p, h.length, err);
    free(p);
    return rc;
}

int feed_client_connect(const char *host, int port, const uint8_t *secret, size_t secret_len,
                        double timeout, FeedClient **out, SgError *err)
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
    snprintf(c->peer, sizeof c->peer, "%s:%d", host, port);
    if ((rc = net_connect(host, port, deadline, &c->fd, err)) < 0)
        sg_context(err, "feed: ");
    else
        rc = net_auth_client(c->fd, secret, secret_len, deadline, c->peer, err);
    if (rc < 0) {
        feed_client_free(c);
        return rc;
    }
    *out = c;
    return SG_OK;
}

int feed_client_send(FeedClient *c, const FeedBatch *b, SgError *err)
{
    size_t meta_cap =
        16 + FEED_NAME_MAX + (size_t)b->ncols * (FEED_NAME_MAX + 16 + 8 * FEED_MAX_NDIM);
    uint8_t *meta = malloc(meta_cap);
    struct iovec *iov = malloc((2 * (size_t)FEED_MAX_COLUMNS + 1) * sizeof *iov);
    int rc = SG_OK;
    if (meta == NULL || iov == NULL) {
        rc = sg_fail(err, SG_ENOMEM, "encoding a feed batch");
        goto cleanup;
    }
    long len = feed_batch_encode(b, meta, meta_cap, iov + 1, err);
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
    uint8_t hdr[NET_FRAME_HEADER_SIZE];
    net_frame_header_encode(hdr, NET_FRAME_FEED, FEED_OP_BATCH, (uint32_t)len);
    iov[0] = (struct iovec){hdr, sizeof hdr};
    rc = net_writev_all(c->fd, iov, 2 * b->ncols + 1, net_now() + c->timeout, c->peer,
                        "a feed batch", err);
    if (rc == SG_ETIMEOUT)
        sg_context(err, "the worker's feed queue stayed full (is it consuming?): ");
    else if (rc < 0)
        rc = explain_failure(c, rc, err);
cleanup:
    free(meta);
    free(iov);
    return rc;
}

int feed_client_end(FeedClient *c, const char *input, SgError *err)
{
    double deadline = net_now() + c->timeout;
    int rc = net_frame_send(c->fd, NET_FRAME_FEED, FEED_OP_END, input, strlen(input), deadline,
                            c->peer, err);
    if (rc < 0)
        return explain_failure(c, rc, err);
    NetFrameHeader h;
    uint8_t *p = NULL;
    if ((rc = net_frame_recv(c->fd, 4 + SG_ERROR_MAX, deadline, c->peer, &h, &p, err)) < 0)
        return sg_context(err,
                          "waiting for the worker to acknowledge the end of input '%s': ", input);
    if (h.type == NET_FRAME_FEED && h.flags == FEED_OP_ERROR)
        rc = worker_error(c, p, h.length, err);
    else if (h.type != NET_FRAME_FEED || h.flags != FEED_OP_ACK)
        rc = sg_fail(err, SG_EPROTO, "worker %s answered END with a %s frame (op %u)", c->peer,
                     net_frame_type_name(h.type), h.flags);
    free(p);
    return rc;
}

void feed_client_free(FeedClient *c)
{
    if (c == NULL)
        return;
    net_close(&c->fd);
    free(c);
}
