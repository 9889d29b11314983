/* test_net_coll.c - the collectives' arithmetic and a ring in one process:
 * fp16/bf16 conversions on every 16-bit pattern and at every rounding tie,
 * the reduction kernels, and 3 ranks in threads over loopback doing an
 * allreduce (sum, int64 exact; average, float32), a broadcast, an allgather
 * of unequal sizes and the gradient hook with buckets and with an Embedding
 * table reduced as rows, in every security mode. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/sg_half.h"
#include "net/coll_internal.h"
#include "net/sock.h"

static void test_fp16_round_trip_and_ties(void)
{
    int bad = 0, bad_tie = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = sg_f16_to_f32((uint16_t)h);
        if (isnan(f)) {
            bad += !isnan(sg_f16_to_f32(sg_f32_to_f16(f)));
            continue;
        }
        bad += sg_f32_to_f16(f) != h;
        /* halfway to the next half up (same sign): rounds to the even one */
        uint32_t next = h + 1;
        if ((h & 0x7fff) >= 0x7c00 || (next & 0x7fff) == 0)
            continue;
        double mid = ((double)f + (double)sg_f16_to_f32((uint16_t)next)) / 2;
        if ((float)mid != mid)
            continue; /* not representable in float32: no exact tie */
        uint16_t want = (h & 1) == 0 ? (uint16_t)h : (uint16_t)next;
        bad_tie += sg_f32_to_f16((float)mid) != want;
    }
    CHECK(bad == 0);
    CHECK(bad_tie == 0);
    CHECK(sg_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(sg_f32_to_f16(65519.0f) == 0x7bff);
    CHECK(sg_f32_to_f16(65520.0f) == 0x7c00); /* the tie above the largest half: infinity */
    CHECK(sg_f32_to_f16(-1e9f) == 0xfc00);
    CHECK(sg_f32_to_f16(5.9604645e-8f) == 0x0001); /* 2^-24, the smallest subnormal */
    CHECK(sg_f32_to_f16(2.9802322e-8f) == 0x0000); /* 2^-25: a tie, to even (zero) */
}

static void test_bf16_round_trip_and_ties(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = sg_bf16_to_f32((uint16_t)h);
        if (!isnan(f))
            bad += sg_f32_to_bf16(f) != h;
    }
    CHECK(bad == 0);
    uint32_t x = 0x3f808000u; /* 1.00390625: halfway between 0x3f80 and 0x3f81 */
    float f;
    memcpy(&f, &x, sizeof f);
    CHECK(sg_f32_to_bf16(f) == 0x3f80);
    x = 0x3f818000u;
    memcpy(&f, &x, sizeof f);
    CHECK(sg_f32_to_bf16(f) == 0x3f82);
}

static void test_reduce_kernels(void)
{
    int32_t a[3] = {INT32_MAX, -5, 7}, b[3] = {1, 3, -9};
    coll_reduce(a, (const uint8_t *)b, 3, COLL_I32, COLL_SUM, COLL_COMP_NONE);
    CHECK(a[0] == INT32_MIN && a[1] == -2 && a[2] == -2); /* wraps as NumPy does */
    double d[2] = {1.5, -2}, e[2] = {0.5, -3};
    coll_reduce(d, (const uint8_t *)e, 2, COLL_F64, COLL_MIN, COLL_COMP_NONE);
    CHECK(d[0] == 0.5 && d[1] == -3);
    int64_t g[2] = {-7, 7};
    coll_finish(g, 2, COLL_I64, COLL_AVERAGE, COLL_COMP_NONE, 2);
    CHECK(g[0] == -3 && g[1] == 3); /* truncates */
}

/* ---- 3 ranks in threads ---- */

#define RANKS 3
#define N     100003

typedef struct Rank {
    int rank, lfd, port[RANKS];
    NetSecurity mode;
    int shm; /* ask for shared-memory links (and check that they were used) */
    int rc;
    SgError err;
    int64_t *ints;
    float *floats;
} Rank;

static const uint8_t secret[32] = "0123456789abcdef0123456789abcde";

