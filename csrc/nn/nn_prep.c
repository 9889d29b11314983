/*
 * nn_prep.c - preprocessing chains run in the batch gather (nn_prep.h):
 * building one from its spec (copies, the vocabulary's hash table), and
 * mapping a batch's raw rows into the floats the network reads. Keras'
 * semantics, value by value: keras/src/layers/preprocessing/{index_lookup,
 * hashing,discretization,normalization,category_encoding}.py.
 */
#include "nn/nn_prep.h"

#include <inttypes.h>
#include <math.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* FarmHash's util::Fingerprint64(const char *, size_t) from libfarmhash, a
 * C++ library whose header C cannot include: bound here by its Itanium ABI
 * name (a plain function of C types, stable across releases by design). */
extern uint64_t farmhash_fingerprint64(const char *s,
                                       size_t len) __asm__("_ZN4util13Fingerprint64EPKcm");

struct NnPrep {
    NnPrepSpec s; /* its pointers point into the copies below */
    size_t out_row;
    char *map_layer, *encode_layer, *mask_str;
    float *mean, *std, *bounds;
    int64_t *voffsets, *vints;
    char *vbytes;
    /* [cap] open addressing: the token's hash's high 32 bits << 32 | its index + 1
     * (0: empty), so a probe compares tags before it reads the vocabulary */
    uint64_t *slots;
    size_t cap;
    EVP_MAC *mac; /* SIPHASH, when salted */
};

uint64_t nn_prep_fingerprint64(const char *s, size_t len)
{
    return farmhash_fingerprint64(s, len);
}

/* ---- hashing ---------------------------------------------------------- */

/* A SipHash-2-4 context keyed with key[2] (TF's key: two 64-bit words, each
 * little-endian, as the reference SipHash reads its 16-byte key). */
static EVP_MAC_CTX *siphash_ctx(EVP_MAC *mac, const uint64_t key[2], SgError *err)
{
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(mac);
    if (ctx == NULL) {
        sg_fail(err, SG_ENOMEM, "SipHash: EVP_MAC_CTX_new failed");
        return NULL;
    }
    unsigned char k[16];
    for (int i = 0; i < 16; i++)
        k[i] = (unsigned char)(key[i / 8] >> (8 * (i % 8)));
    unsigned int size = 8;
    OSSL_PARAM params[] = {OSSL_PARAM_construct_uint(OSSL_MAC_PARAM_SIZE, &size),
                           OSSL_PARAM_construct_end()};
    if (!EVP_MAC_init(ctx, k, sizeof k, params)) {
        EVP_MAC_CTX_free(ctx);
        sg_fail(err, SG_EINVAL, "SipHash: EVP_MAC_init failed");
        return NULL;
    }
    return ctx;
}

/* The 64-bit SipHash of s[len] with ctx's key (the context restarted). */
static int siphash_run(EVP_MAC_CTX *ctx, const char *s, size_t len, uint64_t *out, SgError *err)
{
    unsigned char h[8];
    size_t hl = 0;
    if (!EVP_MAC_init(ctx, NULL, 0, NULL) || !EVP_MAC_update(ctx, (const unsigned char *)s, len) ||
        !EVP_MAC_final(ctx, h, &hl, sizeof h) || hl != 8)
        return sg_fail(err, SG_EINVAL, "SipHash: EVP_MAC update/final failed");
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | h[i];
    *out = v;
    return 0;
}

int nn_prep_siphash(const uint64_t key[2], const char *s, size_t len, uint64_t *out, SgError *err)
{
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "SIPHASH", NULL);
    if (mac == NULL)
        return sg_fail(err, SG_EINVAL, "OpenSSL has no SIPHASH MAC (EVP_MAC_fetch failed)");
    EVP_MAC_CTX *ctx = siphash_ctx(mac, key, err);
    int rc = ctx ? siphash_run(ctx, s, len, out, err) : err->code;
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(mac);
    return rc;
}

