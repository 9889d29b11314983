/*
 * ps_client.c - a worker's connections to every parameter-server shard
 * (ps.h). Each call sends its request to all shards first, then collects the
 * replies, so shards work in parallel without client threads (the model-state
 * calls, PUT_STATE and MEAN_STATE, go to shard 0 alone); parameters are
 * read from the socket straight into the caller's array. Calls are serialized
 * by a mutex; a transport failure leaves the client unusable (the shards'
 * streams would be out of step) and every later call says why. Each shard
 * connection keeps the session its handshake keyed: requests go out as
 * pieces of one protected frame, replies are opened in place and a call
 * succeeds only once every reply's tag checked (a failed check, or a
 * shard's report that a request failed its own, leaves the client unusable
 * like any transport failure).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "common/sg_half.h"
#include "common/sg_le.h"
#include "net/auth.h"
#include "net/frame.h"
#include "net/ps.h"
#include "net/sock.h"

typedef struct PsShardConn {
    int fd;
    char peer[NET_PEER_MAX];
    NetSession sess; /* keyed by the handshake; wiped by ps_client_close/free */
    uint64_t offset, count;
    PsTable *tables; /* the table rows this shard holds */
    uint64_t (*segs)[2], dense_count;
    int ntables, nsegs;
    uint8_t *req; /* a rows request being built (req_len bytes) */
    float *rep;   /* a rows reply: the dense segments or the rows pulled */
    size_t req_cap, req_len, rep_cap;
    uint64_t v[4];           /* the rows request's op header */
    size_t want;             /* bytes its reply carries */
    int active;              /* a rows request goes to this shard */
    size_t *span;            /* [2 * ntables] the ids of a push each table holds: [lo, hi) */
    size_t first;            /* the first of the ids a PULL_ROWS asks this shard for */
    uint64_t sent, received; /* bytes, for ps_client_bytes */
} PsShardConn;

struct PsClient {
    int num_ps;
    PsShardConn *shards;
    uint64_t total;
    int worker_id;
    double timeout;
    pthread_mutex_t mu;
    int broken;
    SgError broken_err;
    PsWire wire;       /* of pushed gradients */
    uint16_t *wire16;  /* [total] bf16 gradients being pushed (PS_WIRE_BF16) */
    OptimRows *layout; /* the model's embedding tables (ids unused) */
    int nlayout;
};

/* Sends op with header v, this shard's slice of data (if any; elements of
 * `elem` bytes) and extra (len2 floats, e.g. optimizer state). */
static int send_req(PsShardConn *sh, int op, const uint64_t v[4], const void *data, size_t elem,
                    const float *extra, size_t len2, double deadline, SgError *err)
{
    size_t len = data != NULL ? (size_t)sh->count * elem : 0;
    len2 *= sizeof(float);
    if (PS_OP_HEADER + len + len2 > UINT32_MAX)
        return sg_fail(err, SG_EINVAL, "ps request of %zu bytes for %s does not fit one frame",
                       len + len2, sh->peer);
    const void *slice = len > 0 ? (const uint8_t *)data + sh->offset * elem : NULL;
    sh->sent += NET_FRAME_HEADER_SIZE + PS_OP_HEADER + len + len2;
    return ps_send_op(sh->fd, &sh->sess, op, v, slice, len, extra, len2, deadline, sh->peer,
                      "a ps request", err);
}

/* A reply broke a rule of its (not yet verified) header (rc, err filled):
 * on a protected connection the rest of the frame is read and its tag
 * checked first, so that an altered reply is reported as that. */
static int bad_reply(PsShardConn *sh, int shard, const NetFrameHeader *h, size_t consumed,
                     double deadline, int rc, SgError *err)
{
    rc = ps_frame_drain_check(sh->fd, &sh->sess, h->type, h->length - consumed, deadline, sh->peer,
                              rc, err);
    return rc == SG_EAUTH ? sg_context(err, "ps shard %d: ", shard) : rc;
}

/* Reads a reply's frame header (a payload of at most cap bytes) and op
 * header (into v). An ERROR reply is read whole and becomes its status
 * (*remote = 1); otherwise 0 leaves h->length - PS_OP_HEADER bytes of data
 * and the tag to read. */
