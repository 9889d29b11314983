/*
 * ps_server.c - one parameter-server shard (ps.h) as a handler of the
 * server of server.h (one thread per worker connection; ps_server_serve is
 * its start, wait and stop): the shard under one mutex, async and sync
 * application of gradients, the workers' model state (PUT_STATE /
 * MEAN_STATE) under a mutex of its own.
 *
 * Every wait is bounded or woken: the server's end sets `closing` and
 * shuts every connection down, so blocked reads return at once. Each
 * connection keeps the session its handshake keyed (cfg.security):
 * requests are read in parts straight into the connection's buffers and
 * handled only after their tag checked; replies and errors go out as pieces
 * of one protected frame. Not here: the worker side (ps_client.c).
 */
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sg_half.h"
#include "net/frame.h"
#include "net/ps.h"
#include "net/ps_rows.h"
#include "net/server.h"
#include "net/sock.h"

#define PS_IO_TIMEOUT 60.0 /* seconds for one request body or reply to cross */

typedef struct PsConn {
    NetConn base;
    struct PsServer *s;
    int send_failed; /* a frame to the worker broke off: nothing more may follow it */
    long worker_id;  /* -1 until HELLO */
    int said_done;
    int first_done; /* this connection marked its worker done: ack it, then count */
    float *buf;     /* count floats: gradients in, parameters out (after auth) */
    float *extra;   /* SET_STATE / GET_STATE: optimizer state, PUT_STATE / MEAN_STATE:
                       model state (malloc'd per request) */
    size_t extra_len;
    uint8_t *aux; /* HELLO: the table layout, *_ROWS: entries and ids (per request) */
} PsConn;

struct PsServer {
    NetServer *srv;
    PsServerConfig cfg;
    size_t opt_floats; /* optimizer state size (fixed) */

    pthread_mutex_t mu;
    pthread_cond_t cv; /* step advanced, initialized, broken, closing */
    float *params;     /* [count] */
    int initialized;
    uint64_t step;
    float *accum;         /* [count] sync: sum of this step's gradients */
    uint8_t *contributed; /* [num_workers] sync: pushed in this step */
    uint8_t *done;        /* [num_workers] */
    int n_contrib, n_done;
    int n_done_acked; /* DONE replies sent: serve exits at num_workers */
    int broken;
    SgError broken_err;
    int stopping, closing;
    uint64_t integrity_failures; /* connections closed by a failed tag or seq */
    SgError last_integrity;

    PsShardRows rows; /* the embedding tables' rows this shard holds */
    int step_dense;   /* sync: a dense push is part of this step */

    /* Model state: never touched under mu, so that a put never waits on a
     * synchronous step (state_mu is never held while taking mu). */
    pthread_mutex_t state_mu;
    float **worker_state; /* [num_workers] each worker's last PUT_STATE, or NULL */
    size_t state_floats;  /* n of every worker's state, fixed by the first PUT_STATE */
    int state_holders;    /* workers with a state */
};

/* ---- shard state (s->mu held) ---------------------------------------------- */

static void break_sync(PsServer *s, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void break_sync(PsServer *s, int code, const char *fmt, ...)
{
    if (s->broken)
        return;
    s->broken = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->broken_err.msg, sizeof s->broken_err.msg, fmt, ap);
    va_end(ap);
    s->broken_err.code = code;
    pthread_cond_broadcast(&s->cv);
}

static int cond_wait_1s(PsServer *s)
{
    return sg_cond_wait(&s->cv, &s->mu, sg_now() + 1.0);
}

static int apply_rows(PsServer *s, float scale, SgError *err)
{
    return ps_rows_apply(&s->rows, s->params, s->accum, scale, s->cfg.optim, s->cfg.apply,
                         s->cfg.apply_ctx, err);
}

/* Sync: averages the step's gradients, applies them, advances the step. */
static int complete_step(PsServer *s, SgError *err)
{
    size_t n = (size_t)s->cfg.count;
    float scale = 1.0f / (float)s->n_contrib;
    int rc;
    if (s->rows.ntables > 0 && !s->step_dense) {
        rc = apply_rows(s, scale, err);
    } else {
        for (size_t i = 0; i < n; i++)
            s->accum[i] *= scale;
        rc = s->cfg.apply(s->cfg.apply_ctx, s->params, s->accum, n, err);
        memset(s->accum, 0, n * sizeof *s->accum);
        ps_rows_clear_marks(&s->rows);
    }
    s->step_dense = 0;
    if (rc < 0) {
        break_sync(s, rc, "applying synchronous step %llu failed: %s", (unsigned long long)s->step,
                   err->msg);
        return rc;
    }
    memset(s->contributed, 0, (size_t)s->cfg.num_workers);
    s->n_contrib = 0;
    s->step++;
    pthread_cond_broadcast(&s->cv);
    return SG_OK;
}

