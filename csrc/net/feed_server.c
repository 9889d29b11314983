/*
 * feed_server.c - the worker's FeedServer (feed.h): an accept thread, one
 * thread per feeder connection, per-input bounded queues of whole batches,
 * and feed_server_next which takes rows across batches for the trainer.
 *
 * Backpressure: a connection thread holding a batch that does not fit waits
 * (and so stops reading its socket) until the consumer frees space. Every
 * wait is bounded or woken by stop. Not here: the feeder (feed_client.c).
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "net/accept.h"
#include "net/auth.h"
#include "net/feed.h"
#include "net/frame.h"
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

typedef struct FeedConn {
    struct FeedServer *s;
    uint32_t id; /* 1, 2, ... in accept order: the "source" of its rows */
    int fd;
    NetSession session;      /* keyed by the handshake; its send half under send_mu */
    pthread_mutex_t send_mu; /* the conn thread (ACK, ERROR) and result senders write */
    char peer[NET_PEER_MAX];
    pthread_t thread;
    FeedBatch *batch; /* decode scratch, allocated once the feeder authenticated */
    double auth_deadline;
    int ended; /* the thread is done: the accept thread joins and frees it */
    int refs;  /* feed_server_send_results calls using it (under s->mu) */
} FeedConn;

struct FeedServer {
    int lfd;
    uint8_t *secret;
    size_t secret_len;
    NetSecurity mode;
    size_t capacity;
    int expected;
    uint32_t max_frame;
    int wake[2];
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* data queued, space freed, finished, stopping */
    FeedInput inputs[FEED_MAX_INPUTS];
    int ninputs;
    int finish_all, stopping;
    FeedConn **conns; /* live connections, under mu; ended ones are reaped at once */
    size_t nconns, capconns;
    uint32_t next_id; /* ids given so far */
    double auth_timeout;
    NetGate gate;
    int senders; /* feed_server_send_results calls in flight (they use conns without mu) */
    FeedStats stats;
};

static void note(FeedServer *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(FeedServer *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->stats.last_error, sizeof s->stats.last_error, fmt, ap);
    va_end(ap);
    s->stats.rejected++;
}

static void wait_until(FeedServer *s, double deadline)
{
    double left = deadline - sg_now();
    if (left > 1.0)
        left = 1.0;
    if (left <= 0)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double whole = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + left;
    ts.tv_sec = (time_t)whole;
    ts.tv_nsec = (long)((whole - (double)ts.tv_sec) * 1e9);
    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
}

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
        return sg_context(err, "from feeder %s: ", c->peer);
    FeedItem *item = calloc(1, sizeof *item);
    FeedColumn *cols = item != NULL ? malloc((size_t)b->ncols * sizeof *cols) : NULL;
    if (cols == NULL) {
        free(item);
        return sg_fail(err, SG_ENOMEM, "queueing a %zu-byte batch from %s", len, c->peer);
    }
    memcpy(cols, b->cols, (size_t)b->ncols * sizeof *cols);
    *item = (FeedItem){.source = c->id,
                       .rows = b->rows,
                       .ncols = b->ncols,
                       .cols = cols,
                       .payload = payload,
                       .bytes = len};
    pthread_mutex_lock(&s->mu);
    FeedInput *in = input_get(s, b->input);
    if (in == NULL)
        rc = sg_fail(err, SG_EINVAL, "feeder %s: more than %d named inputs", c->peer,
                     FEED_MAX_INPUTS);
    else if (in->schema == NULL && (in->schema = malloc(sizeof *in->schema)) != NULL)
        *in->schema = *b;
    else if (in->schema == NULL)
        rc = sg_fail(err, SG_ENOMEM, "recording the schema of input '%s'", b->input);
    else
        rc = feed_schema_check(in->schema, b, err);
    while (rc == 0 && in->bytes > 0 && in->bytes + len > s->capacity && !s->stopping)
        wait_until(s,
                   sg_now() + 1.0); /* backpressure: this feeder's socket is not read meanwhile */
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
        return sg_fail(err, SG_EINVAL, "feeder %s: more than %d named inputs", c->peer,
                       FEED_MAX_INPUTS);
    pthread_mutex_lock(&c->send_mu);
    int rc = net_frame_send(c->fd, &c->session, NET_FRAME_FEED, FEED_OP_ACK, NULL, 0,
                            sg_now() + FEED_IO_TIMEOUT, c->peer, err);
    pthread_mutex_unlock(&c->send_mu);
    return rc;
}

