/*
 * coll_rows.c - the Embedding tables of a sparse gradient hook (the rule and
 * the wire in coll.h): one allgather of every table's touched ids, the union
 * per table, then one allreduce of the rows tables packed together and one
 * in-place allreduce per table that goes dense. Blocks are int32 in host
 * order (little-endian hosts only, as coll.h's values).
 *
 * It does not accumulate rows over several backward passes (such a hook is
 * dense) and does not overlap backward: the tables are reduced in step().
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "common/sg_grow.h"
#include "net/coll_internal.h"

/* Room for n elements of size sz in *buf (capacity *cap elements); at
 * least one, so that no buffer is NULL. */
static int reserve(void *buf, size_t *cap, size_t n, size_t sz, const char *what, SgError *err)
{
    if (n < 1)
        n = 1;
    if (n <= *cap)
        return 0;
    if (sg_grow(buf, cap, n, sz, 256) < 0)
        return sg_fail(err, SG_ENOMEM, "allocating %zu %s for the Embedding tables", n, what);
    return 0;
}

/* dst = the sorted union of sorted unique a[na] and b[nb]; returns its size. */
static size_t merge_union(int32_t *dst, const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    size_t i = 0, j = 0, k = 0;
    while (i < na && j < nb) {
        int32_t x = a[i] <= b[j] ? a[i] : b[j];
        i += a[i] == x, j += b[j] == x;
        dst[k++] = x;
    }
    while (i < na)
        dst[k++] = a[i++];
    while (j < nb)
        dst[k++] = b[j++];
    return k;
}

/* This rank's block: ntables, (rows, dim, nids) per table, every table's ids. */
static int build_block(CollRows *st, const OptimRows *t, int nt, size_t *len, SgError *err)
{
    size_t n = 1 + 3 * (size_t)nt;
    for (int i = 0; i < nt; i++) {
        if (t[i].rows > INT32_MAX || t[i].dim > INT32_MAX || t[i].nids > t[i].rows)
            return sg_fail(err, SG_EINVAL, "Embedding table %d of %zu x %zu lists %zu rows", i,
                           t[i].rows, t[i].dim, t[i].nids);
        n += t[i].nids;
    }
    int rc = reserve(&st->blk, &st->blkcap, n, sizeof *st->blk, "ids", err);
    if (rc < 0)
        return rc;
    int32_t *b = st->blk, *ids = b + 1 + 3 * (size_t)nt;
    b[0] = nt;
    for (int i = 0; i < nt; i++) {
        b[1 + 3 * i] = (int32_t)t[i].rows, b[2 + 3 * i] = (int32_t)t[i].dim;
        b[3 + 3 * i] = (int32_t)t[i].nids;
        if (t[i].nids > 0)
            memcpy(ids, t[i].ids, t[i].nids * sizeof *ids);
        ids += t[i].nids;
    }
    *len = n * sizeof *b;
    return 0;
}

int coll_rows_check_block(const int32_t *b, uint64_t len, int q, const OptimRows *t, int nt,
                          const int32_t **ids, size_t *cnt, SgError *err)
{
    const uint64_t head = (1 + 3 * (uint64_t)nt) * sizeof *b;
    if (len < sizeof *b || len % sizeof *b != 0 || b[0] != nt)
        return sg_fail(err, SG_ECLUSTER, "rank %d has %d Embedding tables, this rank %d", q,
                       len >= sizeof *b ? b[0] : 0, nt);
    if (len < head)
        return sg_fail(err, SG_EPROTO, "rank %d sent a table block of %llu bytes", q,
                       (unsigned long long)len);
    uint64_t at = head / sizeof *b, total = len / sizeof *b;
    for (int i = 0; i < nt; i++) {
        const int32_t rows = b[1 + 3 * i], dim = b[2 + 3 * i], nids = b[3 + 3 * i];
        if ((size_t)rows != t[i].rows || (size_t)dim != t[i].dim)
            return sg_fail(err, SG_ECLUSTER,
                           "Embedding table %d is %d x %d on rank %d, %zu x %zu "
                           "here",
                           i, rows, dim, q, t[i].rows, t[i].dim);
        if (nids < 0 || nids > rows || (uint64_t)nids > total - at)
            return sg_fail(err, SG_EPROTO,
                           "rank %d lists %d rows of Embedding table %d (%d rows) "
                           "in a block of %llu ids",
                           q, nids, i, rows, (unsigned long long)(total - at));
        ids[i] = b + at;
        cnt[i] = (size_t)nids;
        for (int32_t k = 0; k < nids; k++)
            if (ids[i][k] < 0 || ids[i][k] >= rows || (k > 0 && ids[i][k] <= ids[i][k - 1]))
                return sg_fail(err, SG_EPROTO,
                               "rank %d's row %d of Embedding table %d is %d "
                               "(ids must be sorted, unique, in [0, %d))",
                               q, k, i, ids[i][k], rows);
        at += (uint64_t)nids;
    }
    if (at != total)
        return sg_fail(err, SG_EPROTO, "rank %d sent %llu ids beyond its tables' rows", q,
                       (unsigned long long)(total - at));
    return 0;
}

/* Steps 1 to 3 of coll.h: the allgather, the checks, each table's union
 * (st->uids + st->at[i].off, st->at[i].n rows) and its path. */