static int wait_initialized(PsServer *s, const char *peer, SgError *err)
{
    while (!s->initialized && !s->closing)
        cond_wait_1s(s);
    if (!s->initialized)
        return sg_fail(err, SG_ECANCELLED,
                       "ps shard closed before it was initialized (request from %s)", peer);
    return SG_OK;
}

static int apply_push(PsServer *s, PsConn *c, int op, const uint64_t v[4], SgError *err)
{
    size_t n = (size_t)s->cfg.count;
    int rows = op == PS_OP_PUSH_PULL_ROWS, rc;
    if (!s->initialized)
        return sg_fail(err, SG_ESTATE,
                       "gradient from worker %ld before the ps shard was initialized "
                       "(construct the PsServer with params, or call PsClient.init first)",
                       c->worker_id);
    /* a rows push is checked whole before any of it counts */
    if (rows && (rc = ps_rows_push(&s->rows, c->base.peer, v, c->aux, c->buf, NULL, err)) < 0)
        return rc;
    if (s->cfg.mode == PS_MODE_ASYNC) {
        rc = rows ? ps_rows_push(&s->rows, c->base.peer, v, c->aux, c->buf, s->accum, err) : 0;
        if (rc == 0)
            rc = rows ? apply_rows(s, 1.0f, err)
                      : s->cfg.apply(s->cfg.apply_ctx, s->params, c->buf, n, err);
        if (rc < 0)
            return rc;
        s->step++;
        return SG_OK;
    }
    if (s->broken)
        return sg_fail(err, s->broken_err.code, "%s", s->broken_err.msg);
    if (s->done[c->worker_id])
        return sg_fail(err, SG_ESTATE, "worker %ld pushed a gradient after saying done",
                       c->worker_id);
    if (s->contributed[c->worker_id])
        return sg_fail(err, SG_EPROTO,
                       "worker %ld pushed twice in step %llu (two clients with one worker id?)",
                       c->worker_id, (unsigned long long)s->step);
    if (rows)
        ps_rows_push(&s->rows, c->base.peer, v, c->aux, c->buf, s->accum, err);
    for (size_t i = 0; !rows && i < n; i++)
        s->accum[i] += c->buf[i];
    s->step_dense |= !rows;
    s->contributed[c->worker_id] = 1;
    s->n_contrib++;
    uint64_t my_step = s->step;
    if (s->n_contrib >= s->cfg.num_workers - s->n_done)
        return complete_step(s, err);
    while (s->step == my_step && !s->broken && !s->closing)
        cond_wait_1s(s);
    if (s->step != my_step)
        return SG_OK;
    if (s->broken)
        return sg_fail(err, s->broken_err.code, "%s", s->broken_err.msg);
    return sg_fail(err, SG_ECANCELLED, "ps shard stopped during synchronous step %llu",
                   (unsigned long long)my_step);
}

static int mark_done(PsServer *s, PsConn *c, SgError *err)
{
    c->said_done = 1;
    if (s->done[c->worker_id])
        return SG_OK;
    s->done[c->worker_id] = 1;
    s->n_done++;
    c->first_done = 1;
    if (s->cfg.mode == PS_MODE_SYNC && s->n_contrib > 0 && !s->broken &&
        s->n_contrib >= s->cfg.num_workers - s->n_done) {
        int rc = complete_step(s, err);
        if (rc < 0)
            return rc;
    }
    pthread_cond_broadcast(&s->cv);
    return SG_OK;
}

/* Blocks (s->mu held) until every worker but c's said DONE, the deadline
 * passes or the shard stops. */
static int wait_others(PsServer *s, PsConn *c, uint64_t timeout_ms, SgError *err)
{
    double deadline = sg_now() + (double)timeout_ms / 1000.0;
    int want = s->cfg.num_workers - 1;
    for (;;) {
        int others = s->n_done - (s->done[c->worker_id] ? 1 : 0);
        if (others >= want)
            return wait_initialized(s, c->base.peer, err);
        if (s->broken)
            return sg_fail(err, s->broken_err.code, "%s", s->broken_err.msg);
        if (s->closing || s->stopping)
            return sg_fail(err, SG_ECANCELLED,
                           "ps shard stopped while worker %ld waited for the other workers "
                           "(%d of %d had said done)",
                           c->worker_id, others, want);
        if (sg_now() >= deadline)
            return sg_fail(err, SG_ETIMEOUT,
                           "worker %ld waited %.1f s for the other workers to finish: %d of %d "
                           "said done",
                           c->worker_id, (double)timeout_ms / 1000.0, others, want);
        cond_wait_1s(s);
    }
}

/* ---- one request ------------------------------------------------------------ */

/* One frame of op (a reply or an error): the op header r, then data and
 * data2 (either may be empty). */
static int reply_op(PsConn *c, int op, const uint64_t r[4], const void *data, size_t len,
                    const void *data2, size_t len2, SgError *err)
{
    int rc = ps_send_op(c->base.fd, &c->base.session, op, r, data, len, data2, len2,
                        sg_now() + PS_IO_TIMEOUT, c->base.peer,
                        op == PS_OP_ERROR ? "a ps error" : "a ps reply", err);
    c->send_failed = rc < 0;
    return rc;
}

