/*
 * pb.h - the few protobuf wire-format pieces tf.train.Example needs:
 * bounded reads (varints of at most 10 bytes, length-delimited fields checked
 * against the bytes left) and a growable writer whose nested messages are
 * written first and prefixed with their tag and length afterwards.
 */
#ifndef SG_PB_H
#define SG_PB_H

#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"

enum { PB_VARINT = 0, PB_FIXED64 = 1, PB_LEN = 2, PB_FIXED32 = 5 };

typedef struct PbReader {
    const uint8_t *p, *end;
    const uint8_t *base; /* start of the record, for offsets in messages */
} PbReader;

static inline size_t pb_offset(const PbReader *r)
{
    return (size_t)(r->p - r->base);
}

/* Each returns 0, or SG_EPROTOBUF with a message naming the byte offset.
 * The inline versions handle the common one-byte cases and fall back to the
 * _slow functions for everything else (including every error). */
int pb_read_varint_slow(PbReader *r, uint64_t *v, SgError *err);
int pb_read_tag_slow(PbReader *r, uint32_t *field, uint32_t *wire, SgError *err);
int pb_read_len_slow(PbReader *r, const uint8_t **data, size_t *n, SgError *err);
int pb_skip(PbReader *r, uint32_t wire, SgError *err);

static inline int pb_read_varint(PbReader *r, uint64_t *v, SgError *err)
{
    if (r->p < r->end && *r->p < 0x80) {
        *v = *r->p++;
        return 0;
    }
    return pb_read_varint_slow(r, v, err);
}

static inline int pb_read_tag(PbReader *r, uint32_t *field, uint32_t *wire, SgError *err)
{
    if (r->p < r->end && *r->p < 0x80 && *r->p >= 8) {
        *field = *r->p >> 3;
        *wire = *r->p & 7;
        r->p++;
        return 0;
    }
    return pb_read_tag_slow(r, field, wire, err);
}

/* Advances to the next occurrence of field `want`, skipping every other
 * field. Returns 1 with *wire set just after its tag, 0 at the end of the
 * message, or a negative status. */
static inline int pb_next_field(PbReader *r, uint32_t want, uint32_t *wire, SgError *err)
{
    while (r->p < r->end) {
        uint32_t field;
        int rc = pb_read_tag(r, &field, wire, err);
        if (rc < 0)
            return rc;
        if (field == want)
            return 1;
        if ((rc = pb_skip(r, *wire, err)) < 0)
            return rc;
    }
    return 0;
}

static inline int pb_read_len(PbReader *r, const uint8_t **data, size_t *n, SgError *err)
{
    size_t left = (size_t)(r->end - r->p), len, used;
    if (left >= 1 && r->p[0] < 0x80) {
        len = r->p[0];
        used = 1;
    } else if (left >= 2 && r->p[1] < 0x80) { /* 128 .. 16383 bytes */
        len = (size_t)(r->p[0] & 0x7f) | ((size_t)r->p[1] << 7);
        used = 2;
    } else {
        return pb_read_len_slow(r, data, n, err);
    }
    if (len > left - used)
        return pb_read_len_slow(r, data, n, err); /* reports the error */
    *n = len;
    *data = r->p + used;
    r->p += used + len;
    return 0;
}

/* Fast inline varint for data already validated (no bounds checks beyond end). */
static inline const uint8_t *pb_varint_fast(const uint8_t *p, uint64_t *v)
{
    uint64_t x = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        uint8_t b = *p++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            break;
    }
    *v = x;
    return p;
}

int pb_utf8_valid(const uint8_t *s, size_t n);

/* ---- writer ---- */

typedef struct PbBuf {
    uint8_t *data;
    size_t len, cap;
    int oom;
} PbBuf;

void pb_buf_free(PbBuf *b);
void pb_put_raw(PbBuf *b, const void *p, size_t n);
void pb_put_varint(PbBuf *b, uint64_t v);
void pb_put_tag(PbBuf *b, uint32_t field, uint32_t wire);
void pb_put_bytes(PbBuf *b, uint32_t field, const void *p, size_t n);
/* Marks where a nested message starts; pb_end_message later inserts
 * `tag(field, LEN) | varint(length)` in front of everything written since. */
static inline size_t pb_begin(const PbBuf *b)
{
    return b->len;
}
void pb_end_message(PbBuf *b, size_t mark, uint32_t field);

#endif /* SG_PB_H */
