/* test_net_ps_rows.c - embedding rows on the ps wire (ps.h PULL_ROWS,
 * PUSH_PULL_ROWS): shard splits of whole rows and their tables and dense
 * segments; raw requests to a shard that break a rule (rows of a table it
 * does not hold, ids outside the table or out of order, an unknown table,
 * counts beyond the shard, checked before anything is allocated for them,
 * another table layout at HELLO) answered with a specific error; and a
 * client's rows push and pull against two shards equal to plain SGD. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/sg_le.h"
#include "net/auth.h"
#include "net/frame.h"
#include "net/ps.h"
#include "net/sock.h"

/* dense [0, 6), table 0: 10 rows of 3 at 6, dense [36, 40), table 1: 5 rows of 2 at 40 */
#define TOTAL 50
static const OptimRows LAYOUT[2] = {{6, 10, 3, NULL, 0}, {40, 5, 2, NULL, 0}};
static const uint8_t secret[32] = "0123456789abcdef0123456789abcdef";

static void test_split_keeps_rows_whole(void)
{
    SgError err;
    uint64_t off[2], cnt[2];
    for (int k = 0; k < 2; k++)
        CHECK(ps_shard_range_rows(TOTAL, LAYOUT, 2, 2, k, &off[k], &cnt[k], &err) == 0);
    /* the plain split at 25 falls inside row 6 of table 0 ([24, 27)): moved to 24 */
    CHECK(off[0] == 0 && cnt[0] == 24 && off[1] == 24 && cnt[1] == 26);
    PsTable t[2];
    uint64_t segs[3][2];
    CHECK(ps_shard_tables(off[0], cnt[0], LAYOUT, 2, t) == 1);
    CHECK(t[0].index == 0 && t[0].row0 == 0 && t[0].nrows == 6 && t[0].off == 6);
    CHECK(ps_dense_segments(t, 1, cnt[0], segs) == 1 && segs[0][0] == 0 && segs[0][1] == 6);
    CHECK(ps_shard_tables(off[1], cnt[1], LAYOUT, 2, t) == 2);
    CHECK(t[0].index == 0 && t[0].row0 == 6 && t[0].nrows == 4 && t[0].off == 0);
    CHECK(t[1].index == 1 && t[1].row0 == 0 && t[1].nrows == 5 && t[1].off == 16);
    CHECK(ps_dense_segments(t, 2, cnt[1], segs) == 1 && segs[0][0] == 12 && segs[0][1] == 16);
    /* a row wider than a shard leaves one shard nothing */
    OptimRows wide = {0, 1, 20, NULL, 0};
    CHECK(ps_shard_range_rows(20, &wide, 1, 2, 0, &off[0], &cnt[0], &err) == SG_EINVAL);
    CHECK(strstr(err.msg, "no whole embedding row") != NULL);
}

typedef struct Shards {
    int lfd[2], port[2];
    PsServer *srv[2];
    pthread_t th[2];
    uint64_t off[2], cnt[2];
} Shards;

static void *serve_main(void *arg)
{
    SgError err;
    return (void *)(long)ps_server_serve((PsServer *)arg, 20.0, &err);
}

static void shards_start(Shards *sh, const float *init, int num_workers)
{
    SgError err;
    for (int k = 0; k < 2; k++) {
        CHECK(ps_shard_range_rows(TOTAL, LAYOUT, 2, 2, k, &sh->off[k], &sh->cnt[k], &err) == 0);
        CHECK(net_listen("127.0.0.1", 0, 8, &sh->lfd[k], &sh->port[k], NULL, 0, &err) == 0);
        PsServerConfig cfg = {.total = TOTAL,
                              .offset = sh->off[k],
                              .count = sh->cnt[k],
                              .num_workers = num_workers,
                              .mode = PS_MODE_SYNC,
                              .lr = 0.5f,
                              .init = init + sh->off[k],
                              .tables = LAYOUT,
                              .ntables = 2};
        CHECK(ps_server_new(sh->lfd[k], secret, sizeof secret, &cfg, &sh->srv[k], &err) == 0);
        CHECK(pthread_create(&sh->th[k], NULL, serve_main, sh->srv[k]) == 0);
    }
}

static void shards_stop(Shards *sh)
{
    for (int k = 0; k < 2; k++) {
        ps_server_stop(sh->srv[k]);
        pthread_join(sh->th[k], NULL);
        ps_server_free(sh->srv[k]);
        net_close(&sh->lfd[k]);
    }
}