/* (s->mu held) Restores params, step and, if opt, the optimizer. */
static int set_state_locked(PsServer *s, const float *params, uint64_t step, const PsOptState *opt,
                            SgError *err)
{
    if (opt != NULL) {
        if (s->cfg.optim == NULL)
            return sg_fail(err, SG_EINVAL,
                           "optimizer state (%zu floats, step %lld) for ps shard [%llu, +%llu), "
                           "which has no optimizer (plain SGD with lr; the checkpoint was written "
                           "with optimizer=...?)",
                           opt->len, (long long)opt->step, (unsigned long long)s->cfg.offset,
                           (unsigned long long)s->cfg.count);
        if (opt->len != s->opt_floats)
            return sg_fail(err, SG_EINVAL,
                           "optimizer state has %zu floats, the optimizer of ps shard [%llu, "
                           "+%llu) holds %zu (optimizer or num_ps differ from the checkpoint's?)",
                           opt->len, (unsigned long long)s->cfg.offset,
                           (unsigned long long)s->cfg.count, s->opt_floats);
        if (opt->step < 0)
            return sg_fail(err, SG_EINVAL, "optimizer step must be >= 0, not %lld",
                           (long long)opt->step);
        int rc = optim_set_state(s->cfg.optim, opt->step, opt->state, opt->len, err);
        if (rc < 0)
            return rc;
    }
    memcpy(s->params, params, (size_t)s->cfg.count * sizeof(float));
    s->step = step;
    s->initialized = 1;
    pthread_cond_broadcast(&s->cv);
    return SG_OK;
}

/* (s->mu held) Copies params, step and, where asked, the optimizer's state. */
static int get_state_locked(PsServer *s, float *params, uint64_t *step, float *opt_state,
                            int64_t *opt_step, SgError *err)
{
    if (!s->initialized)
        return sg_fail(err, SG_ESTATE, "ps shard [%llu, +%llu) is not initialized yet",
                       (unsigned long long)s->cfg.offset, (unsigned long long)s->cfg.count);
    memcpy(params, s->params, (size_t)s->cfg.count * sizeof(float));
    *step = s->step;
    if (opt_state != NULL && s->opt_floats > 0)
        memcpy(opt_state, optim_state(s->cfg.optim), s->opt_floats * sizeof(float));
    if (opt_step != NULL)
        *opt_step = s->cfg.optim != NULL ? optim_get_step(s->cfg.optim) : 0;
    return SG_OK;
}

/* An error frame, unless an earlier frame broke off mid-way (the worker's
 * stream is cut, and under "encrypt" a new frame would reuse that frame's
 * seq, hence its AEAD nonce). */
static int reply_error(PsConn *c, const SgError *e)
{
    uint64_t r[4] = {(uint64_t)(int64_t)e->code, 0, 0, 0};
    SgError ignored;
    return c->send_failed ? SG_EIO
                          : reply_op(c, PS_OP_ERROR, r, e->msg, strlen(e->msg), NULL, 0, &ignored);
}

/* (s->state_mu held) PUT_STATE: takes c->extra (the request's n floats) as
 * the worker's state, replacing its last one. */
static int put_state_locked(PsServer *s, PsConn *c, size_t n, SgError *err)
{
    if (s->state_holders > 0 && n != s->state_floats)
        return sg_fail(err, SG_ECLUSTER,
                       "worker %ld put %zu floats of model state, the workers before it put %zu "
                       "(models differ between workers?)",
                       c->worker_id, n, s->state_floats);
    float **slot = &s->worker_state[c->worker_id];
    if (*slot == NULL)
        s->state_holders++;
    free(*slot);
    *slot = c->extra;
    c->extra = NULL;
    s->state_floats = n;
    return SG_OK;
}

/* (s->state_mu held) MEAN_STATE: the elementwise mean of the workers' states,
 * summed in double, into c->extra (malloc'd; NULL while no worker put any). */
static int mean_state_locked(PsServer *s, PsConn *c, size_t n, SgError *err)
{
    if (s->state_holders == 0)
        return SG_OK;
    if (n != s->state_floats)
        return sg_fail(err, SG_ECLUSTER,
                       "worker %ld asked for the mean of %zu floats of model state, the workers "
                       "put %zu (models differ between workers?)",
                       c->worker_id, n, s->state_floats);
    if ((c->extra = malloc((n > 0 ? n : 1) * sizeof(float))) == NULL)
        return sg_fail(err, SG_ENOMEM, "averaging %zu floats of model state", n);
    for (size_t i = 0; i < n; i++) {
        double sum = 0.0;
        for (int w = 0; w < s->cfg.num_workers; w++)
            if (s->worker_state[w] != NULL)
                sum += s->worker_state[w][i];
        c->extra[i] = (float)(sum / s->state_holders);
    }
    c->extra_len = n;
    return SG_OK;
}

