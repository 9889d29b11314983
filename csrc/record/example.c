/*
 * example.c - walking and building tf.train.Example / SequenceExample bytes.
 */
#include "record/example.h"

#include <string.h>

const char *ex_kind_name(ExKind kind)
{
    switch (kind) {
    case EX_BYTES:
        return "bytes";
    case EX_FLOAT:
        return "float";
    case EX_INT64:
        return "int64";
    default:
        return "empty";
    }
}

static int wrong_wire(const PbReader *r, const char *what, uint32_t field, uint32_t wire,
                      uint32_t want, SgError *err)
{
    return sg_fail(err, SG_EPROTOBUF,
                   "wrong wire type %u for %s field %u before byte %zu (expected %u)", wire, what,
                   field, pb_offset(r), want);
}

/* Parses a map entry {key = 1 (string), value = 2 (message)}. */
static int entry_parse(const uint8_t *base, const uint8_t *p, size_t n, size_t at, ExEntry *e,
                       SgError *err)
{
    PbReader r = {p, p + n, base};
    e->key = (const uint8_t *)"";
    e->key_len = 0;
    e->value = p + n; /* empty */
    e->value_len = 0;
    e->offset = at;
    while (r.p < r.end) {
        uint32_t field, wire;
        int rc = pb_read_tag(&r, &field, &wire, err);
        if (rc < 0)
            return rc;
        if (field == 1 || field == 2) {
            if (wire != PB_LEN)
                return wrong_wire(&r, field == 1 ? "map key" : "map value", field, wire, PB_LEN,
                                  err);
            const uint8_t *d;
            size_t len;
            if ((rc = pb_read_len(&r, &d, &len, err)) < 0)
                return rc;
            if (field == 1) {
                e->key = d;
                e->key_len = len;
            } else {
                e->value = d;
                e->value_len = len;
            }
        } else if ((rc = pb_skip(&r, wire, err)) < 0) {
            return rc;
        }
    }
    if (!pb_utf8_valid(e->key, e->key_len))
        return sg_fail(err, SG_EPROTOBUF, "feature key at byte %zu is not valid UTF-8",
                       (size_t)(e->key - base));
    return 0;
}

/* Walks `repeated message field_no` of a message, calling fn per entry. */
static int map_foreach(const uint8_t *base, const uint8_t *p, size_t n, uint32_t field_no,
                       const char *what, ExEntryFn fn, void *ctx, SgError *err)
{
    PbReader r = {p, p + n, base};
    uint32_t wire;
    int rc;
    while ((rc = pb_next_field(&r, field_no, &wire, err)) == 1) {
        if (wire != PB_LEN)
            return wrong_wire(&r, what, field_no, wire, PB_LEN, err);
        size_t at = pb_offset(&r);
        const uint8_t *d;
        size_t len;
        if ((rc = pb_read_len(&r, &d, &len, err)) < 0)
            return rc;
        ExEntry e;
        if ((rc = entry_parse(base, d, len, at, &e, err)) < 0)
            return rc;
        if ((rc = fn(ctx, &e, err)) != 0)
            return rc;
    }
    return rc;
}

/* Walks every occurrence of message field `field_no` (repeated occurrences of
 * a singular message merge, so each is walked in turn). */
static int message_fields(const uint8_t *rec, size_t n, uint32_t field_no, const char *what,
                          uint32_t map_field, const char *map_what, ExEntryFn fn, void *ctx,
                          SgError *err)
{
    PbReader r = {rec, rec + n, rec};
    uint32_t wire;
    int rc;
    while ((rc = pb_next_field(&r, field_no, &wire, err)) == 1) {
        if (wire != PB_LEN)
            return wrong_wire(&r, what, field_no, wire, PB_LEN, err);
        const uint8_t *d;
        size_t len;
        if ((rc = pb_read_len(&r, &d, &len, err)) < 0)
            return rc;
        if (fn != NULL && (rc = map_foreach(rec, d, len, map_field, map_what, fn, ctx, err)) != 0)
            return rc;
    }
    return rc;
}

int ex_example_foreach(const uint8_t *rec, size_t n, ExEntryFn fn, void *ctx, SgError *err)
{
    return message_fields(rec, n, 1, "Example.features", 1, "Features.feature", fn, ctx, err);
}

int ex_sequence_foreach(const uint8_t *rec, size_t n, ExEntryFn ctx_fn, ExEntryFn list_fn,
                        void *ctx, SgError *err)
{
    int rc = message_fields(rec, n, 1, "SequenceExample.context", 1, "Features.feature", ctx_fn,
                            ctx, err);
    if (rc != 0)
        return rc;
    return message_fields(rec, n, 2, "SequenceExample.feature_lists", 1,
                          "FeatureLists.feature_list", list_fn, ctx, err);
}