/* Waits for the next frame; 1 when stopping. */
static int wait_frame(FeedServer *s, FeedConn *c, SgError *err)
{
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int stop = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (stop)
            return 1;
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        int n = poll(&p, 1, 1000);
        if (n == -1 && errno != EINTR)
            return sg_fail_errno(err, SG_EIO, errno, "poll on feeder %s", c->peer);
        if (n > 0)
            return SG_OK;
    }
}

static int serve_feeder(FeedServer *s, FeedConn *c, SgError *err)
{
    int rc;
    while ((rc = wait_frame(s, c, err)) == 0) {
        NetFrameHeader h;
        uint8_t *payload = NULL;
        /* Whole frame, tag checked, before anything of it is queued. */
        if ((rc = net_frame_recv(c->fd, &c->session, s->max_frame, sg_now() + FEED_IO_TIMEOUT,
                                 c->peer, &h, &payload, err)) < 0)
            return rc;
        if (h.type != NET_FRAME_FEED || (h.flags != FEED_OP_BATCH && h.flags != FEED_OP_END))
            rc = sg_fail(err, SG_EPROTO, "feeder %s sent a %s frame (op %u) on the feed connection",
                         c->peer, net_frame_type_name(h.type), h.flags);
        else if (h.flags == FEED_OP_BATCH && (rc = enqueue(s, c, payload, h.length, err)) == 0)
            payload = NULL; /* owned by the queue now */
        else if (h.flags == FEED_OP_END && (h.length == 0 || h.length > FEED_NAME_MAX ||
                                            strlen((const char *)payload) != h.length))
            rc = sg_fail(err, SG_EPROTO, "feeder %s sent END with a bad input name", c->peer);
        else if (h.flags == FEED_OP_END)
            rc = end_input(s, c, (const char *)payload, err);
        free(payload);
        if (rc < 0)
            return rc;
    }
    return rc;
}