static int recv_reply_head(PsShardConn *sh, int shard, size_t cap, NetFrameHeader *h, uint64_t v[4],
                           double deadline, int *remote, SgError *err)
{
    NetSession *sess = &sh->sess;
    uint8_t oph[PS_OP_HEADER];
    *remote = 0;
    if (cap < PS_OP_HEADER + SG_ERROR_MAX)
        cap = PS_OP_HEADER + SG_ERROR_MAX;
    int rc = net_frame_recv_header(sh->fd, sess, (uint32_t)cap, deadline, sh->peer, h, err);
    if (rc == SG_ETIMEOUT || rc == SG_EAUTH)
        return sg_context(err, "ps shard %d: ", shard);
    if (rc < 0)
        return rc;
    sh->received += NET_FRAME_HEADER_SIZE + h->length;
    if (h->type != NET_FRAME_PS || h->length < PS_OP_HEADER ||
        (h->flags != PS_OP_REPLY && h->flags != PS_OP_ERROR))
        return bad_reply(sh, shard, h, 0, deadline,
                         sg_fail(err, SG_EPROTO,
                                 "ps shard %d (%s) sent a %s frame (flags %u) instead of a reply",
                                 shard, sh->peer, net_frame_type_name(h->type), h->flags),
                         err);
    if ((rc = net_frame_recv_payload(sh->fd, sess, oph, sizeof oph, deadline, sh->peer,
                                     "a ps reply header", err)) < 0)
        return rc;
    ps_op_decode(oph, v);
    size_t data = h->length - PS_OP_HEADER;
    if (h->flags == PS_OP_ERROR) {
        char msg[SG_ERROR_MAX + 1];
        if (data > SG_ERROR_MAX)
            return bad_reply(sh, shard, h, PS_OP_HEADER, deadline,
                             sg_fail(err, SG_EPROTO,
                                     "ps shard %d (%s) sent a %zu-byte error message (at most %d)",
                                     shard, sh->peer, data, SG_ERROR_MAX),
                             err);
        if ((rc = net_frame_recv_payload(sh->fd, sess, msg, data, deadline, sh->peer, "a ps error",
                                         err)) < 0)
            return rc;
        if ((rc = net_frame_recv_end(sh->fd, sess, h->type, deadline, sh->peer, err)) < 0)
            return sg_context(err, "ps shard %d: ", shard);
        msg[data] = '\0';
        int64_t code = (int64_t)v[0];
        *remote = 1;
        return sg_fail(err, code < 0 && code > -100 ? (int)code : SG_EPROTO, "ps shard %d (%s): %s",
                       shard, sh->peer, msg);
    }
    return SG_OK;
}

/* Reads one reply; its data (bytes, if dst is not NULL: parameters, rows)
 * lands in dst; with opt, the reply also carries v[2] floats of optimizer
 * state (malloc'd into opt).
 * What lands in dest is trusted only if this returns 0 (the tag checked).
 * Returns 0, a server-reported status (*remote = 1) or a transport/protocol
 * status. */
static int recv_reply(PsShardConn *sh, int shard, uint64_t v[4], void *dst, size_t bytes,
                      PsOptState *opt, double deadline, int *remote, SgError *err)
{
    NetSession *sess = &sh->sess;
    size_t cap = PS_OP_HEADER + bytes;
    if (opt != NULL) /* parameters plus at most 3 optimizer slots (nn_optim.h) */
        cap = PS_OP_HEADER + 4 * bytes > UINT32_MAX ? UINT32_MAX : PS_OP_HEADER + 4 * bytes;
    NetFrameHeader h;
    int rc = recv_reply_head(sh, shard, cap, &h, v, deadline, remote, err);
    if (rc < 0)
        return rc;
    size_t data = h.length - PS_OP_HEADER;
    size_t extra =
        opt != NULL && v[2] <= (UINT32_MAX / sizeof(float)) ? (size_t)v[2] * sizeof(float) : 0;
    if (data != (dst != NULL ? bytes + extra : 0))
        return bad_reply(sh, shard, &h, PS_OP_HEADER, deadline,
                         sg_fail(err, SG_EPROTO,
                                 "ps shard %d (%s) replied with %zu data bytes, expected %zu",
                                 shard, sh->peer, data, dst != NULL ? bytes + extra : (size_t)0),
                         err);
    if (bytes > 0 && dst != NULL &&
        (rc = net_frame_recv_payload(sh->fd, sess, dst, bytes, deadline, sh->peer, "ps data",
                                     err)) < 0)
        return rc;
    if (opt != NULL) {
        opt->step = (int64_t)v[1];
        opt->len = extra / sizeof(float);
        opt->present = v[3] != 0;
        opt->state = NULL;
        if (extra > 0 && (opt->state = malloc(extra)) == NULL)
            return sg_fail(err, SG_ENOMEM, "receiving %zu bytes of optimizer state from %s", extra,
                           sh->peer);
        if (extra > 0 && (rc = net_frame_recv_payload(sh->fd, sess, opt->state, extra, deadline,
                                                      sh->peer, "optimizer state", err)) < 0)
            return rc;
    }
    if ((rc = net_frame_recv_end(sh->fd, sess, h.type, deadline, sh->peer, err)) < 0)
        return sg_context(err, "ps shard %d: ", shard);
    return SG_OK;
}