/* A sparse hook on [dense 10 | table 8 x 2 | dense 4]: rank q touches rows q
 * and q + 1 with values q + 1 (the dense ranges hold q): after the average the
 * table's ids are the union {0..3} and each row the mean over ranks. */
static int check_table_hook(CollComm *c, int rank, SgError *err)
{
    enum { ROWS = 8, DIM = 2, TOFF = 10, NG = TOFF + ROWS * DIM + 4 };
    float g[NG], params[NG] = {0};
    for (int i = 0; i < NG; i++)
        g[i] = i >= TOFF && i < TOFF + ROWS * DIM ? 0.0f : (float)rank;
    const int32_t mine[2] = {rank, rank + 1};
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < DIM; j++)
            g[TOFF + mine[k] * DIM + j] = (float)(rank + 1);
    OptimRows t = {TOFF, ROWS, DIM, mine, 2};
    CollHook *h;
    int rc = coll_hook_new(c, COLL_AVERAGE, COLL_COMP_NONE, 1, 0, 1, &h, err);
    if (rc < 0)
        return rc;
    NnGradHook *hook = coll_hook_iface(h);
    int64_t step = 0;
    if (!hook->sparse)
        rc = sg_fail(err, SG_EPROTO, "the hook is not sparse");
    if (rc == 0)
        rc = hook->step(hook->ctx, params, g, NG, &t, 1, &step, err);
    int bad = 0;
    for (int row = 0; rc == 0 && row < ROWS; row++) {
        float want = 0.0f; /* the ranks q with q == row or q + 1 == row gave q + 1 */
        for (int q = 0; q < RANKS; q++)
            want += q == row || q + 1 == row ? (float)(q + 1) : 0.0f;
        for (int j = 0; j < DIM; j++)
            bad += fabsf(g[TOFF + row * DIM + j] - want / RANKS) > 1e-6f;
    }
    for (int i = 0; rc == 0 && i < NG; i++)
        if (i < TOFF || i >= TOFF + ROWS * DIM)
            bad += g[i] != 1.0f; /* (0 + 1 + 2) / 3 */
    if (rc == 0 && (t.nids != 4 || t.ids[0] != 0 || t.ids[3] != 3 || bad > 0))
        rc = sg_fail(err, SG_EPROTO, "table hook: %zu ids, %d wrong values", t.nids, bad);
    CollStats s;
    coll_comm_stats(c, &s);
    if (rc == 0 && (s.tables_as_rows != 1 || s.tables_dense != 0 || s.table_bytes_sent == 0))
        rc = sg_fail(err, SG_EPROTO, "table hook: stats %llu as rows, %llu dense",
                     (unsigned long long)s.tables_as_rows, (unsigned long long)s.tables_dense);
    coll_hook_free(h);
    return rc;
}