static void *conn_main(void *arg)
{
    FeedConn *c = arg;
    FeedServer *s = c->s;
    SgError err;
    int rc = net_auth_server(c->fd, s->secret, s->secret_len, s->mode, c->auth_deadline, c->peer,
                             &c->session, &err);
    int authed = rc == 0;
    if (authed)
        net_gate_authenticated(&s->gate, c->peer);
    else
        net_gate_release(&s->gate, c->peer);
    if (authed) {
        pthread_mutex_lock(&s->mu);
        s->stats.feeders++;
        pthread_mutex_unlock(&s->mu);
        if ((c->batch = malloc(sizeof *c->batch)) == NULL)
            rc = sg_fail(&err, SG_ENOMEM, "allocating a decode buffer for feeder %s", c->peer);
    }
    if (rc == 0)
        rc = serve_feeder(s, c, &err);
    if (rc < 0 && rc != SG_EPEER) {
        pthread_mutex_lock(&s->mu);
        note(s, "%s", err.msg);
        pthread_mutex_unlock(&s->mu);
    }
    if (authed && rc < 0 && rc != SG_EPEER) {
        /* Tell the feeder why: u32 code + message (never a peer that did not authenticate),
         * through the session: a frame of the feeder's that failed its tag broke only the
         * feeder -> worker direction. */
        uint8_t buf[4 + SG_ERROR_MAX];
        size_t n = strlen(err.msg);
        uint32_t code = (uint32_t)(int32_t)rc;
        for (int i = 0; i < 4; i++)
            buf[i] = (uint8_t)(code >> (8 * i));
        memcpy(buf + 4, err.msg, n);
        SgError ignored;
        pthread_mutex_lock(&c->send_mu);
        net_frame_send(c->fd, &c->session, NET_FRAME_FEED, FEED_OP_ERROR, buf, 4 + n,
                       sg_now() + 1.0, c->peer, &ignored);
        pthread_mutex_unlock(&c->send_mu);
    }
    shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_lock(&s->mu);
    c->ended = 1;
    net_wake(s->wake[1]); /* the accept thread reaps it */
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Starts a thread for an admitted (unauthenticated) connection; on failure
 * closes it and gives its place in the gate back. */
static void add_conn(FeedServer *s, int fd, const char *peer)
{
    FeedConn *c = calloc(1, sizeof *c);
    pthread_mutex_lock(&s->mu);
    FeedConn **grown = c != NULL && s->nconns == s->capconns
                           ? realloc(s->conns, (s->capconns ? 2 * s->capconns : 8) * sizeof *grown)
                           : s->conns;
    if (c != NULL && grown != NULL && s->nconns == s->capconns) {
        s->conns = grown;
        s->capconns = s->capconns ? 2 * s->capconns : 8;
    }
    int ok = c != NULL && grown != NULL;
    if (ok) {
        *c = (FeedConn){
            .s = s, .id = ++s->next_id, .fd = fd, .auth_deadline = sg_now() + s->auth_timeout};
        snprintf(c->peer, sizeof c->peer, "%s", peer);
        pthread_mutex_init(&c->send_mu, NULL);
        ok = pthread_create(&c->thread, NULL, conn_main, c) == 0;
        if (!ok)
            pthread_mutex_destroy(&c->send_mu);
    }
    if (ok)
        s->conns[s->nconns++] = c;
    pthread_mutex_unlock(&s->mu);
    if (!ok) {
        free(c);
        close(fd);
        net_gate_release(&s->gate, peer);
    }
}

static void add_conn_cb(void *ctx, int fd, const char *peer)
{
    add_conn((FeedServer *)ctx, fd, peer);
}

static void conn_free(FeedConn *c)
{
    pthread_join(c->thread, NULL);
    net_close(&c->fd);
    net_session_free(&c->session);
    pthread_mutex_destroy(&c->send_mu);
    free(c->batch);
    free(c);
}

/* Joins and frees ended connections no result sender holds: their socket,
 * thread and buffer go as soon as the feeder is done, not at shutdown. */
static void reap_conns(FeedServer *s)
{
    FeedConn *ended[64];
    size_t n = 0, j = 0;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nconns; i++) {
        FeedConn *c = s->conns[i];
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

static void *accept_main(void *arg)
{
    FeedServer *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int stop = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (stop)
            break;
        int ms = 1000;
        /* the listener is left out while the gate backs off (EMFILE & co) */
        struct pollfd p[2] = {{.fd = net_gate_poll_fd(&s->gate, s->lfd, &ms), .events = POLLIN},
                              {.fd = s->wake[0], .events = POLLIN}};
        int n = poll(p, 2, ms);
        if (n < 0)
            continue; /* EINTR; other poll errors cannot happen on valid fds */
        if (p[1].revents)
            net_wake_drain(s->wake[0]);
        reap_conns(s);
        net_gate_accept_ready(&s->gate, s->lfd, p[0].fd < 0 || (p[0].revents & POLLIN), add_conn_cb,
                              s);
    }
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nconns; i++)
        shutdown(s->conns[i]->fd, SHUT_RDWR);
    while (s->senders > 0) /* result senders fail fast on the shut sockets */
        wait_until(s, sg_now() + 1.0);
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < s->nconns; i++)
        conn_free(s->conns[i]);
    s->nconns = 0;
    return NULL;
}

/* ---- API -------------------------------------------------------------------- */