/* ---- the vocabulary's table ------------------------------------------- */

static uint64_t int_key(int64_t v)
{
    char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (char)((uint64_t)v >> (8 * i));
    return farmhash_fingerprint64(b, sizeof b);
}

static int token_equals(const NnPrep *p, int64_t k, const char *s, size_t len, int64_t v)
{
    if (!p->s.strings)
        return p->vints[k] == v;
    const int64_t a = p->voffsets[k], b = p->voffsets[k + 1];
    return (size_t)(b - a) == len && (len == 0 || memcmp(p->vbytes + a, s, len) == 0);
}

/* The index of the token (s[len], or v for integers), or -1. With insert,
 * token k is put in its empty slot instead (returning -1), or the index of
 * an equal token is returned. */
static int64_t table_probe(NnPrep *p, const char *s, size_t len, int64_t v, int64_t insert)
{
    const uint64_t h = p->s.strings ? farmhash_fingerprint64(s, len) : int_key(v);
    const uint64_t tag = h >> 32 << 32;
    for (size_t i = h & (p->cap - 1);; i = (i + 1) & (p->cap - 1)) {
        const uint64_t slot = p->slots[i];
        if (slot == 0) {
            if (insert >= 0)
                p->slots[i] = tag | (uint64_t)(insert + 1);
            return -1;
        }
        const int64_t at = (int64_t)(slot & 0xffffffffu) - 1;
        if ((slot & ~(uint64_t)0xffffffffu) == tag && token_equals(p, at, s, len, v))
            return at;
    }
}

static int build_table(NnPrep *p, SgError *err)
{
    p->cap = 16;
    while (p->cap < 2 * p->s.nvocab)
        p->cap *= 2;
    if ((p->slots = calloc(p->cap, sizeof *p->slots)) == NULL)
        return sg_fail(err, SG_ENOMEM, "%s: no memory for a table of %zu tokens", p->map_layer,
                       p->s.nvocab);
    for (size_t k = 0; k < p->s.nvocab; k++) {
        const char *s = NULL;
        size_t len = 0;
        int64_t v = 0;
        if (p->s.strings) {
            s = p->vbytes + p->voffsets[k];
            len = (size_t)(p->voffsets[k + 1] - p->voffsets[k]);
        } else {
            v = p->vints[k];
        }
        const int64_t dup = table_probe(p, s, len, v, (int64_t)k);
        if (dup >= 0 && p->s.strings)
            return sg_fail(err, SG_EINVAL,
                           "%s: the vocabulary repeats '%.*s' (tokens %" PRId64 " and %zu)",
                           p->map_layer, (int)(len > 60 ? 60 : len), s, dup, k);
        if (dup >= 0)
            return sg_fail(err, SG_EINVAL,
                           "%s: the vocabulary repeats %" PRId64 " (tokens %" PRId64 " and %zu)",
                           p->map_layer, v, dup, k);
    }
    return 0;
}

/* ---- building --------------------------------------------------------- */

static void *dup_bytes(const void *src, size_t n, int *failed)
{
    if (src == NULL || n == 0)
        return NULL;
    void *d = malloc(n);
    if (d == NULL)
        *failed = 1;
    else
        memcpy(d, src, n);
    return d;
}

static char *dup_str(const char *s, int *failed)
{
    return dup_bytes(s ? s : "", strlen(s ? s : "") + 1, failed);
}

/* The largest id the map gives (exclusive), or 0 where it gives floats. */
static int64_t map_ids(const NnPrepSpec *s)
{
    switch (s->map) {
    case NN_PREP_DISCRETIZE:
        return (int64_t)s->nbounds + 1;
    case NN_PREP_LOOKUP: {
        int64_t end = s->first + (int64_t)s->nvocab;
        if (s->oov_start + s->num_oov > end)
            end = s->oov_start + s->num_oov;
        return end;
    }
    case NN_PREP_HASH:
        return s->num_bins;
    default:
        return 0;
    }
}

