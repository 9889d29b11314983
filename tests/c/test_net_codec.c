/* test_net_codec.c - the feed BATCH codec (encode -> decode round trip, and
 * rejection of inconsistent lengths), the ps shard split and op header. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "check.h"
#include "net/feed.h"
#include "net/ps.h"

static FeedBatch in, out;

/* Flattens the iovecs of an encoded batch into one buffer. */
static size_t encode_flat(const FeedBatch *b, uint8_t *buf, size_t cap)
{
    static uint8_t meta[65536];
    struct iovec iov[2 * FEED_MAX_COLUMNS];
    SgError err;
    long len = feed_batch_encode(b, meta, sizeof meta, iov, &err);
    CHECK(len > 0 && (size_t)len <= cap);
    size_t off = 0;
    for (int i = 0; i < 2 * b->ncols; i++) {
        memcpy(buf + off, iov[i].iov_base, iov[i].iov_len);
        off += iov[i].iov_len;
    }
    CHECK(off == (size_t)len);
    return off;
}

static void test_feed_batch_round_trip(void)
{
    float x[3][2] = {{1, 2}, {3, 4}, {5, 6}};
    int64_t y[3] = {7, -8, 9};
    snprintf(in.input, sizeof in.input, "train");
    in.rows = 3;
    in.ncols = 2;
    in.cols[0] = (FeedColumn){
        .name = "x", .dtype = FEED_F32, .ndim = 2, .dims = {3, 2}, .data = (uint8_t *)x};
    in.cols[1] = (FeedColumn){
        .name = "label", .dtype = FEED_I64, .ndim = 1, .dims = {3}, .data = (uint8_t *)y};
    uint8_t buf[4096];
    size_t len = encode_flat(&in, buf, sizeof buf);
    SgError err;
    CHECK(feed_batch_decode(buf, len, &out, &err) == 0);
    CHECK(strcmp(out.input, "train") == 0 && out.rows == 3 && out.ncols == 2);
    CHECK(strcmp(out.cols[1].name, "label") == 0 && out.cols[1].row_bytes == 8);
    CHECK(out.cols[0].row_bytes == 8 && memcmp(out.cols[0].data, x, sizeof x) == 0);
    CHECK(memcmp(out.cols[1].data, y, sizeof y) == 0);
    CHECK(feed_schema_check(&in, &out, &err) == 0);
    out.cols[0].dims[1] = 3;
    CHECK(feed_schema_check(&in, &out, &err) == SG_ESCHEMA);

    /* Every truncation is refused, never read past. */
    for (size_t cut = 0; cut < len; cut++)
        CHECK(feed_batch_decode(buf, cut, &out, &err) == SG_EPROTO);
    /* A data length that disagrees with the shape. */
    uint8_t bad[4096];
    memcpy(bad, buf, len);
    size_t data_len_at = 1 + 5 + 10 + 1 + 1 + 2 + 16; /* input, counts, "x", dtype/ndim, dims */
    bad[data_len_at] ^= 4;
    CHECK(feed_batch_decode(bad, len, &out, &err) == SG_EPROTO);
    CHECK(strstr(err.msg, "column 'x'") != NULL);
}

static void test_ps_shards_and_op_header(void)
{
    SgError err;
    uint64_t off, cnt, next = 0;
    for (int i = 0; i < 3; i++) {
        CHECK(ps_shard_range(10, 3, i, &off, &cnt, &err) == 0);
        CHECK(off == next && (cnt == 3 || cnt == 4));
        next = off + cnt;
    }
    CHECK(next == 10);
    CHECK(ps_shard_range(2, 3, 0, &off, &cnt, &err) == SG_EINVAL);
    uint8_t h[PS_OP_HEADER];
    uint64_t v[4];
    ps_op_encode(h, 1, 0x0102030405060708ull, 3, UINT64_MAX);
    CHECK(h[8] == 0x08 && h[15] == 0x01);
    ps_op_decode(h, v);
    CHECK(v[0] == 1 && v[1] == 0x0102030405060708ull && v[2] == 3 && v[3] == UINT64_MAX);
    float p[3] = {1, 2, 3}, g[3] = {1, 1, 1}, lr = 0.5f;
    CHECK(ps_apply_sgd(&lr, p, g, 3, &err) == 0 && p[0] == 0.5f && p[2] == 2.5f);
}

int main(void)
{
    test_feed_batch_round_trip();
    test_ps_shards_and_op_header();
    return check_report("test_net_codec");
}
