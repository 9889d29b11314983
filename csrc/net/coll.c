/*
 * coll.c - the collectives of coll.h, each a header exchange (coll_ring.c)
 * then ring steps through the transfer engine (coll_xfer.c): allreduce (a
 * reduce-scatter then an allgather over `size` segments, one transfer of
 * 2(size - 1) steps), broadcast (a pipelined relay from the root),
 * broadcast of a length only the root knows, allgather of unequal blocks,
 * barrier (the header exchange alone). What each step sends and receives is
 * here; how bytes cross, records, timeouts and failures are the engine's.
 * Not here: the arithmetic (coll_ops.c), the gradient hook (coll_hook.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/coll_internal.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the collectives send values in host order: little-endian hosts only"
#endif

/* ---- allreduce ---------------------------------------------------------------------- */

static void segment(size_t count, int n, int i, size_t *off, size_t *cnt)
{
    size_t q = count / (size_t)n, rem = count % (size_t)n, ii = (size_t)i;
    *off = ii * q + (ii < rem ? ii : rem);
    *cnt = q + (ii < rem ? 1 : 0);
}

/* Segments sent (*s) and received (*t) at step j of the 2(n-1) ring steps:
 * n-1 of reduce-scatter, then n-1 of allgather. The segment sent at step
 * j + 1 is always the one received at step j. */
static void ring_step(int n, int r, int j, int *s, int *t)
{
    int k = j < n - 1 ? j : j - (n - 1), base = j < n - 1 ? r : r + 1;
    *s = (base - k + 2 * n) % n;
    *t = (base - k - 1 + 2 * n) % n;
}

/* The whole allreduce as one transfer, one stream each way: the bytes of
 * step j + 1 go out as soon as the same bytes of step j have arrived and been
 * reduced (and, at the last reduce-scatter step, finished: averaged, rounded
 * to the wire format), so no step waits for the previous one to complete and
 * the send never runs more than one step ahead (no cycle, no deadlock). */
typedef struct Allreduce {
    CollXfer x; /* first: the engine's callbacks get &x */
    uint8_t *buf;
    size_t count, esz;
    CollDtype dtype;
    CollOp op;
    int n, r;
    uint64_t seq;
} Allreduce;

/* Step j's segment, sent or received. Reduce-scatter receives are reduced
 * through c->tmp; allgather receives land in place, or are decoded from
 * c->tmp with compression. */
static void allreduce_span(CollXfer *x, int j, int send, CollSpan *span)
{
    const Allreduce *a = (const Allreduce *)x;
    int s, t;
    size_t off, cnt;
    ring_step(a->n, a->r, j, &s, &t);
    segment(a->count, a->n, send ? s : t, &off, &cnt);
    span->ptr = a->buf + off * a->esz;
    span->len = cnt * x->wsz;
    span->consume = !send && (j < a->n - 1 || x->comp != COLL_COMP_NONE);
}

static void allreduce_consume(CollXfer *x, int j, uint8_t *seg, size_t elem, const uint8_t *wire,
                              size_t n)
{
    const Allreduce *a = (const Allreduce *)x;
    uint8_t *dst = seg + elem * a->esz;
    if (j >= a->n - 1) {
        coll_decode((float *)dst, wire, n, x->comp);
        return;
    }
    coll_reduce(dst, wire, n, a->dtype, a->op, x->comp);
    if (j == a->n - 2) /* this rank's own segment, complete */
        coll_finish(dst, n, a->dtype, a->op, x->comp, a->n);
}

static const char *allreduce_what(const CollXfer *x, int step, char *out, size_t cap)
{
    const Allreduce *a = (const Allreduce *)x;
    snprintf(out, cap, "allreduce #%llu (%s step %d of %d)", (unsigned long long)a->seq,
             step < a->n - 1 ? "reduce-scatter" : "allgather", step % (a->n - 1) + 1, a->n - 1);
    return out;
}

