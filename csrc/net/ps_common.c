/*
 * ps_common.c - what both ends of the parameter server share (ps.h): the
 * shard split, the op header codec and the built-in SGD apply function.
 */
#include "net/ps.h"

#include <sys/uio.h>

#include "common/sg_le.h"
#include "net/frame.h"

int ps_apply_sgd(void *ctx, float *params, const float *grads, size_t n, SgError *err)
{
    (void)err;
    const float lr = *(const float *)ctx;
    for (size_t i = 0; i < n; i++)
        params[i] -= lr * grads[i];
    return SG_OK;
}

int ps_shard_range(uint64_t total, int num_shards, int index, uint64_t *offset, uint64_t *count,
                   SgError *err)
{
    if (num_shards < 1 || index < 0 || index >= num_shards)
        return sg_fail(err, SG_EINVAL, "shard index %d is outside 0..%d", index, num_shards - 1);
    if (total < (uint64_t)num_shards)
        return sg_fail(err, SG_EINVAL, "%llu parameters cannot be split over %d ps shards",
                       (unsigned long long)total, num_shards);
    /* total * index may overflow 64 bits only beyond 2^57 parameters. */
    uint64_t start = total / (uint64_t)num_shards * (uint64_t)index +
                     total % (uint64_t)num_shards * (uint64_t)index / (uint64_t)num_shards;
    uint64_t end = total / (uint64_t)num_shards * (uint64_t)(index + 1) +
                   total % (uint64_t)num_shards * (uint64_t)(index + 1) / (uint64_t)num_shards;
    *offset = start;
    *count = end - start;
    return SG_OK;
}

int ps_tables_check(uint64_t total, const OptimRows *tables, int ntables, SgError *err)
{
    if (ntables < 0 || ntables > PS_TABLES_MAX || (ntables > 0 && tables == NULL))
        return sg_fail(err, SG_EINVAL, "%d embedding tables on the ps (0..%d)", ntables,
                       PS_TABLES_MAX);
    for (int t = 0; t < ntables; t++) {
        const OptimRows *tab = &tables[t], *prev = t > 0 ? &tables[t - 1] : NULL;
        if (tab->dim == 0 || tab->rows == 0 || tab->rows > INT32_MAX || tab->off > total ||
            tab->rows > (total - tab->off) / tab->dim ||
            (prev != NULL && tab->off < prev->off + prev->rows * prev->dim))
            return sg_fail(err, SG_EINVAL,
                           "embedding table %d ([%zu, %zu] at %zu) is empty, outside the %llu "
                           "parameters or overlaps the table before it",
                           t, tab->rows, tab->dim, tab->off, (unsigned long long)total);
    }
    return SG_OK;
}

/* b moved down to the start of the table row it falls inside, if any. */
static uint64_t snap_to_row(uint64_t b, const OptimRows *tables, int ntables)
{
    for (int t = 0; t < ntables; t++) {
        const OptimRows *r = &tables[t];
        if (b > r->off && b < r->off + r->rows * r->dim)
            return r->off + (b - r->off) / r->dim * r->dim;
    }
    return b;
}

int ps_shard_range_rows(uint64_t total, const OptimRows *tables, int ntables, int num_shards,
                        int index, uint64_t *offset, uint64_t *count, SgError *err)
{
    uint64_t start = 0, n = 0, end;
    int rc = ps_tables_check(total, tables, ntables, err);
    if (rc == 0)
        rc = ps_shard_range(total, num_shards, index, &start, &n, err);
    if (rc < 0)
        return rc;
    end = start + n;
    start = snap_to_row(start, tables, ntables);
    end = snap_to_row(end, tables, ntables);
    if (end <= start)
        return sg_fail(err, SG_EINVAL,
                       "ps shard %d of %d over %llu parameters holds no whole embedding row "
                       "(rows cannot be split between shards): use fewer ps",
                       index, num_shards, (unsigned long long)total);
    *offset = start;
    *count = end - start;
    return SG_OK;
}

int ps_shard_tables(uint64_t offset, uint64_t count, const OptimRows *tables, int ntables,
                    PsTable *out)
{
    int n = 0;
    for (int t = 0; t < ntables; t++) {
        const OptimRows *r = &tables[t];
        uint64_t lo = r->off > offset ? r->off : offset;
        uint64_t hi = r->off + r->rows * r->dim;
        hi = hi < offset + count ? hi : offset + count;
        if (lo >= hi || r->dim == 0)
            continue;
        uint64_t row0 = (lo - r->off) / r->dim;
        out[n++] = (PsTable){t, row0, (hi - r->off) / r->dim - row0, r->dim, lo - offset};
    }
    return n;
}

int ps_dense_segments(const PsTable *tables, int n, uint64_t count, uint64_t (*segs)[2])
{
    int k = 0;
    uint64_t at = 0;
    for (int t = 0; t <= n; t++) {
        uint64_t end = t < n ? tables[t].off : count;
        if (end > at)
            segs[k][0] = at, segs[k++][1] = end;
        if (t < n)
            at = tables[t].off + tables[t].nrows * tables[t].dim;
    }
    return k;
}

void ps_op_encode(uint8_t out[PS_OP_HEADER], uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    const uint64_t v[4] = {a, b, c, d};
    for (int k = 0; k < 4; k++)
        sg_put_le64(out + 8 * k, v[k]);
}

void ps_op_decode(const uint8_t in[PS_OP_HEADER], uint64_t v[4])
{
    for (int k = 0; k < 4; k++)
        v[k] = sg_get_le64(in + 8 * k);
}

int ps_send_op(int fd, NetSession *s, int op, const uint64_t v[4], const void *data, size_t len,
               const void *data2, size_t len2, double deadline, const char *peer, const char *what,
               SgError *err)
{
    uint8_t oph[PS_OP_HEADER];
    ps_op_encode(oph, v[0], v[1], v[2], v[3]);
    struct iovec pieces[3] = {{oph, sizeof oph}};
    int n = 1;
    if (len > 0)
        pieces[n++] = (struct iovec){(void *)data, len};
    if (len2 > 0)
        pieces[n++] = (struct iovec){(void *)data2, len2};
    return net_frame_sendv(fd, s, NET_FRAME_PS, (uint16_t)op, pieces, n, deadline, peer, what, err);
}

int ps_frame_drain_check(int fd, NetSession *s, uint8_t type, size_t left, double deadline,
                         const char *peer, int rc, SgError *err)
{
    if (!net_session_on(s))
        return rc;
    uint8_t sink[4096];
    SgError e;
    int st = SG_OK;
    while (left > 0 && st == SG_OK) {
        size_t n = left < sizeof sink ? left : sizeof sink;
        st = net_frame_recv_payload(fd, s, sink, n, deadline, peer, "the rest of a bad ps frame",
                                    &e);
        left -= n;
    }
    if (st == SG_OK)
        st = net_frame_recv_end(fd, s, type, deadline, peer, &e);
    if (st != SG_EAUTH)
        return rc;
    *err = e;
    return SG_EAUTH;
}
