/*
 * feed_server.c - the worker's FeedServer (feed.h) as a handler of the
 * server of server.h (an accept thread, one thread per feeder connection):
 * per-input bounded queues of whole batches, and feed_server_next which
 * takes rows across batches for the trainer.
 *
 * Backpressure: a connection thread holding a batch that does not fit waits
 * (and so stops reading its socket) until the consumer frees space. Every
 * wait is bounded or woken by stop. Not here: the feeder (feed_client.c).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sg_le.h"
#include "net/feed.h"
#include "net/frame.h"
#include "net/server.h"
#include "net/sock.h"

#define FEED_IO_TIMEOUT 60.0

typedef struct FeedItem {
    uint32_t source; /* id of the feeder connection it came from */
    uint64_t rows, cursor;
    int ncols;
    FeedColumn *cols; /* data points into payload */
    uint8_t *payload;
    size_t bytes;
    struct FeedItem *next;
} FeedItem;

typedef struct FeedInput {
    char name[FEED_NAME_MAX + 1];
    FeedItem *head, *tail;
    size_t bytes;  /* queued payload bytes */
    uint64_t rows; /* queued rows not yet taken */
    int ended;     /* END markers received */
    int finished;
    FeedBatch *schema; /* the first batch's columns (data pointers unused) */
} FeedInput;

/* base.id, 1, 2, ... in accept order, is the "source" of its rows; the conn
 * thread (ACK, ERROR) and result senders write under base.send_mu. */
typedef struct FeedConn {
    NetConn base;
    FeedBatch *batch; /* decode scratch, allocated once the feeder authenticated */
} FeedConn;

struct FeedServer {
    NetServer *srv;
    size_t capacity;
    int expected;
    uint32_t max_frame;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* data queued, space freed, finished, stopping */
    FeedInput inputs[FEED_MAX_INPUTS];
    int ninputs;
    int finish_all, stopping;
    FeedStats stats;
};

/* The named input, created on first use; NULL if FEED_MAX_INPUTS are taken. */
static FeedInput *input_get(FeedServer *s, const char *name)
{
    for (int i = 0; i < s->ninputs; i++)
        if (strcmp(s->inputs[i].name, name) == 0)
            return &s->inputs[i];
    if (s->ninputs == FEED_MAX_INPUTS)
        return NULL;
    FeedInput *in = &s->inputs[s->ninputs++];
    memset(in, 0, sizeof *in);
    snprintf(in->name, sizeof in->name, "%s", name);
    return in;
}

static void item_free(FeedItem *it)
{
    free(it->payload);
    free(it->cols);
    free(it);
}

static int input_finished(const FeedServer *s, const FeedInput *in)
{
    return in->finished || s->finish_all;
}

/* ---- feeder connections --------------------------------------------------- */