int coll_allreduce(CollComm *c, void *buf, size_t count, CollDtype dtype, CollOp op,
                   CollCompression comp, double timeout, SgError *err)
{
    if (coll_dtype_size(dtype) == 0 || dtype == COLL_BYTES)
        return sg_fail(err, SG_EINVAL,
                       "allreduce of dtype %d (float32, float64, int32, int64 only)", (int)dtype);
    if (op < COLL_SUM || op > COLL_MAX)
        return sg_fail(err, SG_EINVAL, "allreduce op %d (sum, average, min, max only)", (int)op);
    if (comp != COLL_COMP_NONE && (dtype != COLL_F32 || comp > COLL_COMP_BF16))
        return sg_fail(err, SG_EINVAL, "%s compression applies to float32 only, not %s",
                       coll_comp_name(comp), coll_dtype_name(dtype));
    double deadline, t0 = sg_now();
    int rc = coll_enter(c, timeout, &deadline, err);
    if (rc < 0)
        return rc;
    c->stats.allreduces++;
    CollHeader mine = {
        .count = count, .kind = KIND_ALLREDUCE, .op = op, .dtype = dtype, .comp = comp};
    char what[64];
    rc = coll_begin(c, &mine, "allreduce",
                    AGREE_KIND | AGREE_OP | AGREE_DTYPE | AGREE_COMP | AGREE_COUNT, what,
                    sizeof what, NULL, deadline, err);
    Allreduce a = {.x = {.steps = 2 * (c->size - 1),
                         .lag = 1,
                         .next = allreduce_span,
                         .consume = allreduce_consume,
                         .wsz = coll_wire_size(dtype, comp),
                         .comp = comp,
                         .from_rank = -1,
                         .describe = allreduce_what},
                   .buf = buf,
                   .count = count,
                   .esz = coll_dtype_size(dtype),
                   .dtype = dtype,
                   .op = op,
                   .n = c->size,
                   .r = c->rank,
                   .seq = mine.seq};
    if (rc == 0)
        rc = coll_xfer_run(c, &a.x, deadline, err);
    return coll_leave(c, t0, rc);
}

/* ---- broadcast, allgather, barrier --------------------------------------------------- */

/* Pipelined relay of bytes from root around the ring (into buf everywhere). */
static int relay(CollComm *c, uint8_t *buf, size_t bytes, int root, double deadline,
                 const char *what, SgError *err)
{
    int is_root = c->rank == root, last = c->right == root;
    CollXfer x = {.steps = 1,
                  .lag = 0, /* a rank sends what has arrived (the root has it all) */
                  .tx = {buf, last ? 0 : bytes},
                  .rx = {buf, is_root ? 0 : bytes},
                  .from_rank = root,
                  .what = what};
    return coll_xfer_run(c, &x, deadline, err);
}

static int check_root(const CollComm *c, int root, SgError *err)
{
    if (root < 0 || root >= c->size)
        return sg_fail(err, SG_EINVAL, "broadcast root %d is outside 0..%d", root, c->size - 1);
    return SG_OK;
}

int coll_broadcast(CollComm *c, void *buf, size_t bytes, int root, uint32_t tag, double timeout,
                   SgError *err)
{
    double deadline, t0 = sg_now();
    int rc = check_root(c, root, err);
    if (rc < 0 || (rc = coll_enter(c, timeout, &deadline, err)) < 0)
        return rc;
    c->stats.broadcasts++;
    CollHeader mine = {.count = bytes, .kind = KIND_BROADCAST, .dtype = tag, .root = root};
    char what[64];
    rc = coll_begin(c, &mine, "broadcast", AGREE_KIND | AGREE_COUNT | AGREE_ROOT | AGREE_TAG, what,
                    sizeof what, NULL, deadline, err);
    if (rc == 0)
        rc = relay(c, buf, bytes, root, deadline, what, err);
    return coll_leave(c, t0, rc);
}