static int gather_unions(CollComm *c, CollRows *st, const OptimRows *t, int nt, SgError *err)
{
    const int p = coll_comm_size(c);
    const size_t slots = (size_t)p * (size_t)nt;
    size_t len = 0;
    int rc = build_block(st, t, nt, &len, err);
    uint64_t *lens = malloc((size_t)p * sizeof *lens);
    const int32_t **ids = malloc((slots + 1) * sizeof *ids);
    size_t *cnt = malloc((slots + 1) * sizeof *cnt);
    void *all = NULL;
    if (rc == 0 && (lens == NULL || ids == NULL || cnt == NULL))
        rc = sg_fail(err, SG_ENOMEM, "allocating %d ranks' table blocks", p);
    if (rc == 0)
        rc = coll_allgather(c, st->blk, len, lens, &all, -1, err);
    const uint8_t *blk = all;
    for (int q = 0; q < p && rc == 0; q++) {
        /* blocks before q checked: their lengths are multiples of 4, so b is aligned */
        rc = coll_rows_check_block((const int32_t *)blk, lens[q], q, t, nt, ids + (size_t)q * nt,
                                   cnt + (size_t)q * nt, err);
        blk += lens[q];
    }
    /* each union holds at most the sum of the ranks' lists, and rows */
    size_t room = 0, most = 0;
    if (rc == 0)
        rc = reserve(&st->at, &st->atcap, (size_t)nt, sizeof *st->at, "tables", err);
    for (int i = 0; i < nt && rc == 0; i++) {
        size_t sum = 0;
        for (int q = 0; q < p; q++)
            sum += cnt[(size_t)q * nt + i];
        st->at[i].off = room;
        room += sum < t[i].rows ? sum : t[i].rows;
        most = sum > most ? sum : most;
    }
    if (rc == 0)
        rc = reserve(&st->uids, &st->ucap, room, sizeof *st->uids, "ids", err);
    if (rc == 0)
        rc = reserve(&st->tmp, &st->tmpcap, most, sizeof *st->tmp, "ids", err);
    for (int i = 0; i < nt && rc == 0; i++) {
        int32_t *out = st->uids + st->at[i].off;
        size_t u = 0;
        for (int q = 0; q < p; q++) {
            u = merge_union(st->tmp, out, u, ids[(size_t)q * nt + i], cnt[(size_t)q * nt + i]);
            memcpy(out, st->tmp, u * sizeof *out);
        }
        st->at[i].n = u;
        st->at[i].dense = u > 0 && u == t[i].rows; /* the rule (coll.h) */
    }
    free(all), free(lens), free(ids), free(cnt);
    return rc;
}

int coll_rows_reduce(CollComm *c, CollOp op, CollCompression comp, float *grads, size_t n,
                     OptimRows *t, int nt, CollRows *st, SgError *err)
{
    for (int i = 0; i < nt; i++)
        if (t[i].dim == 0 || t[i].rows > (n - (t[i].off < n ? t[i].off : n)) / t[i].dim)
            return sg_fail(err, SG_EINVAL,
                           "Embedding table %d (%zu x %zu at %zu) outside the %zu "
                           "gradients",
                           i, t[i].rows, t[i].dim, t[i].off, n);
    CollStats before, after;
    coll_comm_stats(c, &before);
    int rc = gather_unions(c, st, t, nt, err);
    /* step 4: the rows tables packed, [sum u_t * dim_t] */
    size_t packed = 0;
    for (int i = 0; i < nt && rc == 0; i++)
        if (!st->at[i].dense)
            packed += st->at[i].n * t[i].dim;
    if (rc == 0)
        rc = reserve(&st->pack, &st->packcap, packed, sizeof *st->pack, "packed gradients", err);
    float *dst = st->pack;
    for (int i = 0; i < nt && rc == 0; i++) {
        if (st->at[i].dense)
            continue;
        const int32_t *u = st->uids + st->at[i].off;
        const float *g = grads + t[i].off;
        const size_t D = t[i].dim;
        for (size_t k = 0; k < st->at[i].n; k++, dst += D)
            memcpy(dst, g + (size_t)u[k] * D, D * sizeof *dst);
    }
    if (rc == 0 && packed > 0)
        rc = coll_allreduce(c, st->pack, packed, COLL_F32, op, comp, -1, err);
    const float *src = st->pack;
    uint64_t as_rows = 0, dense = 0;
    for (int i = 0; i < nt && rc == 0; i++) {
        const int32_t *u = st->uids + st->at[i].off;
        const size_t D = t[i].dim;
        if (st->at[i].dense) {
            rc = coll_allreduce(c, grads + t[i].off, t[i].rows * D, COLL_F32, op, comp, -1, err);
            dense++;
        } else {
            float *g = grads + t[i].off;
            for (size_t k = 0; k < st->at[i].n; k++, src += D)
                memcpy(g + (size_t)u[k] * D, src, D * sizeof *src);
            as_rows++;
        }
        /* step 5: the rows the reduced gradient holds */
        t[i].ids = u;
        t[i].nids = st->at[i].n;
    }
    coll_comm_stats(c, &after);
    coll_comm_count_tables(c, as_rows, dense, after.bytes_sent - before.bytes_sent);
    return rc;
}

void coll_rows_free(CollRows *st)
{
    free(st->blk), free(st->uids), free(st->tmp), free(st->at), free(st->pack);
    memset(st, 0, sizeof *st);
}
