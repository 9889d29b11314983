/*
 * example_parse.c - schema-driven Example parsing into batch columns.
 */
#include "record/example_parse.h"

#include "record/bufpool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ExSlot {
    const uint8_t *value; /* Feature body of the last entry with this key */
    size_t value_len;
    int seen;
    size_t nvalues, arena_len; /* column sizes before the record, for rollback */
} ExSlot;

size_t ex_dtype_size(ExDtype t)
{
    switch (t) {
    case EX_DT_INT64:
        return 8;
    case EX_DT_FLOAT32:
        return 4;
    case EX_DT_UINT8:
        return 1;
    default:
        return 0;
    }
}

void ex_schema_free(ExSchema *s)
{
    if (s == NULL || s->specs == NULL)
        return;
    for (size_t i = 0; i < s->n; i++) {
        ExSpec *sp = &s->specs[i];
        free(sp->name);
        free(sp->defaults);
        if (sp->default_bytes)
            for (size_t j = 0; j < sp->count; j++)
                free(sp->default_bytes[j]);
        free(sp->default_bytes);
        free(sp->default_lens);
    }
    free(s->specs);
    s->specs = NULL;
    s->n = 0;
}

static int column_alloc(ExColumn *c, const ExSpec *sp, size_t cap, SgError *err)
{
    if (sp->kind != EX_SPEC_VARLEN && sp->out != EX_DT_BYTES && c->data == NULL) {
        size_t bytes = cap * sp->count * ex_dtype_size(sp->out);
        c->data = bufpool_get(bytes);
        if (c->data == NULL)
            return sg_fail(err, SG_ENOMEM, "out of memory for feature '%s' (%zu bytes)", sp->name,
                           bytes);
    }
    if (sp->kind == EX_SPEC_VARLEN && c->row_splits == NULL) {
        c->row_splits = malloc((cap + 1) * sizeof *c->row_splits);
        if (c->row_splits == NULL)
            return sg_fail(err, SG_ENOMEM, "out of memory for feature '%s'", sp->name);
        c->row_splits[0] = 0;
    }
    return 0;
}

int ex_batch_init(ExBatch *b, const ExSchema *schema, size_t cap, SgError *err)
{
    memset(b, 0, sizeof *b);
    b->schema = schema;
    b->cap = cap;
    b->cols = calloc(schema->n ? schema->n : 1, sizeof *b->cols);
    b->slots = calloc(schema->n ? schema->n : 1, sizeof *b->slots);
    if (b->cols == NULL || b->slots == NULL) {
        ex_batch_free(b);
        return sg_fail(err, SG_ENOMEM, "out of memory for a batch of %zu", cap);
    }
    for (size_t i = 0; i < schema->n; i++) {
        int rc = column_alloc(&b->cols[i], &schema->specs[i], cap, err);
        if (rc < 0) {
            ex_batch_free(b);
            return rc;
        }
    }
    return 0;
}

int ex_batch_reset(ExBatch *b, SgError *err)
{
    b->rows = 0;
    for (size_t i = 0; i < b->schema->n; i++) {
        ExColumn *c = &b->cols[i];
        c->v.nvalues = 0;
        c->v.arena_len = 0;
        int rc = column_alloc(c, &b->schema->specs[i], b->cap, err);
        if (rc < 0)
            return rc;
        if (c->row_splits)
            c->row_splits[0] = 0;
    }
    return 0;
}

void ex_batch_free(ExBatch *b)
{
    if (b->cols)
        for (size_t i = 0; i < b->schema->n; i++) {
            ExColumn *c = &b->cols[i];
            bufpool_put(c->data);
            ex_values_free(&c->v);
            free(c->row_splits);
        }
    free(b->cols);
    free(b->slots);
    b->cols = NULL;
    b->slots = NULL;
}

ptrdiff_t ex_schema_find(const ExSchema *s, const uint8_t *key, size_t key_len)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->specs[i].name_len == key_len && memcmp(s->specs[i].name, key, key_len) == 0)
            return (ptrdiff_t)i;
    return -1;
}

/* ---- variable-size outputs ---- */

int ex_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap && *p != NULL)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (q == NULL)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