static void *rank_main(void *arg)
{
    Rank *r = arg;
    const char *hosts[RANKS] = {"127.0.0.1", "127.0.0.1", "127.0.0.1"};
    CollComm *c = NULL;
    r->rc = coll_comm_new(r->lfd, secret, sizeof secret, r->mode, r->rank, RANKS, hosts, r->port,
                          20.0, r->shm, &c, &r->err);
    if (r->rc < 0)
        return NULL;
    if (coll_comm_shared_memory(c) != r->shm) {
        r->rc = sg_fail(&r->err, SG_ESTATE, "shared memory %d where %d was asked for",
                        coll_comm_shared_memory(c), r->shm);
        coll_comm_free(c);
        return NULL;
    }
    r->ints = malloc(N * sizeof *r->ints);
    r->floats = malloc(N * sizeof *r->floats);
    for (int i = 0; i < N; i++) {
        r->ints[i] = (int64_t)i * (r->rank + 1) - 50000;
        r->floats[i] = (float)(r->rank + 1);
    }
    if ((r->rc = coll_allreduce(c, r->ints, N, COLL_I64, COLL_SUM, COLL_COMP_NONE, -1, &r->err)) ==
            0 &&
        (r->rc = coll_allreduce(c, r->floats, N, COLL_F32, COLL_AVERAGE, COLL_COMP_BF16, -1,
                                &r->err)) == 0) {
        char buf[16];
        snprintf(buf, sizeof buf, "rank %d", r->rank);
        r->rc = coll_broadcast(c, buf, sizeof buf, 1, 0, -1, &r->err);
        if (r->rc == 0 && strcmp(buf, "rank 1") != 0)
            r->rc = sg_fail(&r->err, SG_EPROTO, "broadcast gave '%s'", buf);
    }
    uint64_t lens[RANKS];
    void *all = NULL;
    if (r->rc == 0 &&
        (r->rc = coll_allgather(c, "abcdef", (size_t)r->rank * 2, lens, &all, -1, &r->err)) == 0) {
        if (lens[0] != 0 || lens[1] != 2 || lens[2] != 4 || memcmp(all, "ababcd", 6) != 0)
            r->rc = sg_fail(&r->err, SG_EPROTO, "allgather gave the wrong blocks");
        free(all);
    }
    CollHook *h = NULL;
    if (r->rc == 0 &&
        (r->rc = coll_hook_new(c, COLL_AVERAGE, COLL_COMP_NONE, 1, 4096, 1, &h, &r->err)) == 0) {
        NnGradHook *g = coll_hook_iface(h);
        for (int i = 0; i < N; i++)
            r->floats[i] = (float)(r->rank * 3); /* mean over ranks: 3 */
        int64_t step = 0;
        for (size_t off = N; off > 0 && r->rc == 0;) {
            size_t cnt = off < 7000 ? off : 7000;
            off -= cnt;
            r->rc = g->ready(g->ctx, r->floats, off, cnt, &r->err);
        }
        if (r->rc == 0)
            r->rc = g->step(g->ctx, NULL, r->floats, N, NULL, 0, &step, &r->err);
        coll_hook_free(h);
    }
    if (r->rc == 0)
        r->rc = check_table_hook(c, r->rank, &r->err);
    if (r->rc == 0)
        r->rc = coll_barrier(c, -1, &r->err);
    coll_comm_close(c);
    coll_comm_free(c);
    return NULL;
}

static void test_ring_of_three_threads(NetSecurity mode, int shm)
{
    Rank ranks[RANKS];
    pthread_t th[RANKS];
    SgError err;
    memset(ranks, 0, sizeof ranks);
    int ports[RANKS];
    for (int k = 0; k < RANKS; k++) {
        ranks[k].rank = k;
        ranks[k].mode = mode;
        ranks[k].shm = shm;
        CHECK(net_listen("127.0.0.1", 0, 8, &ranks[k].lfd, &ports[k], NULL, 0, &err) == 0);
    }
    for (int k = 0; k < RANKS; k++) {
        memcpy(ranks[k].port, ports, sizeof ports);
        pthread_create(&th[k], NULL, rank_main, &ranks[k]);
    }
    for (int k = 0; k < RANKS; k++)
        pthread_join(th[k], NULL);
    for (int k = 0; k < RANKS; k++) {
        if (ranks[k].rc < 0)
            fprintf(stderr, "rank %d (security %s, shm %d): %s\n", k, net_security_name(mode), shm,
                    ranks[k].err.msg);
        CHECK(ranks[k].rc == 0);
        int bad_int = 0, bad_avg = 0;
        for (int i = 0; ranks[k].rc == 0 && i < N; i++) {
            bad_int += ranks[k].ints[i] != (int64_t)i * 6 - 150000;
            bad_avg += ranks[k].floats[i] != 3.0f;
        }
        CHECK(bad_int == 0 && bad_avg == 0);
        free(ranks[k].ints);
        free(ranks[k].floats);
        net_close(&ranks[k].lfd);
    }
}

int main(void)
{
    test_fp16_round_trip_and_ties();
    test_bf16_round_trip_and_ties();
    test_reduce_kernels();
    for (int shm = 0; shm <= 1; shm++) {
        test_ring_of_three_threads(NET_SEC_NONE, shm);
        test_ring_of_three_threads(NET_SEC_AUTH, shm);
        test_ring_of_three_threads(NET_SEC_ENCRYPT, shm);
    }
    return check_report("test_net_coll");
}
