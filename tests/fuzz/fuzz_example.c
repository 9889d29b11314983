/* fuzz_example.c - libFuzzer harness for tf.train.Example decoding: the input
 * is walked as an Example (every feature decoded and copied out), as a
 * SequenceExample, parsed with a schema holding every feature kind, and its
 * feature lists parsed as FixedLenSequence / VarLen lists. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "record/example.h"
#include "record/example_parse.h"
#include "record/sequence_parse.h"

static const uint8_t *g_base;

static int copy_values(void *ctx, const ExEntry *e, SgError *err)
{
    (void)ctx;
    ExFeature f;
    int rc = ex_feature_decode(g_base, e->value, e->value_len, &f, err);
    if (rc < 0)
        return rc;
    if (f.count == 0)
        return 0;
    void *vals = malloc(f.count * 16);
    if (vals == NULL)
        return 0;
    if (f.kind == EX_INT64)
        ex_values_int64(&f, vals);
    else if (f.kind == EX_FLOAT)
        ex_values_float(&f, vals);
    else if (f.kind == EX_BYTES) {
        const uint8_t **ptrs = vals;
        size_t *lens = malloc(f.count * sizeof *lens);
        if (lens != NULL) {
            ex_values_bytes(&f, ptrs, lens);
            for (size_t i = 0; i < f.count; i++)
                if (lens[i] > 0 && (ptrs[i][0] == 0xfe && ptrs[i][lens[i] - 1] == 0xfe))
                    lens[0] = 0; /* read the first and last byte of each value */
            free(lens);
        }
    }
    free(vals);
    return 0;
}

static int list_cb(void *ctx, const ExEntry *e, SgError *err)
{
    return ex_feature_list_foreach(g_base, e->value, e->value_len, copy_values, ctx, err);
}

static char n_i[] = "i", n_f[] = "f", n_b[] = "b", n_v[] = "v", n_w[] = "w", n_r[] = "r";

/* What a SeqBatch promises after any add, kept or rolled back: every
 * record's steps and every step's values are accounted for, and a bytes
 * list's arena holds exactly its values. */
static void check_sequence_batch(const SeqBatch *b)
{
    for (size_t j = 0; j < b->lists->n; j++) {
        const SeqColumn *c = &b->cols[j];
        if ((size_t)c->row_splits[b->rows] != c->nsteps ||
            (size_t)c->step_splits[c->nsteps] != c->v.nvalues)
            abort();
        if (b->lists->specs[j].out == EX_DT_BYTES &&
            c->v.arena_len != (c->v.nvalues ? c->v.ends[c->v.nvalues - 1] : 0))
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    SgError err;
    g_base = data;
    ex_example_foreach(data, size, copy_values, NULL, &err);
    ex_sequence_foreach(data, size, copy_values, list_cb, NULL, &err);

    int64_t dflt_i[2] = {1, 2};
    ExSpec specs[6] = {
        {.name = n_i,
         .name_len = 1,
         .kind = EX_SPEC_FIXED,
         .wire = EX_INT64,
         .out = EX_DT_INT64,
         .count = 2,
         .has_default = 1,
         .defaults = dflt_i},
        {.name = n_f,
         .name_len = 1,
         .kind = EX_SPEC_FIXED,
         .wire = EX_FLOAT,
         .out = EX_DT_FLOAT32,
         .count = 1},
        {.name = n_b,
         .name_len = 1,
         .kind = EX_SPEC_FIXED,
         .wire = EX_BYTES,
         .out = EX_DT_BYTES,
         .count = 1},
        {.name = n_v, .name_len = 1, .kind = EX_SPEC_VARLEN, .wire = EX_INT64, .out = EX_DT_INT64},
        {.name = n_w, .name_len = 1, .kind = EX_SPEC_VARLEN, .wire = EX_BYTES, .out = EX_DT_BYTES},
        {.name = n_r,
         .name_len = 1,
         .kind = EX_SPEC_RAW,
         .wire = EX_BYTES,
         .out = EX_DT_FLOAT32,
         .count = 4,
         .raw_src = EX_DT_UINT8,
         .scale = 0.5f},
    };
    ExSchema schema = {6, specs};
    ExBatch batch;
    if (ex_batch_init(&batch, &schema, 2, &err) == 0) {
        ex_batch_add(&batch, data, size, &err);
        ex_batch_add(&batch, data, size, &err);
        ex_batch_free(&batch);
    }
    /* feature lists "s" (2 int64 per step), "t" (bytes, 1 per step, may be
     * missing), "v" (VarLen int64), "w" (VarLen bytes) */
    static char n_s[] = "s", n_t[] = "t";
    ExSpec lists[4] = {
        {.name = n_s,
         .name_len = 1,
         .kind = EX_SPEC_FIXED,
         .wire = EX_INT64,
         .out = EX_DT_INT64,
         .count = 2},
        {.name = n_t,
         .name_len = 1,
         .kind = EX_SPEC_FIXED,
         .wire = EX_BYTES,
         .out = EX_DT_BYTES,
         .count = 1},
        {.name = n_v, .name_len = 1, .kind = EX_SPEC_VARLEN, .wire = EX_INT64, .out = EX_DT_INT64},
        {.name = n_w, .name_len = 1, .kind = EX_SPEC_VARLEN, .wire = EX_BYTES, .out = EX_DT_BYTES},
    };
    int allow[4] = {1, 1, 0, 0};
    SeqBatch seq;
    /* all four lists, then "s" alone and required (the missing-list error) */
    static const int allow_none[1] = {0};
    const ExSchema list_schemas[2] = {{4, lists}, {1, lists}};
    const int *allows[2] = {allow, allow_none};
    for (int k = 0; k < 2; k++) {
        if (seq_batch_init(&seq, &list_schemas[k], allows[k], 2, &err) != 0)
            continue;
        for (int rep = 0; rep < 2; rep++) {
            seq_batch_add(&seq, data, size, &err);
            check_sequence_batch(&seq); /* added or refused, the columns stay consistent */
        }
        seq_batch_free(&seq);
    }
    return 0;
}