int feed_server_start(int lfd, const uint8_t *secret, size_t secret_len, NetSecurity mode,
                      size_t capacity_bytes, int expected_feeders, uint32_t max_frame,
                      FeedServer **out, SgError *err)
{
    int rc = net_auth_check_secret(secret_len, err);
    if (rc < 0)
        return rc;
    if (capacity_bytes == 0 || expected_feeders < 0 || max_frame < 64)
        return sg_fail(
            err, SG_EINVAL,
            "FeedServer needs capacity_bytes > 0, expected_feeders >= 0, max_frame >= 64");
    FeedServer *s = calloc(1, sizeof *s);
    if (s == NULL)
        return sg_fail(err, SG_ENOMEM, "allocating a feed server");
    s->wake[0] = s->wake[1] = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    s->mode = mode;
    s->lfd = lfd, s->capacity = capacity_bytes, s->expected = expected_feeders,
    s->max_frame = max_frame;
    s->auth_timeout = NET_AUTH_TIMEOUT_DEFAULT;
    rc = net_gate_init(&s->gate, NET_GATE_MAX_UNAUTH, NET_GATE_MAX_PER_PEER, err);
    if (rc == 0 && (s->secret = malloc(secret_len)) == NULL)
        rc = sg_fail(err, SG_ENOMEM, "allocating a feed server");
    else if (rc == 0)
        memcpy(s->secret, secret, s->secret_len = secret_len);
    if (rc == 0)
        rc = net_wake_pipe(s->wake, err);
    if (rc == 0 && pthread_create(&s->thread, NULL, accept_main, s) != 0)
        rc = sg_fail(err, SG_EIO, "cannot start the feed server thread");
    if (rc < 0) {
        feed_server_free(s);
        return rc;
    }
    s->started = 1;
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
            free(it->payload);
            free(it->cols);
            free(it);
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
    int rc = net_deadline(timeout, "FeedServer.next_batch", &deadline, err);
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
        wait_until(s, deadline);
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
    pthread_mutex_lock(&s->mu);
    s->auth_timeout = seconds;
    pthread_mutex_unlock(&s->mu);
}

void feed_server_stop(FeedServer *s)
{
    pthread_mutex_lock(&s->mu);
    int was = s->stopping;
    s->stopping = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (!was && s->started) {
        net_wake(s->wake[1]);
        pthread_join(s->thread, NULL);
        s->started = 0;
    }
}

void feed_server_free(FeedServer *s)
{
    if (s == NULL)
        return;
    feed_server_stop(s);
    for (int i = 0; i < s->ninputs; i++) {
        FeedInput *in = &s->inputs[i];
        while (in->head != NULL) {
            FeedItem *it = in->head;
            in->head = it->next;
            free(it->payload);
            free(it->cols);
            free(it);
        }
        free(in->schema);
    }
    net_close(&s->wake[0]);
    net_close(&s->wake[1]);
    free(s->conns);
    if (s->secret != NULL)
        OPENSSL_cleanse(s->secret, s->secret_len);
    free(s->secret);
    net_gate_free(&s->gate);
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
    int rc = net_deadline(timeout, "FeedServer.send_results", &deadline, err);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&s->mu);
    FeedConn *c = NULL;
    for (size_t i = 0; !s->stopping && i < s->nconns && c == NULL; i++)
        if (s->conns[i]->id == source)
            c = s->conns[i];
    if (c != NULL && c->ended && c->batch == NULL)
        c = NULL; /* never authenticated: not a feeder */
    int gone = c == NULL && !s->stopping && source >= 1 && source <= s->next_id;
    if (c != NULL)
        s->senders++, c->refs++;
    pthread_mutex_unlock(&s->mu);
    if (gone)
        return sg_fail(err, SG_EPEER,
                       "sending results to feeder %u: its connection has ended (the feeder "
                       "closed it)",
                       source);
    if (c == NULL)
        return sg_fail(err, s->stopping ? SG_ESTATE : SG_EINVAL,
                       "no feeder connection with source id %u%s", source,
                       s->stopping ? " (the feed server is closed)" : "");
    pthread_mutex_lock(&c->send_mu);
    rc = feed_send_batch(c->fd, &c->session, FEED_OP_RESULT, b, deadline, c->peer, err);
    pthread_mutex_unlock(&c->send_mu);
    if (rc == SG_EPEER || rc == SG_EIO)
        sg_context(err, "sending results to feeder %u: ", source);
    pthread_mutex_lock(&s->mu);
    s->senders--;
    if (--c->refs == 0 && c->ended)
        net_wake(s->wake[1]); /* reap it now */
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return rc;
}