static int check_spec(const NnPrepSpec *s, const char *name, SgError *err)
{
    if (s->row == 0)
        return sg_fail(err, SG_EINVAL, "%s: an input row of 0 values", name);
    if (s->map == NN_PREP_NORMALIZE && (s->mean == NULL || s->std == NULL || s->encode))
        return sg_fail(err, SG_EINVAL, "%s: Normalization needs mean and std and takes no encoding",
                       name);
    if (s->map == NN_PREP_DISCRETIZE) {
        for (size_t k = 1; k < s->nbounds; k++)
            if (!(s->bounds[k - 1] <= s->bounds[k]))
                return sg_fail(err, SG_EINVAL,
                               "%s: bin_boundaries must be sorted, but %g comes before %g", name,
                               (double)s->bounds[k - 1], (double)s->bounds[k]);
    }
    if (s->map == NN_PREP_HASH && s->num_bins < 1 + s->has_mask)
        return sg_fail(err, SG_EINVAL, "%s: num_bins must be >= %d", name, 1 + s->has_mask);
    if (s->map == NN_PREP_LOOKUP &&
        (s->num_oov < 0 || (s->strings ? s->vocab_offsets == NULL : s->vocab_ints == NULL)))
        return sg_fail(err, SG_EINVAL, "%s: a lookup needs its vocabulary", name);
    if (s->strings && s->map != NN_PREP_LOOKUP && s->map != NN_PREP_HASH)
        return sg_fail(err, SG_EINVAL, "%s: only a lookup or Hashing takes strings", name);
    const int64_t ids = map_ids(s);
    if (ids > NN_PREP_MAX_ID || s->num_tokens > NN_PREP_MAX_ID)
        return sg_fail(err, SG_EINVAL,
                       "%s: ids up to %" PRId64 " do not fit float32 exactly (at most %d)", name,
                       ids > s->num_tokens ? ids : s->num_tokens, NN_PREP_MAX_ID);
    if (s->encode != NN_ENCODE_NONE && s->num_tokens < 1)
        return sg_fail(err, SG_EINVAL, "%s: num_tokens must be >= 1", name);
    return 0;
}

int nn_prep_new(NnPrep **out, const NnPrepSpec *spec, SgError *err)
{
    *out = NULL;
    const char *name = spec->map != NN_PREP_IDENTITY ? spec->map_layer : spec->encode_layer;
    int rc = check_spec(spec, name ? name : "preprocessing", err);
    if (rc < 0)
        return rc;
    NnPrep *p = calloc(1, sizeof *p);
    if (p == NULL)
        return sg_fail(err, SG_ENOMEM, "no memory for a preprocessing chain");
    p->s = *spec;
    int failed = 0;
    const size_t nv = spec->nvocab;
    p->map_layer = dup_str(spec->map_layer, &failed);
    p->encode_layer = dup_str(spec->encode_layer, &failed);
    p->mask_str = dup_bytes(spec->mask_str, spec->mask_len, &failed);
    p->mean = dup_bytes(spec->mean, spec->row * sizeof(float), &failed);
    p->std = dup_bytes(spec->std, spec->row * sizeof(float), &failed);
    p->bounds = dup_bytes(spec->bounds, spec->nbounds * sizeof(float), &failed);
    if (spec->map == NN_PREP_LOOKUP && spec->strings) {
        p->voffsets = dup_bytes(spec->vocab_offsets, (nv + 1) * sizeof(int64_t), &failed);
        p->vbytes = dup_bytes(spec->vocab_bytes, (size_t)spec->vocab_offsets[nv], &failed);
    } else if (spec->map == NN_PREP_LOOKUP) {
        p->vints = dup_bytes(spec->vocab_ints, nv * sizeof(int64_t), &failed);
    }
    if (failed) {
        nn_prep_free(p);
        return sg_fail(err, SG_ENOMEM, "%s: no memory for its vocabulary and statistics", name);
    }
    if (spec->map == NN_PREP_LOOKUP && (rc = build_table(p, err)) < 0) {
        nn_prep_free(p);
        return rc;
    }
    if (spec->salted && (p->mac = EVP_MAC_fetch(NULL, "SIPHASH", NULL)) == NULL) {
        nn_prep_free(p);
        return sg_fail(err, SG_EINVAL, "%s: a salt needs OpenSSL's SIPHASH MAC, which is missing",
                       name);
    }
    const size_t T = (size_t)spec->num_tokens;
    switch (spec->encode) {
    case NN_ENCODE_NONE:
        p->out_row = spec->row;
        break;
    case NN_ENCODE_ONE_HOT:
        p->out_row = spec->row == 1 ? T : spec->row * T;
        break;
    default:
        p->out_row = T;
    }
    *out = p;
    return 0;
}