int ex_feature_list_foreach(const uint8_t *base, const uint8_t *p, size_t n, ExEntryFn fn,
                            void *ctx, SgError *err)
{
    PbReader r = {p, p + n, base};
    uint32_t wire;
    int rc;
    while ((rc = pb_next_field(&r, 1, &wire, err)) == 1) {
        if (wire != PB_LEN)
            return wrong_wire(&r, "FeatureList.feature", 1, wire, PB_LEN, err);
        ExEntry e = {NULL, 0, NULL, 0, pb_offset(&r)};
        if ((rc = pb_read_len(&r, &e.value, &e.value_len, err)) < 0)
            return rc;
        if ((rc = fn(ctx, &e, err)) != 0)
            return rc;
    }
    return rc;
}

/* Adds the number of varints in a packed run to *count, checking each ends
 * within 10 bytes (the 10th holding at most the top bit) and the run ends on
 * a varint boundary: one pass over the bytes, no decoding. */
static int packed_varints_count(const uint8_t *base, const uint8_t *p, size_t n, size_t *count,
                                SgError *err)
{
    size_t c = 0, run = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = p[i];
        if (b & 0x80) {
            if (++run >= 10)
                return sg_fail(err, SG_EPROTOBUF,
                               "overlong varint at byte %zu (more than 10 bytes)",
                               (size_t)(p + i + 1 - run - base));
            continue;
        }
        if (run == 9 && b > 1)
            return sg_fail(err, SG_EPROTOBUF, "overlong varint at byte %zu (above 64 bits)",
                           (size_t)(p + i - run - base));
        run = 0;
        c++;
    }
    if (run != 0)
        return sg_fail(err, SG_EPROTOBUF, "truncated varint at byte %zu",
                       (size_t)(p + n - run - base));
    *count += c;
    return 0;
}

/* Counts and validates the values of a *List body. */
static int list_scan(const uint8_t *base, const uint8_t *p, size_t n, ExKind kind, size_t *count,
                     SgError *err)
{
    PbReader r = {p, p + n, base};
    size_t c = 0;
    uint32_t wire, field = 1;
    int rc;
    while ((rc = pb_next_field(&r, field, &wire, err)) == 1) {
        const uint8_t *d;
        size_t len;
        if (kind == EX_BYTES) {
            if (wire != PB_LEN)
                return wrong_wire(&r, "BytesList.value", field, wire, PB_LEN, err);
            if ((rc = pb_read_len(&r, &d, &len, err)) < 0)
                return rc;
            c++;
        } else if (kind == EX_FLOAT) {
            if (wire == PB_FIXED32) {
                if ((rc = pb_skip(&r, wire, err)) < 0)
                    return rc;
                c++;
            } else if (wire == PB_LEN) {
                size_t at = pb_offset(&r);
                if ((rc = pb_read_len(&r, &d, &len, err)) < 0)
                    return rc;
                if (len % 4 != 0)
                    return sg_fail(
                        err, SG_EPROTOBUF,
                        "packed FloatList at byte %zu has %zu bytes, not a multiple of 4", at, len);
                c += len / 4;
            } else {
                return wrong_wire(&r, "FloatList.value", field, wire, PB_FIXED32, err);
            }
        } else {
            uint64_t v;
            if (wire == PB_VARINT) {
                if ((rc = pb_read_varint(&r, &v, err)) < 0)
                    return rc;
                c++;
            } else if (wire == PB_LEN) {
                if ((rc = pb_read_len(&r, &d, &len, err)) < 0)
                    return rc;
                if ((rc = packed_varints_count(base, d, len, &c, err)) < 0)
                    return rc;
            } else {
                return wrong_wire(&r, "Int64List.value", field, wire, PB_VARINT, err);
            }
        }
    }
    if (rc < 0)
        return rc;
    *count = c;
    return 0;
}

int ex_feature_decode(const uint8_t *base, const uint8_t *p, size_t n, ExFeature *out, SgError *err)
{
    PbReader r = {p, p + n, base};
    out->kind = EX_NONE;
    out->list = p + n;
    out->list_len = 0;
    out->count = 0;
    out->offset = (size_t)(p - base);
    while (r.p < r.end) {
        uint32_t field, wire;
        int rc = pb_read_tag(&r, &field, &wire, err);
        if (rc < 0)
            return rc;
        if (field < 1 || field > 3) {
            if ((rc = pb_skip(&r, wire, err)) < 0)
                return rc;
            continue;
        }
        if (wire != PB_LEN)
            return wrong_wire(&r, "Feature.kind", field, wire, PB_LEN, err);
        out->kind = (ExKind)field; /* oneof: the last one wins */
        out->offset = pb_offset(&r);
        if ((rc = pb_read_len(&r, &out->list, &out->list_len, err)) < 0)
            return rc;
    }
    if (out->kind == EX_NONE)
        return 0;
    return list_scan(base, out->list, out->list_len, out->kind, &out->count, err);
}