/* PUT_STATE / MEAN_STATE (a = n), under state_mu alone. */
static int handle_state(PsConn *c, int op, const uint64_t v[4], SgError *err)
{
    PsServer *s = c->s;
    size_t n = (size_t)v[0];
    /* n = 0 puts an empty state: the slot still says that this worker put one */
    if (op == PS_OP_PUT_STATE && c->extra == NULL && (c->extra = malloc(sizeof(float))) == NULL)
        return sg_fail(err, SG_ENOMEM, "keeping the model state of worker %ld", c->worker_id);
    pthread_mutex_lock(&s->state_mu);
    int rc =
        op == PS_OP_PUT_STATE ? put_state_locked(s, c, n, err) : mean_state_locked(s, c, n, err);
    uint64_t r[4] = {(uint64_t)s->state_holders, s->state_holders > 0 ? s->state_floats : 0, 0, 0};
    pthread_mutex_unlock(&s->state_mu);
    if (rc < 0)
        return rc;
    const float *mean = op == PS_OP_MEAN_STATE ? c->extra : NULL;
    return reply_op(c, PS_OP_REPLY, r, mean, mean != NULL ? n * sizeof(float) : 0, NULL, 0, err);
}

static int handle(PsConn *c, int op, const uint64_t v[4], SgError *err)
{
    PsServer *s = c->s;
    const PsServerConfig *cfg = &s->cfg;
    size_t bytes = (size_t)cfg->count * sizeof(float);
    uint64_t flag = 0, r[4];
    /* send_params: 1 the shard's parameters, 2 c->buf[0..bytes) as filled here */
    int rc = SG_OK, send_params = 0, send_extra = 0;
    int64_t opt_step = 0;
    if (op != PS_OP_HELLO && c->worker_id < 0)
        return sg_fail(err, SG_EPROTO, "%s sent ps op %d before HELLO", c->base.peer, op);
    if (op == PS_OP_PUT_STATE || op == PS_OP_MEAN_STATE)
        return handle_state(c, op, v, err);
    pthread_mutex_lock(&s->mu);
    switch (op) {
    case PS_OP_HELLO:
        if ((rc = ps_rows_check_layout(&s->rows, c->base.peer, v[0] >> 32, c->aux, err)) < 0)
            break;
        if ((v[0] & 0xffffffffu) >= (uint64_t)cfg->num_workers || v[1] != cfg->total ||
            v[2] != cfg->offset || v[3] != cfg->count)
            rc = sg_fail(
                err, SG_ECLUSTER,
                "worker %llu at %s expects shard [%llu, +%llu) of %llu parameters, this ps serves "
                "[%llu, +%llu) of %llu for %d workers (model or num_ps differ between nodes?)",
                (unsigned long long)(v[0] & 0xffffffffu), c->base.peer, (unsigned long long)v[2],
                (unsigned long long)v[3], (unsigned long long)v[1], (unsigned long long)cfg->offset,
                (unsigned long long)cfg->count, (unsigned long long)cfg->total, cfg->num_workers);
        else
            c->worker_id = (long)(v[0] & 0xffffffffu);
        flag = (uint64_t)s->initialized;
        break;
    case PS_OP_PULL:
        rc = wait_initialized(s, c->base.peer, err);
        send_params = 1;
        break;
    case PS_OP_PUSH:
    case PS_OP_PUSH_PULL:
    case PS_OP_PUSH_PULL_ROWS:
        rc = apply_push(s, c, op, v, err);
        send_params = op == PS_OP_PUSH_PULL;
        if (rc == 0 && op == PS_OP_PUSH_PULL_ROWS) { /* the dense segments */
            ps_rows_gather_dense(&s->rows, s->params, c->buf);
            bytes = (size_t)s->rows.dense_count * sizeof(float), send_params = 2;
        }
        break;
    case PS_OP_PULL_ROWS: {
        const PsTable *pt = NULL;
        if ((rc = wait_initialized(s, c->base.peer, err)) < 0 ||
            (rc = ps_rows_check_ids(&s->rows, c->base.peer, v[0], (const int32_t *)c->aux,
                                    (size_t)v[1], &pt, err)) < 0)
            break;
        for (uint64_t i = 0; i < v[1]; i++)
            memcpy(c->buf + i * pt->dim,
                   s->params + pt->off +
                       ((uint64_t)((const int32_t *)c->aux)[i] - pt->row0) * pt->dim,
                   (size_t)pt->dim * sizeof(float));
        bytes = (size_t)(v[1] * (pt != NULL ? pt->dim : 0)) * sizeof(float), send_params = 2;
    } break;
    case PS_OP_INIT:
        if (!s->initialized) {
            memcpy(s->params, c->buf, bytes);
            s->initialized = 1;
            flag = 1;
            pthread_cond_broadcast(&s->cv);
        }
        break;
    case PS_OP_SET_STATE: {
        PsOptState o = {.step = (int64_t)v[1], .state = c->extra, .len = c->extra_len};
        rc = set_state_locked(s, c->buf, v[0], v[3] ? &o : NULL, err);
    } break;
    case PS_OP_GET_STATE:
        send_extra = 1;
        c->extra_len = s->opt_floats; /* c->extra is NULL: GET_STATE carries no data */
        if (c->extra_len > 0 && (c->extra = malloc(c->extra_len * sizeof(float))) == NULL)
            rc = sg_fail(err, SG_ENOMEM, "copying %zu floats of optimizer state", c->extra_len);
        else
            rc = get_state_locked(s, c->buf, &r[0], c->extra, &opt_step, err);
        break;
    case PS_OP_DONE:
        rc = mark_done(s, c, err);
        break;
    case PS_OP_WAIT_OTHERS:
        rc = wait_others(s, c, v[0], err);
        send_params = 1;
        break;
    default:
        rc = sg_fail(err, SG_EPROTO, "%s sent unknown ps op %d", c->base.peer, op);
    }
    r[0] = s->step;
    r[1] = flag, r[2] = (uint64_t)cfg->num_workers, r[3] = (uint64_t)cfg->mode;
    if (send_extra)
        r[1] = (uint64_t)opt_step, r[2] = c->extra_len, r[3] = cfg->optim != NULL;
    if (rc == 0 && send_params == 1)
        memcpy(c->buf, s->params, bytes);
    pthread_mutex_unlock(&s->mu);
    if (rc < 0)
        return rc;
    send_params |= send_extra; /* GET_STATE copied its parameters itself */
    rc = reply_op(c, PS_OP_REPLY, r, send_params ? c->buf : NULL, send_params ? bytes : 0,
                  send_extra ? c->extra : NULL, send_extra ? c->extra_len * sizeof(float) : 0, err);
    if (op == PS_OP_DONE && c->first_done) {
        /* Counted only once acknowledged, so serve's exit cannot cut this reply. */
        pthread_mutex_lock(&s->mu);
        c->first_done = 0;
        if (++s->n_done_acked == cfg->num_workers)
            net_server_end(s->srv, NET_SERVER_DONE);
        pthread_mutex_unlock(&s->mu);
    }
    return rc;
}