int ex_values_append_bytes(ExValues *v, const ExSpec *sp, const uint8_t *d, size_t len,
                           SgError *err)
{
    size_t vcap = v->values_cap;
    if (ex_grow((void **)&v->ends, &vcap, v->nvalues + 1, sizeof *v->ends) < 0 ||
        ex_grow((void **)&v->arena, &v->arena_cap, v->arena_len + len, 1) < 0)
        return sg_fail(err, SG_ENOMEM, "out of memory for bytes of feature '%s'", sp->name);
    v->values_cap = vcap;
    memcpy(v->arena + v->arena_len, d, len);
    v->arena_len += len;
    v->ends[v->nvalues++] = v->arena_len;
    return 0;
}

int ex_values_append(ExValues *v, const ExSpec *sp, const ExFeature *f, SgError *err)
{
    if (f->count == 0)
        return 0;
    if (sp->wire == EX_BYTES) {
        const uint8_t **ptrs = malloc(f->count * sizeof *ptrs);
        size_t *lens = malloc(f->count * sizeof *lens);
        int rc = 0;
        if (ptrs == NULL || lens == NULL)
            rc = sg_fail(err, SG_ENOMEM, "out of memory for feature '%s'", sp->name);
        else
            ex_values_bytes(f, ptrs, lens);
        for (size_t k = 0; k < f->count && rc == 0; k++)
            rc = ex_values_append_bytes(v, sp, ptrs[k], lens[k], err);
        free(ptrs);
        free(lens);
        return rc;
    }
    size_t el = ex_dtype_size(sp->out);
    if (ex_grow(&v->values, &v->values_cap, v->nvalues + f->count, el) < 0)
        return sg_fail(err, SG_ENOMEM, "out of memory for feature '%s'", sp->name);
    void *dst = (uint8_t *)v->values + v->nvalues * el;
    if (sp->wire == EX_INT64)
        ex_values_int64(f, dst);
    else
        ex_values_float(f, dst);
    v->nvalues += f->count;
    return 0;
}

void ex_values_free(ExValues *v)
{
    free(v->values);
    free(v->arena);
    free(v->ends);
    v->values = NULL;
    v->arena = NULL;
    v->ends = NULL;
}

/* ---- one record ---- */

typedef struct RowCtx {
    ExBatch *b;
    size_t row;
    ExSlot *slots;
} RowCtx;

static int entry_cb(void *ctx, const ExEntry *e, SgError *err)
{
    RowCtx *rc = ctx;
    (void)err;
    ptrdiff_t i = ex_schema_find(rc->b->schema, e->key, e->key_len);
    if (i >= 0) {
        rc->slots[i].value = e->value;
        rc->slots[i].value_len = e->value_len;
        rc->slots[i].seen = 1;
    }
    return 0;
}

static int mismatch(const ExSpec *sp, const ExFeature *f, SgError *err)
{
    char want[96];
    if (sp->kind == EX_SPEC_VARLEN)
        snprintf(want, sizeof want, "a %s list", ex_kind_name(sp->wire));
    else if (sp->kind == EX_SPEC_RAW)
        snprintf(want, sizeof want, "1 bytes value (raw data)");
    else
        snprintf(want, sizeof want, "%zu %s value%s", sp->count, ex_kind_name(sp->wire),
                 sp->count == 1 ? "" : "s");
    return sg_fail(err, SG_ESCHEMA, "feature '%s': expected %s, found %zu %s value%s", sp->name,
                   want, f->count, ex_kind_name(f->kind), f->count == 1 ? "" : "s");
}