/* The value-copying walks below run on lists list_scan accepted. */

void ex_values_int64(const ExFeature *f, int64_t *out)
{
    const uint8_t *p = f->list, *end = f->list + f->list_len;
    while (p < end) {
        uint64_t tag, v;
        p = pb_varint_fast(p, &tag);
        if ((tag >> 3) != 1) {
            PbReader r = {p, end, p};
            pb_skip(&r, (uint32_t)(tag & 7), NULL);
            p = r.p;
        } else if ((tag & 7) == PB_VARINT) {
            p = pb_varint_fast(p, &v);
            *out++ = (int64_t)v;
        } else {
            uint64_t len;
            p = pb_varint_fast(p, &len);
            const uint8_t *stop = p + len;
            while (p < stop) {
                if (*p < 0x80) { /* one-byte values: pixels, labels, small ids */
                    *out++ = *p++;
                    continue;
                }
                p = pb_varint_fast(p, &v);
                *out++ = (int64_t)v;
            }
        }
    }
}

void ex_values_float(const ExFeature *f, float *out)
{
    const uint8_t *p = f->list, *end = f->list + f->list_len;
    while (p < end) {
        uint64_t tag;
        p = pb_varint_fast(p, &tag);
        if ((tag >> 3) != 1) {
            PbReader r = {p, end, p};
            pb_skip(&r, (uint32_t)(tag & 7), NULL);
            p = r.p;
        } else if ((tag & 7) == PB_FIXED32) {
            memcpy(out++, p, 4);
            p += 4;
        } else {
            uint64_t len;
            p = pb_varint_fast(p, &len);
            memcpy(out, p, len);
            out += len / 4;
            p += len;
        }
    }
}

void ex_values_bytes(const ExFeature *f, const uint8_t **ptrs, size_t *lens)
{
    const uint8_t *p = f->list, *end = f->list + f->list_len;
    while (p < end) {
        uint64_t tag, len;
        p = pb_varint_fast(p, &tag);
        if ((tag >> 3) != 1) {
            PbReader r = {p, end, p};
            pb_skip(&r, (uint32_t)(tag & 7), NULL);
            p = r.p;
            continue;
        }
        p = pb_varint_fast(p, &len);
        *ptrs++ = p;
        *lens++ = (size_t)len;
        p += len;
    }
}

/* ---- encoding ---- */

void ex_put_feature_int64(PbBuf *b, uint32_t field, const int64_t *v, size_t n)
{
    size_t feature = pb_begin(b);
    size_t list = pb_begin(b);
    if (n > 0) {
        size_t packed = pb_begin(b);
        for (size_t i = 0; i < n; i++)
            pb_put_varint(b, (uint64_t)v[i]);
        pb_end_message(b, packed, 1);
    }
    pb_end_message(b, list, EX_INT64);
    pb_end_message(b, feature, field);
}

void ex_put_feature_float(PbBuf *b, uint32_t field, const float *v, size_t n)
{
    size_t feature = pb_begin(b);
    size_t list = pb_begin(b);
    if (n > 0) {
        pb_put_tag(b, 1, PB_LEN);
        pb_put_varint(b, 4 * (uint64_t)n);
        pb_put_raw(b, v, 4 * n);
    }
    pb_end_message(b, list, EX_FLOAT);
    pb_end_message(b, feature, field);
}

void ex_put_feature_bytes(PbBuf *b, uint32_t field, const uint8_t *const *v, const size_t *lens,
                          size_t n)
{
    size_t feature = pb_begin(b);
    size_t list = pb_begin(b);
    for (size_t i = 0; i < n; i++)
        pb_put_bytes(b, 1, v[i], lens[i]);
    pb_end_message(b, list, EX_BYTES);
    pb_end_message(b, feature, field);
}

void ex_put_int64(PbBuf *b, const char *key, size_t key_len, const int64_t *v, size_t n)
{
    size_t entry = pb_begin(b);
    pb_put_bytes(b, 1, key, key_len);
    ex_put_feature_int64(b, 2, v, n);
    pb_end_message(b, entry, 1);
}

void ex_put_float(PbBuf *b, const char *key, size_t key_len, const float *v, size_t n)
{
    size_t entry = pb_begin(b);
    pb_put_bytes(b, 1, key, key_len);
    ex_put_feature_float(b, 2, v, n);
    pb_end_message(b, entry, 1);
}

void ex_put_bytes(PbBuf *b, const char *key, size_t key_len, const uint8_t *const *v,
                  const size_t *lens, size_t n)
{
    size_t entry = pb_begin(b);
    pb_put_bytes(b, 1, key, key_len);
    ex_put_feature_bytes(b, 2, v, lens, n);
    pb_end_message(b, entry, 1);
}