void nn_prep_free(NnPrep *p)
{
    if (p == NULL)
        return;
    free(p->map_layer);
    free(p->encode_layer);
    free(p->mask_str);
    free(p->mean);
    free(p->std);
    free(p->bounds);
    free(p->voffsets);
    free(p->vints);
    free(p->vbytes);
    free(p->slots);
    EVP_MAC_free(p->mac);
    free(p);
}

size_t nn_prep_in_row(const NnPrep *p)
{
    return p->s.row;
}

size_t nn_prep_out_row(const NnPrep *p)
{
    return p->out_row;
}

int nn_prep_strings(const NnPrep *p)
{
    return p->s.strings;
}

const char *nn_prep_layer(const NnPrep *p)
{
    return p->s.map != NN_PREP_IDENTITY ? p->map_layer : p->encode_layer;
}

static const char *dtype_name(NnDtype t)
{
    static const char *const names[] = {"float32", "uint8", "int32", "int64", "strings", "strings"};
    return (unsigned)t < sizeof names / sizeof *names ? names[t] : "an unknown type";
}

int nn_prep_check(const NnPrep *p, const NnArray *a, SgError *err)
{
    const int str = a->dtype == NN_STR32 || a->dtype == NN_STR64;
    const int ints = a->dtype == NN_I32 || a->dtype == NN_I64;
    const char *name = nn_prep_layer(p);
    if (p->s.map == NN_PREP_HASH && (str || ints))
        ; /* Hashing takes strings and integers alike */
    else if (p->s.strings && !str)
        return sg_fail(err, SG_EINVAL, "%s takes a string column, not %s", name,
                       dtype_name(a->dtype));
    else if (!p->s.strings && str)
        return sg_fail(err, SG_EINVAL,
                       "%s takes numbers, not strings (a string column goes through a "
                       "StringLookup or Hashing layer)",
                       name);
    const int floats = p->s.map == NN_PREP_NORMALIZE || p->s.map == NN_PREP_DISCRETIZE;
    if (!p->s.strings && floats && a->dtype != NN_F32)
        return sg_fail(err, SG_EINVAL, "%s takes float32 values, not %s", name,
                       dtype_name(a->dtype));
    if (!p->s.strings && !floats && !ints && !str)
        return sg_fail(err, SG_EINVAL, "%s takes int32 or int64 values, not %s", name,
                       dtype_name(a->dtype));
    if (a->row != p->s.row)
        return sg_fail(err, SG_EINVAL, "%s: rows have %zu values, the layer takes %zu", name,
                       a->row, p->s.row);
    if (str && a->offsets == NULL)
        return sg_fail(err, SG_EINVAL, "%s: a string column without offsets", name);
    return 0;
}

/* ---- mapping ---------------------------------------------------------- */

/* One raw value: its bytes (strings), or its integer or float. */
typedef struct Value {
    const char *s;
    size_t len;
    int64_t i;
    float f;
} Value;

/* Value k of a (k = row * a->row + column); SG_EINVAL for string offsets
 * outside the bytes. */