static int fill_default(ExBatch *b, size_t row, size_t i, SgError *err)
{
    const ExSpec *sp = &b->schema->specs[i];
    ExColumn *c = &b->cols[i];
    if (sp->kind == EX_SPEC_VARLEN) {
        c->row_splits[row + 1] = (int64_t)c->v.nvalues;
        return 0;
    }
    if (!sp->has_default)
        return sg_fail(err, SG_ESCHEMA,
                       "feature '%s': required (%zu %s value%s, no default) but missing", sp->name,
                       sp->count, ex_kind_name(sp->wire), sp->count == 1 ? "" : "s");
    if (sp->out == EX_DT_BYTES) {
        for (size_t j = 0; j < sp->count; j++) {
            int rc =
                ex_values_append_bytes(&c->v, sp, sp->default_bytes[j], sp->default_lens[j], err);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    size_t sz = sp->count * ex_dtype_size(sp->out);
    memcpy((uint8_t *)c->data + row * sz, sp->defaults, sz);
    return 0;
}

/* uint8 -> float32 * scale, the hot loop of image decoding: compiled for
 * AVX2 and for the baseline, picked at load time (GCC target_clones). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void
u8_to_f32(float *restrict o, const uint8_t *restrict src, size_t n, float scale)
{
    for (size_t k = 0; k < n; k++)
        o[k] = (float)src[k] * scale;
}

static void raw_convert(const ExSpec *sp, const uint8_t *src, void *dst)
{
    size_t n = sp->count;
    if (sp->raw_src == EX_DT_UINT8 && sp->out == EX_DT_UINT8) {
        memcpy(dst, src, n);
    } else if (sp->raw_src == EX_DT_UINT8) {
        u8_to_f32(dst, src, n, sp->scale);
    } else {
        float *o = dst, scale = sp->scale;
        memcpy(o, src, 4 * n);
        if (scale != 1.0f)
            for (size_t k = 0; k < n; k++)
                o[k] *= scale;
    }
}

static int fill_feature(ExBatch *b, size_t row, ExSlot *slots, size_t i, const uint8_t *rec,
                        SgError *err)
{
    const ExSpec *sp = &b->schema->specs[i];
    ExColumn *c = &b->cols[i];
    ExFeature f;
    int rc = ex_feature_decode(rec, slots[i].value, slots[i].value_len, &f, err);
    if (rc < 0)
        return sg_context(err, "feature '%s': ", sp->name);
    /* A Feature without a list counts as missing (as in TF's parse_example). */
    if (f.kind == EX_NONE && sp->kind != EX_SPEC_VARLEN)
        return fill_default(b, row, i, err);
    if (f.kind != EX_NONE && f.kind != sp->wire)
        return mismatch(sp, &f, err);
    if (sp->kind == EX_SPEC_VARLEN) {
        if ((rc = ex_values_append(&c->v, sp, &f, err)) < 0)
            return rc;
        c->row_splits[row + 1] = (int64_t)c->v.nvalues;
        return 0;
    }
    if (sp->kind == EX_SPEC_RAW) {
        if (f.count != 1 || f.kind != EX_BYTES)
            return mismatch(sp, &f, err);
        const uint8_t *d;
        size_t len;
        ex_values_bytes(&f, &d, &len);
        size_t want = sp->count * ex_dtype_size(sp->raw_src);
        if (len != want)
            return sg_fail(err, SG_ESCHEMA,
                           "feature '%s': expected %zu raw bytes (%zu %s values), found %zu bytes",
                           sp->name, want, sp->count,
                           sp->raw_src == EX_DT_UINT8 ? "uint8" : "float32", len);
        raw_convert(sp, d, (uint8_t *)c->data + row * sp->count * ex_dtype_size(sp->out));
        return 0;
    }
    /* FIXED */
    if (f.count != sp->count)
        return mismatch(sp, &f, err);
    if (sp->wire == EX_INT64) {
        ex_values_int64(&f, (int64_t *)c->data + row * sp->count);
    } else if (sp->wire == EX_FLOAT) {
        ex_values_float(&f, (float *)c->data + row * sp->count);
    } else if ((rc = ex_values_append(&c->v, sp, &f, err)) < 0) {
        return rc;
    }
    return 0;
}

/* Parses rec into `row`; a failing record leaves no partial values behind
 * in the growable (VARLEN, bytes) columns. */
static int parse_row(ExBatch *b, size_t row, ExSlot *slots, const uint8_t *rec, size_t n,
                     SgError *err)
{
    const ExSchema *s = b->schema;
    for (size_t i = 0; i < s->n; i++)
        slots[i].seen = 0;
    RowCtx ctx = {b, row, slots};
    int rc = ex_example_foreach(rec, n, entry_cb, &ctx, err);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < s->n; i++) {
        slots[i].nvalues = b->cols[i].v.nvalues;
        slots[i].arena_len = b->cols[i].v.arena_len;
    }
    for (size_t i = 0; i < s->n; i++) {
        rc =
            slots[i].seen ? fill_feature(b, row, slots, i, rec, err) : fill_default(b, row, i, err);
        if (rc < 0) {
            for (size_t j = 0; j < s->n; j++) {
                b->cols[j].v.nvalues = slots[j].nvalues;
                b->cols[j].v.arena_len = slots[j].arena_len;
            }
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

int ex_batch_add(ExBatch *b, const uint8_t *rec, size_t n, SgError *err)
{
    if (b->rows >= b->cap)
        return sg_fail(err, SG_ESTATE, "batch is full (%zu rows)", b->cap);
    int rc = parse_row(b, b->rows, b->slots, rec, n, err);
    if (rc < 0)
        return rc;
    b->rows++;
    return 0;
}
