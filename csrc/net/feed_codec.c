/*
 * feed_codec.c - the BATCH payload of feed.h: decode (untrusted bytes,
 * every length checked before use), encode (metadata + iovecs over the
 * caller's column data, no copy), and schema comparison.
 */
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>

#include "net/feed.h"

size_t feed_dtype_size(int dtype)
{
    switch (dtype) {
    case FEED_F32:
    case FEED_I32:
        return 4;
    case FEED_F64:
    case FEED_I64:
        return 8;
    case FEED_U8:
    case FEED_I8:
    case FEED_BOOL:
        return 1;
    case FEED_I16:
    case FEED_U16:
        return 2;
    default:
        return 0;
    }
}

typedef struct Reader {
    const uint8_t *buf;
    size_t len, off;
    SgError *err;
} Reader;

static int need(Reader *r, size_t n, const char *what)
{
    if (r->len - r->off < n)
        return sg_fail(r->err, SG_EPROTO,
                       "feed batch truncated at byte %zu: %s needs %zu bytes, %zu remain", r->off,
                       what, n, r->len - r->off);
    return SG_OK;
}

static uint64_t get_le(Reader *r, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)r->buf[r->off + (size_t)i] << (8 * i);
    r->off += (size_t)bytes;
    return v;
}

static int get_name(Reader *r, char *out, const char *what)
{
    int rc = need(r, 1, what);
    if (rc < 0)
        return rc;
    size_t n = (size_t)get_le(r, 1);
    if ((rc = need(r, n, what)) < 0)
        return rc;
    if (n == 0 || memchr(r->buf + r->off, '\0', n) != NULL)
        return sg_fail(r->err, SG_EPROTO, "feed batch: %s at byte %zu is empty or contains NUL",
                       what, r->off);
    memcpy(out, r->buf + r->off, n);
    out[n] = '\0';
    r->off += n;
    return SG_OK;
}

static int decode_column(Reader *r, uint64_t rows, int index, FeedColumn *col)
{
    int rc = get_name(r, col->name, "column name");
    if (rc < 0 || (rc = need(r, 2, "column dtype and ndim")) < 0)
        return rc;
    col->dtype = (uint8_t)get_le(r, 1);
    col->ndim = (uint8_t)get_le(r, 1);
    size_t item = feed_dtype_size(col->dtype);
    if (item == 0)
        return sg_fail(r->err, SG_EPROTO, "feed batch column %d '%s': unknown dtype code %u", index,
                       col->name, col->dtype);
    if (col->ndim < 1 || col->ndim > FEED_MAX_NDIM)
        return sg_fail(r->err, SG_EPROTO, "feed batch column %d '%s': ndim %u outside 1..%d", index,
                       col->name, col->ndim, FEED_MAX_NDIM);
    if ((rc = need(r, 8u * col->ndim + 8u, "column shape")) < 0)
        return rc;
    uint64_t bytes = item;
    for (int d = 0; d < col->ndim; d++) {
        col->dims[d] = get_le(r, 8);
        if (d > 0 && col->dims[d] != 0 && bytes > UINT64_MAX / col->dims[d])
            return sg_fail(r->err, SG_EPROTO, "feed batch column '%s': shape overflows", col->name);
        if (d > 0)
            bytes *= col->dims[d];
    }
    col->row_bytes = bytes;
    if (col->dims[0] != rows)
        return sg_fail(r->err, SG_EPROTO, "feed batch column '%s' has %llu rows, the batch %llu",
                       col->name, (unsigned long long)col->dims[0], (unsigned long long)rows);
    uint64_t data_len = get_le(r, 8);
    if (rows != 0 && bytes > UINT64_MAX / rows)
        return sg_fail(r->err, SG_EPROTO, "feed batch column '%s': size overflows", col->name);
    if (data_len != bytes * rows)
        return sg_fail(r->err, SG_EPROTO,
                       "feed batch column '%s': %llu data bytes, shape says %llu", col->name,
                       (unsigned long long)data_len, (unsigned long long)(bytes * rows));
    if ((rc = need(r, (size_t)data_len, "column data")) < 0)
        return rc;
    col->data = r->buf + r->off;
    r->off += (size_t)data_len;
    return SG_OK;
}

