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
#include "net/auth.h"
#include "net/frame.h"
#include "net/ps.h"
#include "net/sock.h"

typedef struct PsShardConn {
    int fd;
    char peer[NET_PEER_MAX];
    NetSession sess; /* keyed by the handshake; wiped by ps_client_close/free */
    uint64_t offset, count;
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
    PsWire wire;      /* of pushed gradients */
    uint16_t *wire16; /* [total] bf16 gradients being pushed (PS_WIRE_BF16) */
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

/* Reads one reply; parameters (if any) land in dest + offset; with opt, the
 * reply also carries v[2] floats of optimizer state (malloc'd into opt).
 * What lands in dest is trusted only if this returns 0 (the tag checked).
 * Returns 0, a server-reported status (*remote = 1) or a transport/protocol
 * status. */
static int recv_reply(PsShardConn *sh, int shard, uint64_t v[4], float *dest, PsOptState *opt,
                      double deadline, int *remote, SgError *err)
{
    NetSession *sess = &sh->sess;
    size_t bytes = (size_t)sh->count * sizeof(float);
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
    if (data != (dest != NULL ? bytes + extra : 0))
        return bad_reply(sh, shard, &h, PS_OP_HEADER, deadline,
                         sg_fail(err, SG_EPROTO,
                                 "ps shard %d (%s) replied with %zu data bytes, expected %zu",
                                 shard, sh->peer, data, dest != NULL ? bytes + extra : (size_t)0),
                         err);
    if (bytes > 0 && dest != NULL &&
        (rc = net_frame_recv_payload(sh->fd, sess, dest + sh->offset, bytes, deadline, sh->peer,
                                     "parameters", err)) < 0)
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
        int x = recv_reply(&c->shards[i], i, r, dest, opt_out != NULL ? &opt_out[i] : NULL,
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

static int hook_step(void *ctx, float *params, float *grads, size_t n, OptimRows *tables,
                     int ntables, int64_t *global_step, SgError *err)
{
    (void)tables, (void)ntables;
    PsClient *c = ctx;
    if ((uint64_t)n != c->total)
        return sg_fail(err, SG_EINVAL,
                       "ps client is for %llu parameters, the model's gradient has %zu",
                       (unsigned long long)c->total, n);
    uint64_t step = 0;
    int rc = ps_client_exchange(c, PS_OP_PUSH_PULL, grads, params, &step, NULL, err);
    if (rc < 0)
        return rc;
    *global_step = (int64_t)step;
    return 1;
}

void ps_client_grad_hook(PsClient *c, NnGradHook *out)
{
    *out = (NnGradHook){.step = hook_step, .ctx = c};
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

int ps_client_connect(const char *const *hosts, const int *ports, int num_ps, const uint8_t *secret,
                      size_t secret_len, NetSecurity security, uint64_t total, int worker_id,
                      double timeout, PsClient **out, SgError *err)
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
    for (int i = 0; i < num_ps && rc == 0; i++) {
        PsShardConn *sh = &c->shards[i];
        snprintf(sh->peer, sizeof sh->peer, "%s:%d", hosts[i], ports[i]);
        if ((rc = ps_shard_range(total, num_ps, i, &sh->offset, &sh->count, err)) < 0)
            break;
        char what[32];
        snprintf(what, sizeof what, "ps shard %d: ", i);
        if ((rc = net_connect_auth(hosts[i], ports[i], secret, secret_len, security, deadline,
                                   &sh->fd, &sh->sess, sh->peer, what, err)) < 0)
            break;
        uint64_t v[4] = {(uint64_t)worker_id, total, sh->offset, sh->count}, r[4];
        int remote;
        if ((rc = send_req(sh, PS_OP_HELLO, v, NULL, sizeof(float), NULL, 0, deadline, err)) < 0 ||
            (rc = recv_reply(sh, i, r, NULL, NULL, deadline, &remote, err)) < 0)
            break;
    }
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
    free(c->shards);
    free(c->wire16);
    pthread_mutex_destroy(&c->mu);
    free(c);
}
