/*
 * example_parse.h - schema-driven parsing of tf.train.Example records into
 * batched columns, with TensorFlow's parse_example semantics:
 *
 *   FIXED   a list of exactly `count` values of one kind (bytes, float,
 *           int64) per record; missing -> the default, or an error without one.
 *   VARLEN  any number of values per record -> values + row_splits.
 *   RAW     a bytes feature holding exactly `count` little-endian values of
 *           raw_src (uint8 or float32), converted to out (uint8 or float32)
 *           and multiplied by scale (image_raw -> float32[784] * 1/255).
 *
 * Duplicate keys: the last one wins. Errors are SG_ESCHEMA naming the feature,
 * what was expected and what was found, or SG_EPROTOBUF for broken bytes;
 * callers prepend the file, record index and byte offset.
 */
#ifndef SG_EXAMPLE_PARSE_H
#define SG_EXAMPLE_PARSE_H

#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"
#include "record/example.h"

typedef enum ExSpecKind { EX_SPEC_FIXED = 0, EX_SPEC_VARLEN = 1, EX_SPEC_RAW = 2 } ExSpecKind;

/* Element types of outputs. */
typedef enum ExDtype {
    EX_DT_INT64 = 0,
    EX_DT_FLOAT32 = 1,
    EX_DT_UINT8 = 2,
    EX_DT_BYTES = 3
} ExDtype;

typedef struct ExSpec {
    char *name;
    size_t name_len;
    ExSpecKind kind;
    ExKind wire;  /* the list kind the Example must carry */
    ExDtype out;  /* element type of the output */
    size_t count; /* FIXED / RAW: values per record */
    int has_default;
    void *defaults;          /* FIXED int64/float: count values */
    uint8_t **default_bytes; /* FIXED bytes: count values */
    size_t *default_lens;
    ExDtype raw_src; /* RAW: EX_DT_UINT8 or EX_DT_FLOAT32 */
    float scale;     /* RAW */
} ExSpec;

typedef struct ExSchema {
    size_t n;
    ExSpec *specs;
} ExSchema;

void ex_schema_free(ExSchema *s);
size_t ex_dtype_size(ExDtype t);

/* The spec named key (the first, as schemas have unique names), or -1. */
ptrdiff_t ex_schema_find(const ExSchema *s, const uint8_t *key, size_t key_len);

/* Grows *p to hold `need` elements of `elem` bytes (doubling from 64);
 * -1 when out of memory, *p then unchanged. */
int ex_grow(void **p, size_t *cap, size_t need, size_t elem);

/* Values of one output concatenated over records (VARLEN lists, bytes, the
 * steps of feature lists): numbers of the output dtype, or bytes values in an
 * arena with each one's end offset (values_cap then counts ends). Every
 * pointer is malloc'ed and can be taken over (set to NULL) by whoever hands
 * it to NumPy. */
typedef struct ExValues {
    void *values;   /* numeric: nvalues elements */
    uint8_t *arena; /* bytes values, concatenated */
    uint64_t *ends; /* bytes values: end offset of each in arena */
    size_t nvalues, values_cap, arena_len, arena_cap;
} ExValues;

/* Appends every value of f, whose list kind is sp->wire (checked by the
 * caller), converted to sp->out. */
int ex_values_append(ExValues *v, const ExSpec *sp, const ExFeature *f, SgError *err);
/* Appends one bytes value. */
int ex_values_append_bytes(ExValues *v, const ExSpec *sp, const uint8_t *d, size_t len,
                           SgError *err);
void ex_values_free(ExValues *v);

/* One output column of a batch. */
typedef struct ExColumn {
    void *data;          /* FIXED numeric / RAW: rows * count elements (from bufpool_get) */
    ExValues v;          /* VARLEN and bytes outputs */
    int64_t *row_splits; /* VARLEN: rows + 1 */
} ExColumn;

typedef struct ExBatch {
    const ExSchema *schema;
    size_t rows, cap;
    ExColumn *cols;
    struct ExSlot *slots; /* per-record scratch */
} ExBatch;

int ex_batch_init(ExBatch *b, const ExSchema *schema, size_t cap, SgError *err);

/* Parses one record into row b->rows (rows must be < cap), then rows++. On
 * failure the batch is unchanged as far as rows is concerned. */
int ex_batch_add(ExBatch *b, const uint8_t *rec, size_t n, SgError *err);

/* Forgets the rows (keeps allocations, re-allocating what was taken). */
int ex_batch_reset(ExBatch *b, SgError *err);
void ex_batch_free(ExBatch *b);

#endif /* SG_EXAMPLE_PARSE_H */