/* A raw request; the reply's op (REPLY or ERROR), code and text into msg. */
static int raw_call(int fd, NetSession *sess, int op, const uint64_t v[4], const void *data,
                    size_t len, int64_t *code, char *msg, size_t cap)
{
    SgError err;
    double deadline = sg_now() + 10.0;
    if (ps_send_op(fd, sess, op, v, data, len, NULL, 0, deadline, "shard", "a test request", &err) <
        0)
        return -1;
    NetFrameHeader h;
    uint8_t *payload = NULL;
    if (net_frame_recv(fd, sess, 1u << 20, deadline, "shard", &h, &payload, &err) < 0 ||
        h.length < PS_OP_HEADER) {
        free(payload);
        return -1;
    }
    uint64_t r[4];
    ps_op_decode(payload, r);
    *code = (int64_t)r[0];
    size_t n = h.length - PS_OP_HEADER < cap - 1 ? h.length - PS_OP_HEADER : cap - 1;
    memcpy(msg, payload + PS_OP_HEADER, n);
    msg[n] = '\0';
    free(payload);
    return h.flags;
}

static int raw_hello(int port, NetSession *sess, const OptimRows *layout, uint64_t off,
                     uint64_t cnt, int64_t *code, char *msg, size_t cap)
{
    SgError err;
    int fd = -1;
    CHECK(net_connect_auth("127.0.0.1", port, secret, sizeof secret, NET_SEC_NONE, sg_now() + 10.0,
                           &fd, sess, "shard", "test: ", &err) == 0);
    uint8_t lay[48];
    for (int t = 0; t < 2; t++) {
        sg_put_le64(lay + 24 * t, layout[t].off);
        sg_put_le64(lay + 24 * t + 8, layout[t].rows);
        sg_put_le64(lay + 24 * t + 16, layout[t].dim);
    }
    uint64_t v[4] = {(uint64_t)2 << 32, TOTAL, off, cnt};
    int op = raw_call(fd, sess, PS_OP_HELLO, v, lay, sizeof lay, code, msg, cap);
    CHECK(op == PS_OP_REPLY || op == PS_OP_ERROR);
    return fd;
}

static void test_bad_requests_get_specific_errors(void)
{
    float init[TOTAL] = {0};
    Shards sh;
    shards_start(&sh, init, 1);
    NetSession sess;
    int64_t code;
    char msg[SG_ERROR_MAX + 1];

    /* a HELLO announcing more tables than PS_TABLES_MAX: refused from its op header */
    SgError err;
    int fd = -1;
    CHECK(net_connect_auth("127.0.0.1", sh.port[0], secret, sizeof secret, NET_SEC_NONE,
                           sg_now() + 10.0, &fd, &sess, "shard", "test: ", &err) == 0);
    uint64_t many[4] = {(uint64_t)(PS_TABLES_MAX + 1) << 32, TOTAL, sh.off[0], sh.cnt[0]};
    CHECK(raw_call(fd, &sess, PS_OP_HELLO, many, NULL, 0, &code, msg, sizeof msg) == PS_OP_ERROR);
    CHECK(code == SG_EPROTO && strstr(msg, "announces 4097 embedding tables") != NULL);
    net_close(&fd);
    net_session_free(&sess);

    /* another layout: refused at HELLO, naming the table */
    OptimRows other[2] = {LAYOUT[0], {40, 5, 1, NULL, 0}};
    fd = raw_hello(sh.port[0], &sess, other, sh.off[0], sh.cnt[0], &code, msg, sizeof msg);
    CHECK(code == SG_ECLUSTER && strstr(msg, "embedding table 1 at offset 40 as [5, 1]") != NULL);
    net_close(&fd);
    net_session_free(&sess);

    fd = raw_hello(sh.port[0], &sess, LAYOUT, sh.off[0], sh.cnt[0], &code, msg, sizeof msg);
    /* rows of table 1, which shard 0 does not hold */
    uint8_t req[64];
    sg_put_le32(req, 1), sg_put_le32(req + 4, 1);
    int32_t id = 2;
    memcpy(req + 8, &id, 4);
    float g[6 + 2] = {0};
    memcpy(req + 12, g, sizeof g);
    uint64_t v[4] = {PS_WIRE_F32, 1, 1, 2};
    CHECK(raw_call(fd, &sess, PS_OP_PUSH_PULL_ROWS, v, req, 12 + sizeof g, &code, msg,
                   sizeof msg) == PS_OP_ERROR);
    CHECK(code == SG_EINVAL && strstr(msg, "embedding table 1 (row 2)") != NULL &&
          strstr(msg, "ps shard [0, +24)") != NULL);
    /* a row of table 0 beyond the 6 this shard holds */
    sg_put_le32(req, 0), sg_put_le32(req + 4, 1);
    id = 7;
    memcpy(req + 8, &id, 4);
    uint64_t v0[4] = {PS_WIRE_F32, 1, 1, 3};
    float g0[6 + 3] = {0};
    memcpy(req + 12, g0, sizeof g0);
    CHECK(raw_call(fd, &sess, PS_OP_PUSH_PULL_ROWS, v0, req, 12 + sizeof g0, &code, msg,
                   sizeof msg) == PS_OP_ERROR);
    CHECK(code == SG_EINVAL && strstr(msg, "row 7 of embedding table 0 (10 rows)") != NULL &&
          strstr(msg, "holds its rows [0, 6)") != NULL);
    /* PULL_ROWS: an unknown table, ids out of order */
    int32_t ids[2] = {3, 1};
    uint64_t pv[4] = {7, 1, 0, 0};
    CHECK(raw_call(fd, &sess, PS_OP_PULL_ROWS, pv, ids, 4, &code, msg, sizeof msg) == PS_OP_ERROR);
    CHECK(code == SG_EINVAL && strstr(msg, "names embedding table 7; the model has 2") != NULL);
    uint64_t pv2[4] = {0, 2, 0, 0};
    CHECK(raw_call(fd, &sess, PS_OP_PULL_ROWS, pv2, ids, 8, &code, msg, sizeof msg) == PS_OP_ERROR);
    CHECK(code == SG_EINVAL && strstr(msg, "not sorted and unique (1 after 3)") != NULL);
    /* the connection stays usable after a refused request */
    ids[0] = 0, ids[1] = 5;
    CHECK(raw_call(fd, &sess, PS_OP_PULL_ROWS, pv2, ids, 8, &code, msg, sizeof msg) == PS_OP_REPLY);
    /* counts beyond the shard: refused from the op header, before any allocation */
    uint64_t huge[4] = {PS_WIRE_F32, 1, (uint64_t)1 << 40, 3};
    CHECK(raw_call(fd, &sess, PS_OP_PUSH_PULL_ROWS, huge, NULL, 0, &code, msg, sizeof msg) ==
          PS_OP_ERROR);
    CHECK(code == SG_EPROTO && strstr(msg, "rows push from") != NULL);
    net_close(&fd);
    net_session_free(&sess);
    shards_stop(&sh);
}