static int value_at(const NnArray *a, size_t k, Value *v, SgError *err)
{
    switch (a->dtype) {
    case NN_F32:
        v->f = ((const float *)a->data)[k];
        return 0;
    case NN_I32:
        v->i = ((const int32_t *)a->data)[k];
        return 0;
    case NN_I64:
        v->i = ((const int64_t *)a->data)[k];
        return 0;
    default:
        break;
    }
    int64_t lo, hi;
    if (a->dtype == NN_STR32) {
        lo = ((const int32_t *)a->offsets)[k];
        hi = ((const int32_t *)a->offsets)[k + 1];
    } else {
        lo = ((const int64_t *)a->offsets)[k];
        hi = ((const int64_t *)a->offsets)[k + 1];
    }
    if (lo < 0 || hi < lo || (uint64_t)hi > a->nbytes)
        return sg_fail(err, SG_EINVAL, "string offsets %" PRId64 "..%" PRId64 " outside %zu bytes",
                       lo, hi, a->nbytes);
    v->s = (const char *)a->data + lo;
    v->len = (size_t)(hi - lo);
    return 0;
}

/* The bucket of v among n by the chain's hash: of its bytes, or of its
 * decimal string for an integer. */
static int hash_bucket(const NnPrep *p, EVP_MAC_CTX *mac, const Value *v, int is_str, int64_t n,
                       int64_t *out, SgError *err)
{
    char dec[24];
    const char *s = v->s;
    size_t len = v->len;
    if (!is_str) {
        len = (size_t)snprintf(dec, sizeof dec, "%" PRId64, v->i);
        s = dec;
    }
    uint64_t h;
    if (p->s.salted) {
        int rc = siphash_run(mac, s, len, &h, err);
        if (rc < 0)
            return rc;
    } else {
        h = farmhash_fingerprint64(s, len);
    }
    *out = (int64_t)(h % (uint64_t)n);
    return 0;
}

static int is_mask(const NnPrep *p, const Value *v, int is_str)
{
    if (!p->s.has_mask)
        return 0;
    if (is_str)
        return v->len == p->s.mask_len && (v->len == 0 || memcmp(v->s, p->mask_str, v->len) == 0);
    return v->i == p->s.mask_int;
}

/* A value in a message: 'text' or the integer. */
static const char *value_text(char *buf, size_t size, const Value *v, int is_str)
{
    if (is_str)
        snprintf(buf, size, "'%.*s'%s", (int)(v->len > 60 ? 60 : v->len), v->s,
                 v->len > 60 ? "..." : "");
    else
        snprintf(buf, size, "%" PRId64, v->i);
    return buf;
}

/* The id of value v (mask_id, possibly < 0, for the mask token). */
static int value_id(const NnPrep *p, EVP_MAC_CTX *mac, const Value *v, int is_str, int64_t r,
                    size_t j, int64_t *id, SgError *err)
{
    char vt[80];
    switch (p->s.map) {
    case NN_PREP_IDENTITY:
        *id = v->i;
        return 0;
    case NN_PREP_DISCRETIZE: {
        if (isnan(v->f))
            return sg_fail(err, SG_EINVAL, "%s: value NaN of row %lld (column %zu) has no bin",
                           p->map_layer, (long long)r, j);
        size_t lo = 0, hi = p->s.nbounds; /* the boundaries <= x: bins are [b[i-1], b[i]) */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (p->bounds[mid] <= v->f)
                lo = mid + 1;
            else
                hi = mid;
        }
        *id = (int64_t)lo;
        return 0;
    }
    case NN_PREP_HASH: {
        const int masked = p->s.has_mask;
        if (masked && is_mask(p, v, is_str)) {
            *id = 0;
            return 0;
        }
        int rc =
            hash_bucket(p, mac, v, is_str, masked ? p->s.num_bins - 1 : p->s.num_bins, id, err);
        *id += masked;
        return rc;
    }
    case NN_PREP_LOOKUP: {
        if (is_mask(p, v, is_str)) {
            *id = p->s.mask_id;
            return 0;
        }
        const int64_t k = table_probe((NnPrep *)p, v->s, v->len, v->i, -1);
        if (k >= 0) {
            *id = p->s.first + k;
            return 0;
        }
        if (p->s.num_oov == 0)
            return sg_fail(err, SG_EINVAL,
                           "%s: value %s of row %lld (column %zu) is not in the vocabulary and "
                           "num_oov_indices=0",
                           p->map_layer, value_text(vt, sizeof vt, v, is_str), (long long)r, j);
        int64_t b = 0;
        if (p->s.num_oov > 1 && !is_str && p->s.oov_floormod) {
            b = v->i % p->s.num_oov;
            b += b < 0 ? p->s.num_oov : 0;
        } else if (p->s.num_oov > 1) {
            int rc = hash_bucket(p, mac, v, is_str, p->s.num_oov, &b, err);
            if (rc < 0)
                return rc;
        }
        *id = p->s.oov_start + b;
        return 0;
    }
    default:
        return sg_fail(err, SG_EINVAL, "%s: unknown map %d", p->map_layer, (int)p->s.map);
    }
}

