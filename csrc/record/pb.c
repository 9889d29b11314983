/*
 * pb.c - bounded protobuf wire reading and a growable writer.
 */
#include "record/pb.h"

#include <stdlib.h>
#include <string.h>

int pb_read_varint_slow(PbReader *r, uint64_t *v, SgError *err)
{
    const uint8_t *p = r->p;
    uint64_t x = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= r->end)
            return sg_fail(err, SG_EPROTOBUF, "truncated varint at byte %zu", pb_offset(r));
        uint8_t b = *p++;
        if (i == 9 && b > 1)
            return sg_fail(err, SG_EPROTOBUF, "overlong varint at byte %zu (above 64 bits)",
                           pb_offset(r));
        x |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            r->p = p;
            *v = x;
            return 0;
        }
    }
    return sg_fail(err, SG_EPROTOBUF, "overlong varint at byte %zu (more than 10 bytes)",
                   pb_offset(r));
}

int pb_read_tag_slow(PbReader *r, uint32_t *field, uint32_t *wire, SgError *err)
{
    size_t at = pb_offset(r);
    uint64_t t;
    int rc = pb_read_varint(r, &t, err);
    if (rc < 0)
        return rc;
    if ((t >> 3) == 0 || (t >> 3) > 0x1fffffff)
        return sg_fail(err, SG_EPROTOBUF, "invalid field number %llu at byte %zu",
                       (unsigned long long)(t >> 3), at);
    *field = (uint32_t)(t >> 3);
    *wire = (uint32_t)(t & 7);
    return 0;
}

int pb_read_len_slow(PbReader *r, const uint8_t **data, size_t *n, SgError *err)
{
    size_t at = pb_offset(r);
    uint64_t len;
    int rc = pb_read_varint(r, &len, err);
    if (rc < 0)
        return rc;
    if (len > (uint64_t)(r->end - r->p))
        return sg_fail(err, SG_EPROTOBUF,
                       "length %llu at byte %zu runs past the end of its message (%zu bytes left)",
                       (unsigned long long)len, at, (size_t)(r->end - r->p));
    *data = r->p;
    *n = (size_t)len;
    r->p += len;
    return 0;
}

int pb_skip(PbReader *r, uint32_t wire, SgError *err)
{
    uint64_t v;
    const uint8_t *d;
    size_t n;
    switch (wire) {
    case PB_VARINT:
        return pb_read_varint(r, &v, err);
    case PB_LEN:
        return pb_read_len(r, &d, &n, err);
    case PB_FIXED64:
    case PB_FIXED32: {
        size_t need = wire == PB_FIXED64 ? 8 : 4;
        if ((size_t)(r->end - r->p) < need)
            return sg_fail(err, SG_EPROTOBUF, "truncated fixed%zu field at byte %zu", need * 8,
                           pb_offset(r));
        r->p += need;
        return 0;
    }
    default:
        return sg_fail(err, SG_EPROTOBUF, "unsupported wire type %u before byte %zu", wire,
                       pb_offset(r));
    }
}

int pb_utf8_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    for (uint64_t w; n - i >= 8; i += 8) { /* ASCII fast path, 8 bytes at a time */
        memcpy(&w, s + i, 8);
        if (w & 0x8080808080808080ull)
            break;
    }
    while (i < n && s[i] < 0x80)
        i++;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        uint32_t cp;
        if ((c & 0xe0) == 0xc0)
            k = 1, cp = c & 0x1f;
        else if ((c & 0xf0) == 0xe0)
            k = 2, cp = c & 0x0f;
        else if ((c & 0xf8) == 0xf0)
            k = 3, cp = c & 0x07;
        else
            return 0;
        if (n - i <= k)
            return 0;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + j] & 0x3f);
        }
        if ((k == 1 && cp < 0x80) || (k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) ||
            cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += k + 1;
    }
    return 1;
}

/* ---- writer ---- */

static int buf_reserve(PbBuf *b, size_t extra)
{
    if (b->oom)
        return 0;
    if (b->len + extra <= b->cap)
        return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra)
        cap *= 2;
    uint8_t *d = realloc(b->data, cap);
    if (d == NULL) {
        b->oom = 1;
        return 0;
    }
    b->data = d;
    b->cap = cap;
    return 1;
}

void pb_buf_free(PbBuf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

void pb_put_raw(PbBuf *b, const void *p, size_t n)
{
    if (n == 0 || !buf_reserve(b, n))
        return;
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

static size_t varint_encode(uint8_t out[10], uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        out[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    out[n++] = (uint8_t)v;
    return n;
}

void pb_put_varint(PbBuf *b, uint64_t v)
{
    uint8_t tmp[10];
    pb_put_raw(b, tmp, varint_encode(tmp, v));
}

void pb_put_tag(PbBuf *b, uint32_t field, uint32_t wire)
{
    pb_put_varint(b, ((uint64_t)field << 3) | wire);
}

void pb_put_bytes(PbBuf *b, uint32_t field, const void *p, size_t n)
{
    pb_put_tag(b, field, PB_LEN);
    pb_put_varint(b, n);
    pb_put_raw(b, p, n);
}

void pb_end_message(PbBuf *b, size_t mark, uint32_t field)
{
    uint8_t head[20];
    size_t h = varint_encode(head, ((uint64_t)field << 3) | PB_LEN);
    h += varint_encode(head + h, b->len - mark);
    if (!buf_reserve(b, h))
        return;
    memmove(b->data + mark + h, b->data + mark, b->len - mark);
    memcpy(b->data + mark, head, h);
    b->len += h;
}