int feed_batch_decode(const uint8_t *buf, size_t len, FeedBatch *out, SgError *err)
{
    Reader r = {buf, len, 0, err};
    int rc = get_name(&r, out->input, "input name");
    if (rc < 0 || (rc = need(&r, 10, "row and column counts")) < 0)
        return rc;
    out->rows = get_le(&r, 8);
    out->ncols = (int)get_le(&r, 2);
    if (out->ncols < 1 || out->ncols > FEED_MAX_COLUMNS)
        return sg_fail(err, SG_EPROTO, "feed batch has %d columns (1..%d allowed)", out->ncols,
                       FEED_MAX_COLUMNS);
    for (int i = 0; i < out->ncols; i++) {
        if ((rc = decode_column(&r, out->rows, i, &out->cols[i])) < 0)
            return rc;
        for (int j = 0; j < i; j++)
            if (strcmp(out->cols[j].name, out->cols[i].name) == 0)
                return sg_fail(err, SG_EPROTO, "feed batch names column '%s' twice",
                               out->cols[i].name);
    }
    if (r.off != len)
        return sg_fail(err, SG_EPROTO, "feed batch has %zu trailing bytes after its last column",
                       len - r.off);
    return SG_OK;
}

static size_t put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    return (size_t)bytes;
}

static size_t put_name(uint8_t *p, const char *name)
{
    size_t n = strlen(name);
    p[0] = (uint8_t)n;
    memcpy(p + 1, name, n);
    return n + 1;
}

long feed_batch_encode(const FeedBatch *b, uint8_t *meta, size_t meta_cap, struct iovec *iov,
                       SgError *err)
{
    if (b->ncols < 1 || b->ncols > FEED_MAX_COLUMNS)
        return sg_fail(err, SG_EINVAL, "a feed batch needs 1..%d columns, got %d", FEED_MAX_COLUMNS,
                       b->ncols);
    size_t in_len = strlen(b->input);
    if (in_len == 0 || in_len > FEED_NAME_MAX)
        return sg_fail(err, SG_EINVAL, "input name must be 1..%d bytes", FEED_NAME_MAX);
    size_t need = 1 + in_len + 10;
    for (int i = 0; i < b->ncols; i++)
        need += 1 + strlen(b->cols[i].name) + 2 + 8u * b->cols[i].ndim + 8;
    if (need > meta_cap)
        return sg_fail(err, SG_EINVAL, "feed batch metadata needs %zu bytes", need);
    size_t off = put_name(meta, b->input);
    off += put_le(meta + off, b->rows, 8);
    off += put_le(meta + off, (uint64_t)b->ncols, 2);
    size_t total = 0, start = 0;
    int k = 0;
    for (int i = 0; i < b->ncols; i++) {
        const FeedColumn *c = &b->cols[i];
        size_t nl = strlen(c->name);
        if (nl == 0 || nl > FEED_NAME_MAX || c->ndim < 1 || c->ndim > FEED_MAX_NDIM ||
            feed_dtype_size(c->dtype) == 0 || c->dims[0] != b->rows)
            return sg_fail(err, SG_EINVAL,
                           "feed column %d ('%s') has a bad name, dtype, ndim or row count", i,
                           c->name);
        off += put_name(meta + off, c->name);
        meta[off++] = c->dtype;
        meta[off++] = c->ndim;
        uint64_t bytes = feed_dtype_size(c->dtype);
        for (int d = 0; d < c->ndim; d++) {
            off += put_le(meta + off, c->dims[d], 8);
            bytes *= c->dims[d];
        }
        off += put_le(meta + off, bytes, 8);
        iov[k++] = (struct iovec){meta + start, off - start};
        iov[k++] = (struct iovec){(void *)c->data, (size_t)bytes};
        total += off - start + (size_t)bytes;
        start = off;
    }
    return (long)total;
}

int feed_schema_check(const FeedBatch *ref, const FeedBatch *b, SgError *err)
{
    if (ref->ncols != b->ncols)
        return sg_fail(err, SG_ESCHEMA, "input '%s': batch has %d columns, earlier batches %d",
                       b->input, b->ncols, ref->ncols);
    for (int i = 0; i < b->ncols; i++) {
        const FeedColumn *x = &ref->cols[i], *y = &b->cols[i];
        int same = strcmp(x->name, y->name) == 0 && x->dtype == y->dtype && x->ndim == y->ndim;
        for (int d = 1; same && d < x->ndim; d++)
            same = x->dims[d] == y->dims[d];
        if (!same)
            return sg_fail(
                err, SG_ESCHEMA,
                "input '%s': column %d is '%s' (dtype %u, %u dims) but earlier batches had '%s' "
                "(dtype %u, %u dims) or a different row shape",
                b->input, i, y->name, y->dtype, y->ndim, x->name, x->dtype, x->ndim);
    }
    return SG_OK;
}