/* What a request of op (header values v) carries after its op header:
 * `aux` bytes into c->aux (HELLO: the table layout; *_ROWS: table entries
 * and row ids), `in` bytes into c->buf (parameters, or f32 or bf16
 * gradients), then `extra` floats into c->extra (SET_STATE: optimizer
 * state, PUT_STATE: model state). SG_EPROTO for a request out of bounds,
 * before anything is allocated for it. */
static int request_layout(const PsServer *s, const PsConn *c, int op, const uint64_t v[4],
                          size_t *aux, size_t *in, size_t *extra, SgError *err)
{
    size_t count = (size_t)s->cfg.count;
    int rc;
    *aux = *in = *extra = 0;
    switch (op) {
    case PS_OP_HELLO:
        if ((v[0] >> 32) > PS_TABLES_MAX)
            return sg_fail(err, SG_EPROTO,
                           "HELLO from %s announces %llu embedding tables (at most %d)",
                           c->base.peer, (unsigned long long)(v[0] >> 32), PS_TABLES_MAX);
        *aux = (size_t)(v[0] >> 32) * 24;
        break;
    case PS_OP_PULL_ROWS:
        if (v[1] > count)
            return sg_fail(err, SG_EPROTO,
                           "PULL_ROWS from %s asks for %llu rows, the shard holds %zu floats",
                           c->base.peer, (unsigned long long)v[1], count);
        *aux = (size_t)v[1] * sizeof(int32_t);
        break;
    case PS_OP_PUSH:
    case PS_OP_PUSH_PULL:
    case PS_OP_PUSH_PULL_ROWS:
        if (v[0] != PS_WIRE_F32 && v[0] != PS_WIRE_BF16)
            return sg_fail(err, SG_EPROTO,
                           "ps push from %s names gradient wire format %llu (0 f32, 1 bf16)",
                           c->base.peer, (unsigned long long)v[0]);
        if (op == PS_OP_PUSH_PULL_ROWS &&
            (rc = ps_rows_push_size(&s->rows, c->base.peer, v, aux, &count, err)) < 0)
            return rc;
        *in = count * (v[0] == PS_WIRE_BF16 ? sizeof(uint16_t) : sizeof(float));
        break;
    case PS_OP_INIT:
        *in = count * sizeof(float);
        break;
    case PS_OP_SET_STATE:
        if (v[2] > s->opt_floats)
            return sg_fail(err, SG_EPROTO,
                           "SET_STATE from %s carries %llu floats of optimizer state, this ps "
                           "shard's optimizer holds %zu",
                           c->base.peer, (unsigned long long)v[2], s->opt_floats);
        *in = count * sizeof(float), *extra = (size_t)v[2];
        break;
    case PS_OP_PUT_STATE:
        if (v[0] > PS_STATE_MAX)
            return sg_fail(err, SG_EPROTO,
                           "PUT_STATE from %s carries %llu floats of model state, at most %llu "
                           "are accepted",
                           c->base.peer, (unsigned long long)v[0],
                           (unsigned long long)PS_STATE_MAX);
        *extra = (size_t)v[0];
        break;
    }
    return SG_OK;
}