static int enqueue(FeedServer *s, FeedConn *c, uint8_t *payload, size_t len, SgError *err)
{
    FeedBatch *b = c->batch;
    int rc = feed_batch_decode(payload, len, b, err);
    if (rc < 0)
        return sg_context(err, "from feeder %s: ", c->base.peer);
    FeedItem *item = calloc(1, sizeof *item);
    FeedColumn *cols = item != NULL ? malloc((size_t)b->ncols * sizeof *cols) : NULL;
    if (cols == NULL) {
        free(item);
        return sg_fail(err, SG_ENOMEM, "queueing a %zu-byte batch from %s", len, c->base.peer);
    }
    memcpy(cols, b->cols, (size_t)b->ncols * sizeof *cols);
    *item = (FeedItem){.source = c->base.id,
                       .rows = b->rows,
                       .ncols = b->ncols,
                       .cols = cols,
                       .payload = payload,
                       .bytes = len};
    pthread_mutex_lock(&s->mu);
    FeedInput *in = input_get(s, b->input);
    if (in == NULL)
        rc = sg_fail(err, SG_EINVAL, "feeder %s: more than %d named inputs", c->base.peer,
                     FEED_MAX_INPUTS);
    else if (in->schema == NULL && (in->schema = malloc(sizeof *in->schema)) != NULL)
        *in->schema = *b;
    else if (in->schema == NULL)
        rc = sg_fail(err, SG_ENOMEM, "recording the schema of input '%s'", b->input);
    else
        rc = feed_schema_check(in->schema, b, err);
    while (rc == 0 && in->bytes > 0 && in->bytes + len > s->capacity && !s->stopping)
        sg_cond_wait(&s->cv, &s->mu, sg_now() + 1.0); /* backpressure: the socket waits */
    if (rc == 0 && s->stopping)
        rc = sg_fail(err, SG_ECANCELLED, "the worker's feed server stopped");
    if (rc == 0) {
        if (in->tail != NULL)
            in->tail->next = item;
        else
            in->head = item;
        in->tail = item;
        in->bytes += len;
        in->rows += b->rows;
        s->stats.batches++;
        s->stats.rows_in += (long)b->rows;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (rc < 0) {
        free(cols);
        free(item);
        return rc;
    }
    return SG_OK;
}

static int end_input(FeedServer *s, FeedConn *c, const char *name, SgError *err)
{
    pthread_mutex_lock(&s->mu);
    FeedInput *in = input_get(s, name);
    if (in != NULL) {
        in->ended++;
        s->stats.ended++;
        if (s->expected > 0 && in->ended >= s->expected)
            in->finished = 1;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (in == NULL)
        return sg_fail(err, SG_EINVAL, "feeder %s: more than %d named inputs", c->base.peer,
                       FEED_MAX_INPUTS);
    pthread_mutex_lock(&c->base.send_mu);
    int rc = net_frame_send(c->base.fd, &c->base.session, NET_FRAME_FEED, FEED_OP_ACK, NULL, 0,
                            sg_now() + FEED_IO_TIMEOUT, c->base.peer, err);
    pthread_mutex_unlock(&c->base.send_mu);
    return rc;
}

/* NetHandler.serve: one frame from the feeder, whole and its tag checked
 * before anything of it is queued. */
static int serve_feeder(void *ctx, NetConn *nc, SgError *err)
{
    FeedServer *s = ctx;
    FeedConn *c = (FeedConn *)nc;
    NetFrameHeader h;
    uint8_t *payload = NULL;
    int rc = net_frame_recv(nc->fd, &nc->session, s->max_frame, sg_now() + FEED_IO_TIMEOUT,
                            nc->peer, &h, &payload, err);
    if (rc < 0)
        return rc;
    if (h.type != NET_FRAME_FEED || (h.flags != FEED_OP_BATCH && h.flags != FEED_OP_END))
        rc = sg_fail(err, SG_EPROTO, "feeder %s sent a %s frame (op %u) on the feed connection",
                     nc->peer, net_frame_type_name(h.type), h.flags);
    else if (h.flags == FEED_OP_BATCH && (rc = enqueue(s, c, payload, h.length, err)) == 0)
        payload = NULL; /* owned by the queue now */
    else if (h.flags == FEED_OP_END && (h.length == 0 || h.length > FEED_NAME_MAX ||
                                        strlen((const char *)payload) != h.length))
        rc = sg_fail(err, SG_EPROTO, "feeder %s sent END with a bad input name", nc->peer);
    else if (h.flags == FEED_OP_END)
        rc = end_input(s, c, (const char *)payload, err);
    free(payload);
    return rc;
}

static int feeder_open(void *ctx, NetConn *nc, SgError *err)
{
    FeedServer *s = ctx;
    pthread_mutex_lock(&s->mu);
    s->stats.feeders++;
    pthread_mutex_unlock(&s->mu);
    if ((((FeedConn *)nc)->batch = malloc(sizeof(FeedBatch))) == NULL)
        return sg_fail(err, SG_ENOMEM, "allocating a decode buffer for feeder %s", nc->peer);
    return SG_OK;
}

static void feeder_close(void *ctx, NetConn *nc, int rc, const SgError *err)
{
    FeedServer *s = ctx;
    free(((FeedConn *)nc)->batch);
    if (rc >= 0 || rc == SG_EPEER)
        return;
    pthread_mutex_lock(&s->mu);
    snprintf(s->stats.last_error, sizeof s->stats.last_error, "%.255s", err->msg);
    s->stats.rejected++;
    pthread_mutex_unlock(&s->mu);
    if (!nc->authed)
        return;
    /* Tell the feeder why: u32 code + message (never a peer that did not authenticate),
     * through the session: a frame of the feeder's that failed its tag broke only the
     * feeder -> worker direction. */
    uint8_t buf[4 + SG_ERROR_MAX];
    size_t n = strlen(err->msg);
    sg_put_le32(buf, (uint32_t)(int32_t)rc);
    memcpy(buf + 4, err->msg, n);
    SgError ignored;
    pthread_mutex_lock(&nc->send_mu);
    net_frame_send(nc->fd, &nc->session, NET_FRAME_FEED, FEED_OP_ERROR, buf, 4 + n, sg_now() + 1.0,
                   nc->peer, &ignored);
    pthread_mutex_unlock(&nc->send_mu);
}

static void feed_stopping(void *ctx)
{
    FeedServer *s = ctx;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* ---- API -------------------------------------------------------------------- */

int feed_server_start(int lfd, const uint8_t *secret, size_t secret_len, NetSecurity mode,
                      size_t capacity_bytes, int expected_feeders, uint32_t max_frame,
                      FeedServer **out, SgError *err)
{
    if (capacity_bytes == 0 || expected_feeders < 0 || max_frame < 64)
        return sg_fail(
            err, SG_EINVAL,
            "FeedServer needs capacity_bytes > 0, expected_feeders >= 0, max_frame >= 64");
    FeedServer *s = calloc(1, sizeof *s);
    if (s == NULL)
        return sg_fail(err, SG_ENOMEM, "allocating a feed server");
    pthread_mutex_init(&s->mu, NULL);
    sg_cond_init(&s->cv);
    s->capacity = capacity_bytes, s->expected = expected_feeders, s->max_frame = max_frame;
    NetHandler h = {.ctx = s,
                    .conn_size = sizeof(FeedConn),
                    .open = feeder_open,
                    .serve = serve_feeder,
                    .close = feeder_close,
                    .stopping = feed_stopping};
    int rc = net_server_new(lfd, secret, secret_len, mode, "feed server", &h, &s->srv, err);
    if (rc == 0)
        rc = net_server_start(s->srv, err);
    if (rc < 0) {
        feed_server_free(s);
        return rc;
    }
    *out = s;
    return SG_OK;
}

/* Copies take rows of in (take <= in->rows) into out; frees used batches. */
static int take_rows(FeedServer *s, FeedInput *in, uint64_t take, FeedOut *out, SgError *err)
{
    if (out->want_sources) {
        out->sources = malloc(take * sizeof *out->sources + 1);
        if (out->sources == NULL)
            return sg_fail(err, SG_ENOMEM, "allocating %llu row sources", (unsigned long long)take);
    }
    const FeedBatch *sc = in->schema;
    out->ncols = sc != NULL ? sc->ncols : 0;
    out->rows = take;
    for (int c = 0; c < out->ncols; c++) {
        out->cols[c] = sc->cols[c];
        out->cols[c].dims[0] = take;
        out->cols[c].data = malloc(take * sc->cols[c].row_bytes + 1);
        if (out->cols[c].data == NULL) {
            out->ncols = c;
            feed_out_free(out);
            return sg_fail(err, SG_ENOMEM, "allocating %llu rows of column '%s'",
                           (unsigned long long)take, sc->cols[c].name);
        }
    }
    uint64_t done = 0;
    while (done < take) {
        FeedItem *it = in->head;
        uint64_t k = it->rows - it->cursor < take - done ? it->rows - it->cursor : take - done;
        for (int c = 0; c < out->ncols; c++) {
            size_t rb = (size_t)it->cols[c].row_bytes;
            memcpy((uint8_t *)out->cols[c].data + done * rb, it->cols[c].data + it->cursor * rb,
                   (size_t)k * rb);
        }
        for (uint64_t r = 0; out->sources != NULL && r < k; r++)
            out->sources[done + r] = it->source;
        it->cursor += k;
        done += k;
        if (it->cursor == it->rows) {
            in->head = it->next;
            if (in->head == NULL)
                in->tail = NULL;
            in->bytes -= it->bytes;
            item_free(it);
            pthread_cond_broadcast(&s->cv); /* space for waiting feeders */
        }
    }
    in->rows -= take;
    s->stats.rows_out += (long)take;
    return SG_OK;
}

int feed_server_next(FeedServer *s, const char *input, uint64_t n, uint64_t min_rows,
                     double timeout, FeedOut *out, SgError *err)
{
    double deadline;
    int rc = sg_deadline(timeout, "FeedServer.next_batch", &deadline, err);
    if (rc < 0)
        return rc;
    if (min_rows > n)
        return sg_fail(err, SG_EINVAL,
                       "FeedServer.next_batch: min_rows %llu must be in 0..n (%llu)",
                       (unsigned long long)min_rows, (unsigned long long)n);
    int want_sources = out->want_sources;
    memset(out, 0, sizeof *out);
    out->want_sources = want_sources;
    pthread_mutex_lock(&s->mu);
    FeedInput *in = input_get(s, input);
    if (in == NULL) {
        pthread_mutex_unlock(&s->mu);
        return sg_fail(err, SG_EINVAL, "more than %d named inputs", FEED_MAX_INPUTS);
    }
    while (in->rows < min_rows && !input_finished(s, in) && !s->stopping && sg_now() < deadline)
        sg_cond_wait(&s->cv, &s->mu, deadline);
    if (in->rows >= min_rows || input_finished(s, in))
        rc = take_rows(s, in, in->rows < n ? in->rows : n, out, err);
    else if (s->stopping)
        rc = sg_fail(err, SG_ECANCELLED, "feed server stopped while waiting for rows of input '%s'",
                     input);
    else
        rc = sg_fail(err, SG_ETIMEOUT,
                     "waited %.1f s for %llu rows of input '%s': %llu queued, %ld feeder "
                     "connection(s) so far, "
                     "%d sent END for this input, end of data not signalled (the driver calls "
                     "finish when every "
                     "partition is fed)",
                     timeout, (unsigned long long)min_rows, input, (unsigned long long)in->rows,
                     s->stats.feeders, in->ended);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void feed_server_finish(FeedServer *s, const char *input)
{
    pthread_mutex_lock(&s->mu);
    if (input == NULL) {
        s->finish_all = 1;
    } else {
        FeedInput *in = input_get(s, input);
        if (in != NULL)
            in->finished = 1;
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

int feed_server_drained(FeedServer *s, const char *input)
{
    pthread_mutex_lock(&s->mu);
    FeedInput *in = input_get(s, input);
    int v = in == NULL || (input_finished(s, in) && in->rows == 0);
    pthread_mutex_unlock(&s->mu);
    return v;
}

void feed_server_stats(FeedServer *s, FeedStats *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    out->queued_bytes = 0;
    for (int i = 0; i < s->ninputs; i++)
        out->queued_bytes += s->inputs[i].bytes;
    pthread_mutex_unlock(&s->mu);
}

void feed_server_set_auth_timeout(FeedServer *s, double seconds)
{
    net_server_set_auth_timeout(s->srv, seconds);
}

void feed_server_stop(FeedServer *s)
{
    feed_stopping(s);
    if (s->srv != NULL) {
        SgError ignored;
        net_server_end(s->srv, NET_SERVER_STOPPED);
        net_server_wait(s->srv, -1, &ignored);
    }
}

void feed_server_free(FeedServer *s)
{
    if (s == NULL)
        return;
    feed_server_stop(s);
    for (int i = 0; i < s->ninputs; i++) {
        FeedInput *in = &s->inputs[i];
        for (FeedItem *it = in->head, *next; it != NULL; it = next) {
            next = it->next;
            item_free(it);
        }
        free(in->schema);
    }
    net_server_free(s->srv);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

void feed_out_free(FeedOut *out)
{
    free(out->sources);
    out->sources = NULL;
    for (int c = 0; c < out->ncols; c++) {
        free((void *)out->cols[c].data);
        out->cols[c].data = NULL;
    }
    out->ncols = 0;
}

int feed_server_send_results(FeedServer *s, uint32_t source, const FeedBatch *b, double timeout,
                             SgError *err)
{
    double deadline;
    int rc = sg_deadline(timeout, "FeedServer.send_results", &deadline, err);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&s->mu);
    int stopping = s->stopping;
    pthread_mutex_unlock(&s->mu);
    int gone = 0;
    NetConn *c = stopping ? NULL : net_server_conn_get(s->srv, source, &gone);
    if (gone)
        return sg_fail(err, SG_EPEER,
                       "sending results to feeder %u: its connection has ended (the feeder "
                       "closed it)",
                       source);
    if (c == NULL)
        return sg_fail(err, stopping ? SG_ESTATE : SG_EINVAL,
                       "no feeder connection with source id %u%s", source,
                       stopping ? " (the feed server is closed)" : "");
    pthread_mutex_lock(&c->send_mu);
    rc = feed_send_batch(c->fd, &c->session, FEED_OP_RESULT, b, deadline, c->peer, err);
    pthread_mutex_unlock(&c->send_mu);
    if (rc == SG_EPEER || rc == SG_EIO)
        sg_context(err, "sending results to feeder %u: ", source);
    net_server_conn_put(s->srv, c);
    return rc;
}