/* Takes the call lock, unless an earlier failure left the client unusable
 * (then fails naming it). */
static int lock_usable(PsClient *c, SgError *err)
{
    pthread_mutex_lock(&c->mu);
    if (!c->broken)
        return SG_OK;
    int rc = sg_fail(err, c->broken_err.code, "PsClient unusable after an earlier failure: %s",
                     c->broken_err.msg);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Releases the call lock; a transport failure (err) leaves the client
 * unusable, the shards' streams being out of step. */
static void unlock_after(PsClient *c, int transport, const SgError *err)
{
    if (transport) {
        c->broken = 1;
        c->broken_err = *err;
    }
    pthread_mutex_unlock(&c->mu);
}

/* One op on every shard: send all, then read all replies. opt_in: per-shard
 * optimizer state sent after data (SET_STATE); opt_out: per-shard optimizer
 * state received after the parameters (GET_STATE). */
static int call_all_opt(PsClient *c, int op, const uint64_t v[4], const float *data, float *dest,
                        const PsOptState *opt_in, PsOptState *opt_out, uint64_t out[4],
                        double timeout, SgError *err)
{
    int rc = lock_usable(c, err);
    if (rc < 0)
        return rc;
    double deadline = sg_now() + timeout;
    int sent = 0, transport = 0;
    const void *payload = data;
    size_t elem = sizeof(float);
    uint64_t vp[4] = {v[0], v[1], v[2], v[3]};
    if (data != NULL && c->wire == PS_WIRE_BF16 && (op == PS_OP_PUSH || op == PS_OP_PUSH_PULL)) {
        for (uint64_t i = 0; i < c->total; i++)
            c->wire16[i] = sg_f32_to_bf16(data[i]);
        payload = c->wire16;
        elem = sizeof(uint16_t);
        vp[0] = PS_WIRE_BF16;
    }
    for (int i = 0; i < c->num_ps && rc == 0; i++, sent++) {
        if (opt_in != NULL) {
            const PsOptState *o = &opt_in[i];
            uint64_t vi[4] = {v[0], (uint64_t)o->step, o->present ? o->len : 0,
                              (uint64_t)(o->present != 0)};
            rc = send_req(&c->shards[i], op, vi, payload, elem, o->present ? o->state : NULL,
                          o->present ? o->len : 0, deadline, err);
        } else {
            rc = send_req(&c->shards[i], op, vp, payload, elem, NULL, 0, deadline, err);
        }
    }
    transport = rc < 0;
    for (int i = 0; i < sent && !transport; i++) {
        SgError e;
        uint64_t r[4];
        int remote = 0;
        PsShardConn *sh = &c->shards[i];
        int x = recv_reply(sh, i, r, dest != NULL ? dest + sh->offset : NULL,
                           (size_t)sh->count * sizeof(float), opt_out != NULL ? &opt_out[i] : NULL,
                           deadline, &remote, &e);
        /* a shard that found our request altered closes the connection */
        if (x < 0 && (!remote || x == SG_EAUTH))
            transport = 1;
        if (x < 0 && rc == 0) {
            rc = x;
            *err = e;
        }
        if (i == 0 && x == 0)
            memcpy(out, r, sizeof r);
    }
    unlock_after(c, transport, err);
    return rc;
}

int ps_client_exchange(PsClient *c, int op, const float *data, float *dest, uint64_t *step,
                       int *initialized, SgError *err)
{
    const uint64_t v[4] = {0};
    uint64_t r[4] = {0};
    int rc = call_all_opt(c, op, v, data, dest, NULL, NULL, r, c->timeout, err);
    if (step != NULL)
        *step = r[0];
    if (initialized != NULL)
        *initialized = (int)r[1];
    return rc;
}

int ps_client_set_wire(PsClient *c, PsWire wire, SgError *err)
{
    if (wire != PS_WIRE_F32 && wire != PS_WIRE_BF16)
        return sg_fail(err, SG_EINVAL, "ps gradient wire format %d is neither f32 nor bf16",
                       (int)wire);
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    if (wire == PS_WIRE_BF16 && c->wire16 == NULL &&
        (c->wire16 = malloc((c->total ? c->total : 1) * sizeof *c->wire16)) == NULL)
        rc = sg_fail(err, SG_ENOMEM, "ps client: cannot allocate %llu bf16 gradients",
                     (unsigned long long)c->total);
    else
        c->wire = wire;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- embedding rows ------------------------------------------------------------ */

/* Makes room for len bytes in *buf (capacity *cap). */
static int grow(void *buf, size_t *cap, size_t len, const char *peer, SgError *err)
{
    void **p = buf;
    if (len <= *cap)
        return SG_OK;
    void *q = realloc(*p, len);
    if (q == NULL)
        return sg_fail(err, SG_ENOMEM, "ps client: %zu bytes of table rows for %s", len, peer);
    *p = q, *cap = len;
    return SG_OK;
}

/* (c->mu held) Sends every active shard its rows request (sh->v,
 * sh->req), then reads each reply's sh->want bytes into sh->rep; *step is
 * the first active shard's global step. As call_all_opt; *transport = 1
 * when the client is left unusable. */
static int rows_call(PsClient *c, int op, uint64_t *step, int *transport, SgError *err)
{
    int rc = 0, sent = 0;
    double deadline = sg_now() + c->timeout;
    for (int i = 0; i < c->num_ps && rc == 0; i++)
        rc = grow(&c->shards[i].rep, &c->shards[i].rep_cap, c->shards[i].want, c->shards[i].peer,
                  err);
    for (int i = 0; i < c->num_ps && rc == 0; i++, sent++) {
        PsShardConn *sh = &c->shards[i];
        if (!sh->active)
            continue;
        sh->sent += NET_FRAME_HEADER_SIZE + PS_OP_HEADER + sh->req_len;
        rc = ps_send_op(sh->fd, &sh->sess, op, sh->v, sh->req, sh->req_len, NULL, 0, deadline,
                        sh->peer, "a ps rows request", err);
        *transport = rc < 0;
    }
    int first = 1;
    for (int i = 0; i < sent && !*transport; i++) {
        PsShardConn *sh = &c->shards[i];
        if (!sh->active)
            continue;
        SgError e;
        uint64_t r[4];
        int remote = 0;
        int x = recv_reply(sh, i, r, sh->rep, sh->want, NULL, deadline, &remote, &e);
        if (x < 0 && (!remote || x == SG_EAUTH))
            *transport = 1;
        if (x < 0 && rc == 0) {
            rc = x;
            *err = e;
        }
        if (x == 0 && first && step != NULL)
            *step = r[0];
        first = 0;
    }
    return rc;
}

/* The ids of ids[0..nids) (sorted) that shard table pt holds: [*lo, *hi). */
static void ids_on(const PsTable *pt, const int32_t *ids, size_t nids, size_t *lo, size_t *hi)
{
    size_t a = 0, b = nids;
    while (a < b) { /* first id >= row0 */
        size_t m = a + (b - a) / 2;
        if ((int64_t)ids[m] < (int64_t)pt->row0)
            a = m + 1;
        else
            b = m;
    }
    *lo = a;
    for (b = nids; a < b;) { /* first id >= row0 + nrows */
        size_t m = a + (b - a) / 2;
        if ((int64_t)ids[m] < (int64_t)(pt->row0 + pt->nrows))
            a = m + 1;
        else
            b = m;
    }
    *hi = a;
}

static const PsTable *shard_table(const PsShardConn *sh, int index)
{
    for (int t = 0; t < sh->ntables; t++)
        if (sh->tables[t].index == index)
            return &sh->tables[t];
    return NULL;
}

int ps_client_pull_rows(PsClient *c, float *params, int index, const int32_t *ids, size_t nids,
                        SgError *err)
{
    if (index < 0 || index >= c->nlayout)
        return sg_fail(err, SG_EINVAL, "embedding table %d: the ps client knows %d tables", index,
                       c->nlayout);
    const OptimRows *tab = &c->layout[index];
    for (size_t i = 0; i < nids; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= tab->rows || (i > 0 && ids[i] <= ids[i - 1]))
            return sg_fail(err, SG_EINVAL,
                           "row %d of embedding table %d (%zu rows) is out of range or out of "
                           "order",
                           (int)ids[i], index, tab->rows);
    int transport = 0, rc = lock_usable(c, err);
    if (rc < 0)
        return rc;
    for (int i = 0; i < c->num_ps && rc == 0; i++) {
        PsShardConn *sh = &c->shards[i];
        const PsTable *pt = shard_table(sh, index);
        size_t lo = 0, hi = 0;
        if (pt != NULL)
            ids_on(pt, ids, nids, &lo, &hi);
        sh->active = hi > lo;
        sh->want = (hi - lo) * tab->dim * sizeof(float);
        sh->req_len = (hi - lo) * sizeof(int32_t);
        sh->v[0] = (uint64_t)index, sh->v[1] = hi - lo, sh->v[2] = sh->v[3] = 0, sh->first = lo;
        if (sh->active && (rc = grow(&sh->req, &sh->req_cap, sh->req_len, sh->peer, err)) == 0)
            memcpy(sh->req, ids + lo, sh->req_len);
    }
    if (rc == 0)
        rc = rows_call(c, PS_OP_PULL_ROWS, NULL, &transport, err);
    for (int i = 0; i < c->num_ps && rc == 0; i++) {
        PsShardConn *sh = &c->shards[i];
        for (uint64_t k = 0; sh->active && k < sh->v[1]; k++)
            memcpy(params + tab->off + (size_t)ids[sh->first + k] * tab->dim,
                   sh->rep + k * tab->dim, tab->dim * sizeof(float));
    }
    unlock_after(c, transport, err);
    return rc;
}

/* Appends n gradients from g to a rows request, in the client's wire format. */
static void put_grads(PsClient *c, PsShardConn *sh, const float *g, size_t n)
{
    if (c->wire == PS_WIRE_BF16) {
        for (size_t i = 0; i < n; i++) {
            uint16_t b = sg_f32_to_bf16(g[i]);
            memcpy(sh->req + sh->req_len + 2 * i, &b, 2);
        }
        sh->req_len += 2 * n;
    } else {
        memcpy(sh->req + sh->req_len, g, n * sizeof(float));
        sh->req_len += n * sizeof(float);
    }
}

/* One shard's PUSH_PULL_ROWS: entries (u32 table, u32 nids), ids, the dense
 * segments' gradients, then the rows'. */
static int build_push_rows(PsClient *c, PsShardConn *sh, const float *grads,
                           const OptimRows *tables, SgError *err)
{
    size_t *lo = sh->span, *hi = sh->span + sh->ntables, k = 0, nids = 0, nvals = 0, elem;
    for (int t = 0; t < sh->ntables; t++) {
        const PsTable *pt = &sh->tables[t];
        ids_on(pt, tables[pt->index].ids, tables[pt->index].nids, &lo[t], &hi[t]);
        k += hi[t] > lo[t], nids += hi[t] - lo[t], nvals += (hi[t] - lo[t]) * pt->dim;
    }
    elem = c->wire == PS_WIRE_BF16 ? sizeof(uint16_t) : sizeof(float);
    size_t len = 8 * k + 4 * nids + (sh->dense_count + nvals) * elem;
    if (PS_OP_HEADER + len > UINT32_MAX)
        return sg_fail(err, SG_EINVAL, "a rows push of %zu bytes for %s does not fit one frame",
                       len, sh->peer);
    int rc = grow(&sh->req, &sh->req_cap, len, sh->peer, err);
    if (rc < 0)
        return rc;
    uint8_t *p = sh->req;
    for (int t = 0; t < sh->ntables; t++)
        if (hi[t] > lo[t]) {
            sg_put_le32(p, (uint32_t)sh->tables[t].index);
            sg_put_le32(p + 4, (uint32_t)(hi[t] - lo[t]));
            p += 8;
        }
    for (int t = 0; t < sh->ntables; t++) {
        memcpy(p, tables[sh->tables[t].index].ids + lo[t], (hi[t] - lo[t]) * sizeof(int32_t));
        p += (hi[t] - lo[t]) * sizeof(int32_t);
    }
    sh->req_len = (size_t)(p - sh->req);
    for (int k2 = 0; k2 < sh->nsegs; k2++)
        put_grads(c, sh, grads + sh->offset + sh->segs[k2][0], sh->segs[k2][1] - sh->segs[k2][0]);
    for (int t = 0; t < sh->ntables; t++) {
        const OptimRows *tab = &tables[sh->tables[t].index];
        for (size_t i = lo[t]; i < hi[t]; i++)
            put_grads(c, sh, grads + tab->off + (size_t)tab->ids[i] * tab->dim, tab->dim);
    }
    sh->v[0] = c->wire, sh->v[1] = k, sh->v[2] = nids, sh->v[3] = nvals;
    sh->want = sh->dense_count * sizeof(float);
    sh->active = 1;
    return SG_OK;
}

/* Pushes the dense segments and the touched rows of tables (the model's,
 * in the layout given at connect), pulls the dense segments after apply. */
static int push_pull_rows(PsClient *c, float *params, const float *grads, const OptimRows *tables,
                          int ntables, uint64_t *step, SgError *err)
{
    if (ntables != c->nlayout)
        return sg_fail(err, SG_EINVAL,
                       "the model has %d embedding tables, the ps client was given %d", ntables,
                       c->nlayout);
    for (int t = 0; t < ntables; t++)
        if (tables[t].off != c->layout[t].off || tables[t].rows != c->layout[t].rows ||
            tables[t].dim != c->layout[t].dim)
            return sg_fail(err, SG_EINVAL,
                           "embedding table %d is [%zu, %zu] at %zu in the model, [%zu, %zu] at "
                           "%zu for the ps client",
                           t, tables[t].rows, tables[t].dim, tables[t].off, c->layout[t].rows,
                           c->layout[t].dim, c->layout[t].off);
    int transport = 0, rc = lock_usable(c, err);
    if (rc < 0)
        return rc;
    for (int i = 0; i < c->num_ps && rc == 0; i++)
        rc = build_push_rows(c, &c->shards[i], grads, tables, err);
    if (rc == 0)
        rc = rows_call(c, PS_OP_PUSH_PULL_ROWS, step, &transport, err);
    for (int i = 0; i < c->num_ps && rc == 0; i++) {
        PsShardConn *sh = &c->shards[i];
        const float *d = sh->rep;
        for (int k = 0; k < sh->nsegs; k++) {
            size_t len = (size_t)(sh->segs[k][1] - sh->segs[k][0]);
            memcpy(params + sh->offset + sh->segs[k][0], d, len * sizeof(float));
            d += len;
        }
    }
    unlock_after(c, transport, err);
    return rc;
}

static int hook_step(void *ctx, float *params, float *grads, size_t n, OptimRows *tables,
                     int ntables, int64_t *global_step, SgError *err)
{
    PsClient *c = ctx;
    if ((uint64_t)n != c->total)
        return sg_fail(err, SG_EINVAL,
                       "ps client is for %llu parameters, the model's gradient has %zu",
                       (unsigned long long)c->total, n);
    uint64_t step = 0;
    int rc = ntables > 0 ? push_pull_rows(c, params, grads, tables, ntables, &step, err)
                         : ps_client_exchange(c, PS_OP_PUSH_PULL, grads, params, &step, NULL, err);
    if (rc < 0)
        return rc;
    *global_step = (int64_t)step;
    return 1;
}

static int hook_rows(void *ctx, float *params, const OptimRows *table, const int32_t *ids,
                     size_t nids, SgError *err)
{
    PsClient *c = ctx;
    for (int t = 0; t < c->nlayout; t++)
        if (c->layout[t].off == table->off)
            return ps_client_pull_rows(c, params, t, ids, nids, err);
    return sg_fail(err, SG_EINVAL,
                   "the model reads an embedding table at offset %zu that the ps client does not "
                   "know (tables given at connect differ from the model's?)",
                   table->off);
}

void ps_client_grad_hook(PsClient *c, int sparse, NnGradHook *out)
{
    sparse = sparse && c->nlayout > 0;
    *out = (NnGradHook){
        .step = hook_step, .rows = sparse ? hook_rows : NULL, .sparse = sparse, .ctx = c};
}

void ps_client_bytes(PsClient *c, uint64_t *sent, uint64_t *received)
{
    pthread_mutex_lock(&c->mu);
    *sent = *received = 0;
    for (int i = 0; i < c->num_ps; i++)
        *sent += c->shards[i].sent, *received += c->shards[i].received;
    pthread_mutex_unlock(&c->mu);
}

int ps_client_num_ps(const PsClient *c)
{
    return c->num_ps;
}

int ps_client_set_state(PsClient *c, const float *params, uint64_t step, const PsOptState *opt,
                        SgError *err)
{
    uint64_t v[4] = {step, 0, 0, 0}, r[4];
    return call_all_opt(c, PS_OP_SET_STATE, v, params, NULL, opt, NULL, r, c->timeout, err);
}

int ps_client_get_state(PsClient *c, float *params, uint64_t *step, PsOptState *opt, SgError *err)
{
    uint64_t v[4] = {0}, r[4] = {0};
    memset(opt, 0, (size_t)c->num_ps * sizeof *opt);
    int rc = call_all_opt(c, PS_OP_GET_STATE, v, NULL, params, NULL, opt, r, c->timeout, err);
    if (rc < 0)
        ps_opt_states_free(opt, c->num_ps);
    *step = r[0];
    return rc;
}

/* ---- model state: shard 0 alone ---------------------------------------------- */

/* Reads the reply to a model-state op (a=workers b=n): n floats into dest
 * when dest is not NULL and a > 0, nothing otherwise. */
static int recv_state_reply(PsShardConn *sh, uint64_t v[4], float *dest, size_t n, double deadline,
                            int *remote, SgError *err)
{
    NetFrameHeader h;
    size_t bytes = n * sizeof(float);
    int rc = recv_reply_head(sh, 0, PS_OP_HEADER + (dest != NULL ? bytes : 0), &h, v, deadline,
                             remote, err);
    if (rc < 0)
        return rc;
    size_t data = h.length - PS_OP_HEADER, want = dest != NULL && v[0] > 0 ? bytes : 0;
    if (data != want || (want > 0 && v[1] != n))
        return bad_reply(sh, 0, &h, PS_OP_HEADER, deadline,
                         sg_fail(err, SG_EPROTO,
                                 "ps shard 0 (%s) answered a model-state op with %zu data bytes "
                                 "for %llu floats, expected %zu for %zu",
                                 sh->peer, data, (unsigned long long)v[1], want, n),
                         err);
    if (want > 0 && (rc = net_frame_recv_payload(sh->fd, &sh->sess, dest, want, deadline, sh->peer,
                                                 "model state", err)) < 0)
        return rc;
    if ((rc = net_frame_recv_end(sh->fd, &sh->sess, h.type, deadline, sh->peer, err)) < 0)
        return sg_context(err, "ps shard 0: ");
    return SG_OK;
}

/* PUT_STATE (state, n floats) or MEAN_STATE (into dest) on shard 0; *count
 * is the reply's a (workers holding a state / averaged). */
static int call_state(PsClient *c, int op, const float *state, float *dest, size_t n, int *count,
                      SgError *err)
{
    *count = 0;
    if ((uint64_t)n > PS_STATE_MAX)
        return sg_fail(err, SG_EINVAL, "%zu floats of model state: a ps shard holds at most %llu",
                       n, (unsigned long long)PS_STATE_MAX);
    int rc = lock_usable(c, err);
    if (rc < 0)
        return rc;
    PsShardConn *sh = &c->shards[0];
    uint64_t v[4] = {(uint64_t)n, 0, 0, 0}, r[4] = {0};
    double deadline = sg_now() + c->timeout;
    int remote = 0;
    rc = send_req(sh, op, v, NULL, sizeof(float), state, state != NULL ? n : 0, deadline, err);
    if (rc == 0)
        rc = recv_state_reply(sh, r, dest, n, deadline, &remote, err);
    /* a shard that found our request altered closes the connection */
    unlock_after(c, rc < 0 && (!remote || rc == SG_EAUTH), err);
    if (rc == 0)
        *count = (int)r[0];
    return rc;
}

int ps_client_put_state(PsClient *c, const float *state, size_t n, int *holders, SgError *err)
{
    return call_state(c, PS_OP_PUT_STATE, state, NULL, n, holders, err);
}

int ps_client_mean_state(PsClient *c, float *state, size_t n, int *workers, SgError *err)
{
    return call_state(c, PS_OP_MEAN_STATE, NULL, state, n, workers, err);
}

void ps_opt_states_free(PsOptState *opt, int n)
{
    for (int i = 0; opt != NULL && i < n; i++) {
        free(opt[i].state);
        opt[i].state = NULL;
        opt[i].len = 0;
    }
}

int ps_client_done(PsClient *c, SgError *err)
{
    return ps_client_exchange(c, PS_OP_DONE, NULL, NULL, NULL, NULL, err);
}

int ps_client_wait_others(PsClient *c, float *params, uint64_t *step, double timeout, SgError *err)
{
    if (!(timeout >= 0) || timeout > 1e9)
        return sg_fail(err, SG_EINVAL, "wait_others timeout must be 0..1e9 seconds, not %g",
                       timeout);
    uint64_t v[4] = {(uint64_t)(timeout * 1000.0), 0, 0, 0}, r[4] = {0};
    /* The servers answer once the wait is over: allow for the reply to cross. */
    int rc = call_all_opt(c, PS_OP_WAIT_OTHERS, v, NULL, params, NULL, NULL, r,
                          timeout + c->timeout, err);
    *step = r[0];
    return rc;
}

/* The table layout (tables[0..ntables)) into c and every shard's part of it. */
static int client_tables(PsClient *c, const OptimRows *tables, int ntables, SgError *err)
{
    int rc = ps_tables_check(c->total, tables, ntables, err);
    if (rc < 0)
        return rc;
    size_t n = (size_t)ntables + 1;
    if ((c->layout = calloc(n, sizeof *c->layout)) == NULL)
        return sg_fail(err, SG_ENOMEM, "PsClient: %d embedding tables", ntables);
    if (ntables > 0)
        memcpy(c->layout, tables, (size_t)ntables * sizeof *tables);
    c->nlayout = ntables;
    for (int i = 0; i < c->num_ps; i++) {
        PsShardConn *sh = &c->shards[i];
        if ((rc = ps_shard_range_rows(c->total, tables, ntables, c->num_ps, i, &sh->offset,
                                      &sh->count, err)) < 0)
            return rc;
        if ((sh->tables = calloc(n, sizeof *sh->tables)) == NULL ||
            (sh->segs = calloc(n, sizeof *sh->segs)) == NULL ||
            (sh->span = calloc(2 * n, sizeof *sh->span)) == NULL)
            return sg_fail(err, SG_ENOMEM, "PsClient: %d embedding tables", ntables);
        sh->ntables = ps_shard_tables(sh->offset, sh->count, tables, ntables, sh->tables);
        sh->nsegs = ps_dense_segments(sh->tables, sh->ntables, sh->count, sh->segs);
        sh->dense_count = sh->count;
        for (int t = 0; t < sh->ntables; t++)
            sh->dense_count -= sh->tables[t].nrows * sh->tables[t].dim;
    }
    return SG_OK;
}

int ps_client_connect(const char *const *hosts, const int *ports, int num_ps, const uint8_t *secret,
                      size_t secret_len, NetSecurity security, uint64_t total,
                      const OptimRows *tables, int ntables, int worker_id, double timeout,
                      PsClient **out, SgError *err)
{
    double deadline;
    int rc;
    if ((rc = net_auth_check_secret(secret_len, err)) < 0 ||
        (rc = sg_deadline(timeout, "PsClient", &deadline, err)) < 0)
        return rc;
    if (num_ps < 1 || worker_id < 0)
        return sg_fail(err, SG_EINVAL, "PsClient needs at least one ps address and worker_id >= 0");
    PsClient *c = calloc(1, sizeof *c);
    if (c == NULL || (c->shards = calloc((size_t)num_ps, sizeof *c->shards)) == NULL) {
        free(c);
        return sg_fail(err, SG_ENOMEM, "allocating a PsClient for %d shards", num_ps);
    }
    pthread_mutex_init(&c->mu, NULL);
    c->num_ps = num_ps, c->total = total, c->worker_id = worker_id, c->timeout = timeout;
    for (int i = 0; i < num_ps; i++)
        c->shards[i].fd = -1;
    rc = client_tables(c, tables, ntables, err);
    uint8_t *hello = rc == 0 ? calloc((size_t)ntables + 1, 24) : NULL;
    if (rc == 0 && hello == NULL)
        rc = sg_fail(err, SG_ENOMEM, "PsClient: %d embedding tables", ntables);
    for (int t = 0; t < ntables && rc == 0; t++) {
        sg_put_le64(hello + 24 * t, tables[t].off);
        sg_put_le64(hello + 24 * t + 8, tables[t].rows);
        sg_put_le64(hello + 24 * t + 16, tables[t].dim);
    }
    for (int i = 0; i < num_ps && rc == 0; i++) {
        PsShardConn *sh = &c->shards[i];
        snprintf(sh->peer, sizeof sh->peer, "%s:%d", hosts[i], ports[i]);
        char what[32];
        snprintf(what, sizeof what, "ps shard %d: ", i);
        if ((rc = net_connect_auth(hosts[i], ports[i], secret, secret_len, security, deadline,
                                   &sh->fd, &sh->sess, sh->peer, what, err)) < 0)
            break;
        uint64_t v[4] = {(uint64_t)worker_id | (uint64_t)ntables << 32, total, sh->offset,
                         sh->count},
                 r[4];
        int remote;
        if ((rc = ps_send_op(sh->fd, &sh->sess, PS_OP_HELLO, v, hello, 24 * (size_t)ntables, NULL,
                             0, deadline, sh->peer, "a ps hello", err)) < 0 ||
            (rc = recv_reply(sh, i, r, NULL, 0, NULL, deadline, &remote, err)) < 0)
            break;
    }
    free(hello);
    if (rc < 0) {
        ps_client_free(c);
        return rc;
    }
    *out = c;
    return SG_OK;
}

void ps_client_close(PsClient *c)
{
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->num_ps; i++) {
        net_close(&c->shards[i].fd);
        net_session_free(&c->shards[i].sess);
    }
    if (!c->broken) {
        c->broken = 1;
        sg_fail(&c->broken_err, SG_ESTATE, "the client was closed");
    }
    pthread_mutex_unlock(&c->mu);
}

void ps_client_free(PsClient *c)
{
    if (c == NULL)
        return;
    ps_client_close(c);
    for (int i = 0; c->shards != NULL && i < c->num_ps; i++) {
        PsShardConn *sh = &c->shards[i];
        free(sh->tables), free(sh->segs), free(sh->span), free(sh->req), free(sh->rep);
    }
    free(c->layout);
    free(c->shards);
    free(c->wire16);
    pthread_mutex_destroy(&c->mu);
    free(c);
}