/* NetHandler.serve: reads one request into c->buf (and c->extra) and, once
 * its tag checked, handles it. Returns 0, SG_EPEER when the worker left, or
 * another status (connection is dropped). */
static int serve_one(void *ctx, NetConn *nc, SgError *err)
{
    PsServer *s = ctx;
    PsConn *c = (PsConn *)nc;
    NetSession *sess = &nc->session;
    size_t bytes = (size_t)s->cfg.count * sizeof(float), in = 0, extra = 0, aux = 0, consumed = 0;
    /* the largest request: SET_STATE, a rows push, or a PUT_STATE of PS_STATE_MAX floats */
    size_t cap = bytes + s->opt_floats * sizeof(float);
    if (cap < PS_STATE_MAX * sizeof(float))
        cap = PS_STATE_MAX * sizeof(float);
    if (cap < 2 * bytes + 8 * PS_TABLES_MAX)
        cap = 2 * bytes + 8 * PS_TABLES_MAX;
    if (cap > UINT32_MAX - PS_OP_HEADER)
        cap = UINT32_MAX - PS_OP_HEADER;
    double deadline = sg_now() + PS_IO_TIMEOUT;
    NetFrameHeader h;
    uint8_t oph[PS_OP_HEADER];
    uint64_t v[4];
    int rc = net_frame_recv_header(nc->fd, sess, (uint32_t)(PS_OP_HEADER + cap), deadline, nc->peer,
                                   &h, err);
    if (rc < 0)
        return rc;
    if (h.type != NET_FRAME_PS || h.length < PS_OP_HEADER) {
        rc = sg_fail(err, SG_EPROTO, "%s sent a %u-byte %s frame where a ps request belongs",
                     nc->peer, h.length, net_frame_type_name(h.type));
    } else if ((rc = net_frame_recv_payload(nc->fd, sess, oph, sizeof oph, deadline, nc->peer,
                                            "a ps op header", err)) < 0) {
        return rc;
    } else {
        consumed = PS_OP_HEADER;
        ps_op_decode(oph, v);
        rc = request_layout(s, c, h.flags, v, &aux, &in, &extra, err);
        if (rc == 0 && h.length - PS_OP_HEADER != aux + in + extra * sizeof(float))
            rc = sg_fail(err, SG_EPROTO, "ps op %u from %s carries %zu data bytes, expected %zu",
                         h.flags, nc->peer, (size_t)h.length - PS_OP_HEADER,
                         aux + in + extra * sizeof(float));
    }
    /* On a protected connection a request that broke a rule is read to its
     * end and its tag checked first, so that an altered one is reported as that. */
    if (rc < 0)
        return ps_frame_drain_check(nc->fd, sess, h.type, h.length - consumed, deadline, nc->peer,
                                    rc, err);
    if (aux > 0 && (c->aux = malloc(aux)) == NULL)
        return sg_fail(err, SG_ENOMEM, "receiving %zu bytes of table rows from %s", aux, nc->peer);
    if (aux > 0 && (rc = net_frame_recv_payload(nc->fd, sess, c->aux, aux, deadline, nc->peer,
                                                "table ids", err)) < 0)
        return rc;
    /* bf16 gradients land in the upper part of buf, widened in place below */
    const int bf16 =
        in > 0 && v[0] == PS_WIRE_BF16 &&
        (h.flags == PS_OP_PUSH || h.flags == PS_OP_PUSH_PULL || h.flags == PS_OP_PUSH_PULL_ROWS);
    uint8_t *dst = (uint8_t *)c->buf + (bf16 ? bytes - in : 0);
    if (in > 0 && (rc = net_frame_recv_payload(nc->fd, sess, dst, in, deadline, nc->peer,
                                               bf16 ? "bf16 gradients" : "ps data", err)) < 0)
        return rc;
    c->extra_len = extra; /* c->extra is NULL between requests */
    if (extra > 0) {
        const char *what = h.flags == PS_OP_PUT_STATE ? "model state" : "optimizer state";
        if ((c->extra = malloc(extra * sizeof(float))) == NULL)
            return sg_fail(err, SG_ENOMEM, "receiving %zu floats of %s from %s", extra, what,
                           nc->peer);
        if ((rc = net_frame_recv_payload(nc->fd, sess, c->extra, extra * sizeof(float), deadline,
                                         nc->peer, what, err)) < 0)
            return rc;
    }
    /* nothing of the request is acted on before its tag checked */
    if ((rc = net_frame_recv_end(nc->fd, sess, h.type, deadline, nc->peer, err)) < 0)
        return rc;
    /* ascending: element i is read before float i is written, and float i
     * never overlaps a later element */
    for (size_t i = 0; bf16 && i < in / sizeof(uint16_t); i++) {
        uint16_t g;
        memcpy(&g, dst + 2 * i, sizeof g);
        c->buf[i] = sg_bf16_to_f32(g);
    }
    rc = handle(c, h.flags, v, err);
    free(c->extra);
    free(c->aux);
    c->extra = NULL;
    c->aux = NULL;
    c->extra_len = 0;
    if (rc < 0 && rc != SG_EPROTO && rc != SG_EPEER && rc != SG_EIO && rc != SG_ETIMEOUT) {
        reply_error(c, err); /* a refused request: the connection stays usable */
        return SG_OK;
    }
    return rc;
}