/* Row r of a into dst [out_row]. */
static int map_row(const NnPrep *p, EVP_MAC_CTX *mac, const NnArray *a, int64_t r, float *dst,
                   SgError *err)
{
    const size_t row = p->s.row, T = (size_t)p->s.num_tokens;
    const int is_str = a->dtype == NN_STR32 || a->dtype == NN_STR64;
    if (p->s.encode != NN_ENCODE_NONE)
        memset(dst, 0, p->out_row * sizeof(float));
    for (size_t j = 0; j < row; j++) {
        Value v = {0};
        int64_t id = 0;
        int rc = value_at(a, (size_t)r * row + j, &v, err);
        if (rc < 0)
            return sg_context(err, "%s: row %lld (column %zu): ", nn_prep_layer(p), (long long)r,
                              j);
        if (p->s.map == NN_PREP_NORMALIZE) {
            /* float32 in Keras' order: (x - mean) / max(sqrt(var), eps) */
            dst[j] = (v.f - p->mean[j]) / p->std[j];
            continue;
        }
        if ((rc = value_id(p, mac, &v, is_str, r, j, &id, err)) < 0)
            return rc;
        if (p->s.encode == NN_ENCODE_NONE) {
            dst[j] = (float)id;
            continue;
        }
        if (id < 0 && id == p->s.mask_id && p->s.has_mask)
            continue; /* a mask token is dropped from an encoding, as Keras' bincount drops it */
        if (id < 0 || (uint64_t)id >= T) {
            char vt[80];
            return sg_fail(err, SG_EINVAL,
                           "%s: value %s of row %lld (column %zu) gives id %" PRId64
                           ", outside [0, num_tokens=%zu)",
                           p->encode_layer, value_text(vt, sizeof vt, &v, is_str), (long long)r, j,
                           id, T);
        }
        switch (p->s.encode) {
        case NN_ENCODE_ONE_HOT:
            dst[(row == 1 ? 0 : j * T) + (size_t)id] = 1.0f;
            break;
        case NN_ENCODE_MULTI_HOT:
            dst[id] = 1.0f;
            break;
        default:
            dst[id] += 1.0f;
        }
    }
    return 0;
}

int nn_prep_rows(const NnPrep *p, const NnArray *a, const int64_t *order, size_t start, int B,
                 float *dst, SgError *err)
{
    EVP_MAC_CTX *mac = NULL;
    if (p->s.salted && (mac = siphash_ctx(p->mac, p->s.salt, err)) == NULL)
        return err->code;
    int rc = 0;
    for (int b = 0; b < B && rc == 0; b++) {
        const int64_t r = order ? order[start + b] : (int64_t)(start + b);
        rc = map_row(p, mac, a, r, dst + (size_t)b * p->out_row, err);
    }
    EVP_MAC_CTX_free(mac);
    return rc;
}
