/*
 * table.h - one Arrow record batch -> an owned chunk of planned columns.
 *
 * A plan names each column by a dotted path through structs ("a.b") and
 * says how its nulls are met. tbl_chunk_from_arrow validates what the plan
 * reads (formats, buffer counts, lengths, offsets, validity bitmaps), then
 * converts each column into memory the chunk owns, so the Arrow batch can
 * be released at once:
 *
 *   numbers (int8..uint64, float16/32/64, bool)   float32 [rows, 1]
 *   fixed_size_list<number>                         float32 [rows, size]
 *   list / large_list<number>                       float32 [rows, width] padded,
 *                                                   int32 lengths [rows]
 *   binary / large_binary / fixed_size_binary       float32 [rows, width], one per byte
 *   string / large_string                           int64 offsets [rows + 1] + bytes
 *   Spark ML vector (struct<type:int8, size:int32,  float32 [rows, size], dense
 *     indices:list<int32>, values:list<double>>)
 *
 * and, where the plan asks (ids for embeddings and lookups), integers and
 * lists of them as exact int64 in place of float32.
 *
 * A binary column whose rows all stay, each of the plan's width, is not
 * copied when the caller lends the batch (a TblRelease): the chunk keeps
 * the batch's ArrowArray (moved out of the caller's struct) and points at
 * its value buffer, and when the chunk is freed the array goes to the
 * TblRelease, whose owner releases it where the producer allows (pyarrow's
 * buffers can hold Python objects: with the GIL).
 *
 * Not here: dictionary-encoded columns (refused with their name), lists of
 * lists, maps, dates, decimals; reading files (the Python side does that).
 */
#ifndef SG_TABLE_H
#define SG_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"
#include "table/arrow_c.h"
#include "table/pool.h"

typedef enum TblNulls {
    TBL_NULLS_ERROR = 0, /* a null fails the chunk, naming column, file, row group and row */
    TBL_NULLS_FILL = 1,  /* a null value (or list element) becomes `fill`; a null string "" */
    TBL_NULLS_SKIP = 2,  /* a row with a null here is dropped from every column */
} TblNulls;

/* The most float32 values a row may have (a vector's size, a binary value's
 * bytes): a bound checked before a size read from the data is allocated. */
#define TBL_MAX_WIDTH ((size_t)1 << 24)

typedef enum TblOut {
    TBL_OUT_UNSET = 0, /* not yet seen: the first chunk sets it */
    TBL_OUT_F32 = 1,
    TBL_OUT_STR = 2,
    TBL_OUT_I64 = 3, /* integer columns read as exact ids (TblPlan.ints) */
} TblOut;

/* One planned column. `width`, `out` and `lengths` are filled in by the
 * first chunk converted when left 0, and every later chunk must agree. */
typedef struct TblPlan {
    const char *name; /* dotted path through structs */
    size_t width;     /* float32 values per row; 0: from the data */
    int truncate;     /* cut lists longer than width instead of failing */
    TblNulls nulls;
    float fill; /* TBL_NULLS_FILL: a null's value */
    float pad;  /* the values after a short list's end */
    int ints;   /* integers (and lists of them) as exact int64 instead of float32 */
    TblOut out;
    int lengths; /* 1: a variable-length list, with lengths per row */
} TblPlan;

typedef struct TblColumn {
    TblOut out;
    size_t width;     /* F32: values per row */
    int u8;           /* F32 kept as bytes (a chunk of binary values): in `bytes`, not `values` */
    int borrowed;     /* u8: `bytes` points into the chunk's held batch, not a buffer of its own */
    float *values;    /* F32: [rows, width] */
    int64_t *ints;    /* I64: [rows, width] */
    int32_t *lengths; /* [rows] for variable-length lists, else NULL */
    int64_t *offsets; /* STR: [rows + 1], offsets[0] == 0 */
    uint8_t *bytes;   /* STR: [offsets[rows]] UTF-8; u8: [rows, width] */
} TblColumn;

typedef struct TblRelease TblRelease;

typedef struct TblChunk {
    TblPool *pool;          /* where its buffers go back (NULL: malloc'ed, e.g. a batch) */
    struct ArrowArray held; /* the batch a borrowed column points into (release != NULL) */
    TblRelease *release_to; /* where `held` goes when the chunk is freed */
    size_t rows;            /* kept rows (after TBL_NULLS_SKIP) */
    size_t pending;         /* rows not yet gathered into a batch (the batcher's count) */
    size_t ncols;
    TblColumn cols[]; /* [ncols], in plan order */
} TblChunk;

/* Where a batch came from, for messages. `first_row` is the row number
 * (within the row group) of the batch's row 0. */
typedef struct TblWhere {
    const char *file;
    long long row_group;
    long long first_row;
} TblWhere;

/* The batches that chunks borrowed from, queued as the chunks are freed
 * (from any thread) until the owner releases them (tbl_release_drain, where
 * releasing is allowed). Thread-safe. */
int tbl_release_new(TblRelease **out, SgError *err);
void tbl_release_drain(TblRelease *r);
/* Drains, then frees. Every chunk that borrowed through it is freed first. */
void tbl_release_free(TblRelease *r);

/* Validates `array` (described by `schema`, a struct: the record batch) as
 * far as the plans read it and converts the planned columns into a new
 * chunk (*out, freed with tbl_chunk_free) whose buffers come from pool (may
 * be NULL). Fills plans' unset width / out /
 * lengths. With `lend` (may be NULL: every column is copied), a chunk that
 * borrows a column takes the array: *array is moved into the chunk (its
 * release set to NULL), and goes to `lend` when the chunk is freed; else
 * the Arrow structs stay the caller's. Never takes the schema. Errors: SG_ESCHEMA
 * (missing column, with the batch's columns; unsupported type; a null under
 * TBL_NULLS_ERROR; a row that does not fit the width), SG_ECORRUPT (a
 * malformed array), SG_ENOMEM. Messages name the column and, from `where`,
 * the file, row group and row. */
int tbl_chunk_from_arrow(TblChunk **out, const struct ArrowSchema *schema, struct ArrowArray *array,
                         TblPlan *plans, size_t nplans, const TblWhere *where, TblPool *pool,
                         TblRelease *lend, SgError *err);

void tbl_chunk_free(TblChunk *chunk);

#endif /* SG_TABLE_H */