/* ---- the handler of the server (server.h) ------------------------------------ */

static int conn_open(void *ctx, NetConn *nc, SgError *err)
{
    PsConn *c = (PsConn *)nc;
    c->s = ctx;
    c->worker_id = -1;
    if ((c->buf = malloc((size_t)c->s->cfg.count * sizeof(float))) == NULL)
        return sg_fail(err, SG_ENOMEM, "allocating a %llu-float buffer for %s",
                       (unsigned long long)c->s->cfg.count, nc->peer);
    return SG_OK;
}

static void conn_close(void *ctx, NetConn *nc, int rc, const SgError *err)
{
    PsServer *s = ctx;
    PsConn *c = (PsConn *)nc;
    /* An unauthenticated peer gets nothing but the close. An authenticated
     * one whose frame failed its check is told so (the direction to it is
     * intact) before the close. */
    if (nc->authed && rc != 1 && rc != SG_EPEER)
        reply_error(c, err);
    pthread_mutex_lock(&s->mu);
    if (nc->authed && rc == SG_EAUTH) {
        s->integrity_failures++;
        s->last_integrity = *err;
    }
    if (nc->authed && c->worker_id >= 0 && !c->said_done && s->cfg.mode == PS_MODE_SYNC &&
        !s->closing)
        break_sync(
            s, SG_ENODE,
            "worker %ld (%s) disconnected during synchronous step %llu without saying done; the "
            "step cannot complete",
            c->worker_id, nc->peer, (unsigned long long)s->step);
    pthread_mutex_unlock(&s->mu);
    free(c->buf);
    free(c->extra);
    free(c->aux);
}