int coll_broadcast_var(CollComm *c, const void *data, size_t len, int root, size_t max_bytes,
                       void **out, size_t *out_len, double timeout, SgError *err)
{
    double deadline, t0 = sg_now();
    *out = NULL, *out_len = 0;
    int rc = check_root(c, root, err);
    if (rc < 0 || (rc = coll_enter(c, timeout, &deadline, err)) < 0)
        return rc;
    c->stats.broadcasts++;
    CollHeader *hs = malloc((size_t)c->size * sizeof *hs);
    if (hs == NULL)
        return coll_leave(c, t0, sg_fail(err, SG_ENOMEM, "allocating headers"));
    CollHeader mine = {
        .count = c->rank == root ? len : 0, .kind = KIND_BROADCAST_VAR, .root = root};
    char what[64];
    rc = coll_begin(c, &mine, "broadcast_bytes", AGREE_KIND | AGREE_ROOT, what, sizeof what, hs,
                    deadline, err);
    size_t bytes = rc == 0 ? (size_t)hs[root].count : 0;
    free(hs);
    if (rc == 0 && bytes > max_bytes)
        rc = sg_fail(err, SG_EINVAL, "%s: rank %d broadcasts %zu bytes, above the limit of %zu",
                     what, root, bytes, max_bytes);
    uint8_t *buf = NULL;
    if (rc == 0 && (buf = malloc(bytes ? bytes : 1)) == NULL)
        rc = sg_fail(err, SG_ENOMEM, "%s: allocating %zu bytes", what, bytes);
    if (rc == 0 && c->rank == root && bytes > 0)
        memcpy(buf, data, bytes);
    if (rc == 0 && c->size > 1)
        rc = relay(c, buf, bytes, root, deadline, what, err);
    if (rc < 0) {
        free(buf);
        return coll_leave(c, t0, rc);
    }
    *out = buf, *out_len = bytes;
    return coll_leave(c, t0, rc);
}

int coll_allgather(CollComm *c, const void *data, size_t len, uint64_t *lens, void **out,
                   double timeout, SgError *err)
{
    double deadline, t0 = sg_now();
    *out = NULL;
    int rc = coll_enter(c, timeout, &deadline, err);
    if (rc < 0)
        return rc;
    c->stats.allgathers++;
    int n = c->size, r = c->rank;
    CollHeader *hs = malloc((size_t)n * sizeof *hs);
    size_t *offs = malloc((size_t)(n + 1) * sizeof *offs);
    if (hs == NULL || offs == NULL) {
        free(hs), free(offs);
        return coll_leave(c, t0, sg_fail(err, SG_ENOMEM, "allocating headers"));
    }
    CollHeader mine = {.count = len, .kind = KIND_ALLGATHER};
    char what[64];
    rc = coll_begin(c, &mine, "allgather", AGREE_KIND, what, sizeof what, hs, deadline, err);
    offs[0] = 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        lens[i] = hs[i].count;
        if (hs[i].count > (uint64_t)SIZE_MAX - offs[i])
            rc = sg_fail(err, SG_EINVAL, "%s: sizes overflow", what);
        else
            offs[i + 1] = offs[i] + (size_t)hs[i].count;
    }
    uint8_t *buf = NULL;
    if (rc == 0 && (buf = malloc(offs[n] ? offs[n] : 1)) == NULL)
        rc = sg_fail(err, SG_ENOMEM, "%s: allocating %zu bytes", what, offs[n]);
    if (rc == 0 && len > 0)
        memcpy(buf + offs[r], data, len);
    for (int k = 0; rc == 0 && k < n - 1; k++) {
        int s = (r - k + n) % n, t = (r - k - 1 + 2 * n) % n;
        char w[96];
        snprintf(w, sizeof w, "%s (the block of rank %d)", what, t);
        CollXfer x = {.steps = 1,
                      .lag = -1,
                      .tx = {buf + offs[s], offs[s + 1] - offs[s]},
                      .rx = {buf + offs[t], offs[t + 1] - offs[t]},
                      .from_rank = t,
                      .what = w};
        rc = coll_xfer_run(c, &x, deadline, err);
    }
    free(hs), free(offs);
    if (rc < 0)
        free(buf);
    else
        *out = buf;
    return coll_leave(c, t0, rc);
}

int coll_barrier(CollComm *c, double timeout, SgError *err)
{
    double deadline, t0 = sg_now();
    int rc = coll_enter(c, timeout, &deadline, err);
    if (rc < 0)
        return rc;
    c->stats.barriers++;
    CollHeader mine = {.kind = KIND_BARRIER};
    char what[64];
    rc = coll_begin(c, &mine, "barrier", AGREE_KIND, what, sizeof what, NULL, deadline, err);
    return coll_leave(c, t0, rc);
}