/* One worker, two shards, plain SGD: a step pushing rows {1, 7} of table 0
 * and {4} of table 1 changes those rows and the dense floats alone. */
static void test_client_rows_step_equals_sgd(void)
{
    float init[TOTAL], params[TOTAL], grads[TOTAL] = {0}, want[TOTAL];
    for (int i = 0; i < TOTAL; i++)
        init[i] = params[i] = want[i] = (float)i / 10.0f;
    Shards sh;
    shards_start(&sh, init, 1);
    const char *hosts[2] = {"127.0.0.1", "127.0.0.1"};
    PsClient *c = NULL;
    SgError err;
    CHECK(ps_client_connect(hosts, sh.port, 2, secret, sizeof secret, NET_SEC_NONE, TOTAL, LAYOUT,
                            2, 0, 10.0, &c, &err) == 0);
    if (c == NULL) {
        shards_stop(&sh);
        return;
    }
    const int32_t ids0[2] = {1, 7}, ids1[1] = {4};
    OptimRows tables[2] = {LAYOUT[0], LAYOUT[1]};
    tables[0].ids = ids0, tables[0].nids = 2, tables[1].ids = ids1, tables[1].nids = 1;
    for (int i = 0; i < 6; i++)
        grads[i] = 1.0f;
    for (int i = 36; i < 40; i++)
        grads[i] = 2.0f;
    for (int j = 0; j < 3; j++)
        grads[6 + 3 * 1 + j] = 3.0f, grads[6 + 3 * 7 + j] = 4.0f;
    grads[40 + 2 * 4] = grads[40 + 2 * 4 + 1] = 5.0f;
    for (int i = 0; i < TOTAL; i++)
        want[i] -= 0.5f * grads[i];
    NnGradHook hook;
    ps_client_grad_hook(c, 1, &hook);
    CHECK(hook.sparse == 1 && hook.rows != NULL);
    int64_t step = 0;
    memset(params + 6, 0, 30 * sizeof(float)); /* the table's local copy: stale */
    CHECK(hook.step(hook.ctx, params, grads, TOTAL, tables, 2, &step, &err) == 1 && step == 1);
    CHECK(memcmp(params, want, 6 * sizeof(float)) == 0);
    CHECK(memcmp(params + 36, want + 36, 4 * sizeof(float)) == 0);
    const int32_t all0[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    CHECK(hook.rows(hook.ctx, params, &LAYOUT[0], all0, 10, &err) == 0);
    CHECK(ps_client_pull_rows(c, params, 1, ids1, 1, &err) == 0);
    CHECK(memcmp(params + 6, want + 6, 30 * sizeof(float)) == 0);
    CHECK(memcmp(params + 48, want + 48, 2 * sizeof(float)) == 0);
    uint64_t sent, received;
    ps_client_bytes(c, &sent, &received);
    CHECK(sent > 0 && received > 0);
    const int32_t bad[1] = {10};
    CHECK(ps_client_pull_rows(c, params, 0, bad, 1, &err) == SG_EINVAL);
    CHECK(ps_client_done(c, &err) == 0);
    ps_client_free(c);
    shards_stop(&sh);
}

int main(void)
{
    test_split_keeps_rows_whole();
    test_bad_requests_get_specific_errors();
    test_client_rows_step_equals_sgd();
    return check_report("test_net_ps_rows");
}