static void shard_closing(void *ctx)
{
    PsServer *s = ctx;
    pthread_mutex_lock(&s->mu);
    s->closing = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

int ps_server_serve(PsServer *s, double timeout, SgError *err)
{
    int rc = net_server_start(s->srv, err);
    if (rc == 0 && (rc = net_server_wait(s->srv, timeout, err)) == 0) {
        net_server_end(s->srv, NET_SERVER_STOPPED); /* timed out: close, as at any end */
        SgError ignored;
        net_server_wait(s->srv, -1, &ignored);
    }
    return rc;
}

uint64_t ps_server_integrity_failures(PsServer *s, SgError *last)
{
    pthread_mutex_lock(&s->mu);
    uint64_t n = s->integrity_failures;
    if (last != NULL)
        *last = s->last_integrity;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void ps_server_stop(PsServer *s)
{
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    net_server_end(s->srv, NET_SERVER_STOPPED);
}

/* ---- construction and state ------------------------------------------------- */

static int ps_apply_optim(void *ctx, float *params, const float *grads, size_t n, SgError *err)
{
    return optim_step((Optimizer *)ctx, params, grads, n, err);
}

int ps_server_new(int lfd, const uint8_t *secret, size_t secret_len, const PsServerConfig *cfg,
                  PsServer **out, SgError *err)
{
    int rc;
    if (cfg->count == 0 || cfg->offset + cfg->count > cfg->total || cfg->num_workers < 1 ||
        cfg->num_workers > 65536 || (cfg->mode != PS_MODE_ASYNC && cfg->mode != PS_MODE_SYNC) ||
        cfg->count > (UINT32_MAX - PS_OP_HEADER) / sizeof(float))
        return sg_fail(err, SG_EINVAL,
                       "bad ps shard: [%llu, +%llu) of %llu parameters, %d workers, mode %d "
                       "(shards hold 1..%zu "
                       "floats; workers 1..65536)",
                       (unsigned long long)cfg->offset, (unsigned long long)cfg->count,
                       (unsigned long long)cfg->total, cfg->num_workers, (int)cfg->mode,
                       (size_t)((UINT32_MAX - PS_OP_HEADER) / sizeof(float)));
    if (cfg->security != NET_SEC_NONE && cfg->security != NET_SEC_AUTH &&
        cfg->security != NET_SEC_ENCRYPT)
        return sg_fail(err, SG_EINVAL, "ps shard: unknown security mode %d", (int)cfg->security);
    size_t opt_floats = cfg->optim != NULL ? optim_state_size(cfg->optim) : 0;
    if (cfg->optim != NULL) {
        const OptimConfig *oc = optim_config(cfg->optim);
        if (cfg->apply != NULL)
            return sg_fail(err, SG_EINVAL,
                           "ps shard: give an apply function or an optimizer, not both");
        if (oc->clip_norm > 0.0f && cfg->count != cfg->total)
            return sg_fail(
                err, SG_EINVAL,
                "clipping by global norm (clip_norm=%g) needs the norm of the whole gradient, but "
                "this ps shard holds only [%llu, +%llu) of %llu parameters: use num_ps=1, clip by "
                "value (clipvalue), or clip on the workers before pushing",
                oc->clip_norm, (unsigned long long)cfg->offset, (unsigned long long)cfg->count,
                (unsigned long long)cfg->total);
        if (oc->clip_tensor_norm > 0.0f)
            return sg_fail(
                err, SG_EINVAL,
                "clipping each tensor by its norm (clipnorm=%g) needs the tensor boundaries, but a "
                "ps shard holds a flat range ([%llu, +%llu) of %llu parameters) that may cut "
                "tensors: use global_clipnorm with num_ps=1, clipvalue, or clip on the workers "
                "before pushing",
                oc->clip_tensor_norm, (unsigned long long)cfg->offset,
                (unsigned long long)cfg->count, (unsigned long long)cfg->total);
        if (opt_floats > (UINT32_MAX - PS_OP_HEADER) / sizeof(float) - cfg->count)
            return sg_fail(err, SG_EINVAL,
                           "ps shard of %llu floats with %zu floats of optimizer state does not "
                           "fit one frame: use more ps shards",
                           (unsigned long long)cfg->count, opt_floats);
    }
    PsServer *s = calloc(1, sizeof *s);
    if (s == NULL)
        return sg_fail(err, SG_ENOMEM, "allocating a ps shard");
    s->opt_floats = opt_floats;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->state_mu, NULL);
    sg_cond_init(&s->cv);
    if ((rc = ps_rows_init(&s->rows, cfg, err)) < 0) {
        ps_server_free(s);
        return rc;
    }
    size_t n = (size_t)cfg->count;
    if ((s->params = calloc(n, sizeof(float))) == NULL ||
        (s->accum = calloc(cfg->mode == PS_MODE_SYNC || s->rows.ntables > 0 ? n : 1,
                           sizeof(float))) == NULL ||
        (s->contributed = calloc((size_t)cfg->num_workers, 1)) == NULL ||
        (s->done = calloc((size_t)cfg->num_workers, 1)) == NULL ||
        (s->worker_state = calloc((size_t)cfg->num_workers, sizeof *s->worker_state)) == NULL) {
        ps_server_free(s);
        return sg_fail(err, SG_ENOMEM, "allocating a ps shard of %zu floats", n);
    }
    s->cfg = *cfg;
    s->cfg.init = NULL;
    s->cfg.tables = NULL; /* s->rows.layout holds them */
    if (s->cfg.apply == NULL && s->cfg.optim != NULL) {
        s->cfg.apply = ps_apply_optim;
        s->cfg.apply_ctx = s->cfg.optim;
    } else if (s->cfg.apply == NULL) {
        s->cfg.apply = ps_apply_sgd;
        s->cfg.apply_ctx = &s->cfg.lr;
    }
    if (cfg->init != NULL) {
        memcpy(s->params, cfg->init, n * sizeof(float));
        s->initialized = 1;
    }
    s->step = cfg->step;
    NetHandler h = {.ctx = s,
                    .conn_size = sizeof(PsConn),
                    .open = conn_open,
                    .serve = serve_one,
                    .close = conn_close,
                    .stopping = shard_closing};
    if ((rc = net_server_new(lfd, secret, secret_len, cfg->security, "ps shard", &h, &s->srv,
                             err)) < 0) {
        ps_server_free(s);
        return rc;
    }
    if (cfg->auth_timeout > 0)
        net_server_set_auth_timeout(s->srv, cfg->auth_timeout);
    *out = s;
    return SG_OK;
}

size_t ps_server_optim_state_size(const PsServer *s)
{
    return s->opt_floats;
}

int ps_server_get_state(PsServer *s, float *params, uint64_t *step, float *opt_state,
                        int64_t *opt_step, SgError *err)
{
    pthread_mutex_lock(&s->mu);
    int rc = get_state_locked(s, params, step, opt_state, opt_step, err);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int ps_server_set_state(PsServer *s, const float *params, uint64_t step, const PsOptState *opt,
                        SgError *err)
{
    pthread_mutex_lock(&s->mu);
    int rc = set_state_locked(s, params, step, opt, err);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

uint64_t ps_server_step(PsServer *s)
{
    pthread_mutex_lock(&s->mu);
    uint64_t v = s->step;
    pthread_mutex_unlock(&s->mu);
    return v;
}

void ps_server_free(PsServer *s)
{
    if (s == NULL)
        return;
    net_server_free(s->srv); /* every connection closed before the shard goes */
    free(s->params);
    free(s->accum);
    free(s->contributed);
    free(s->done);
    for (int w = 0; s->worker_state != NULL && w < s->cfg.num_workers; w++)
        free(s->worker_state[w]);
    free(s->worker_state);
    ps_rows_free(&s->rows);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->state_mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
