/*
 * test_table_arrow.c - the table reader on hand-built Arrow arrays: each
 * column kind converted, nulls under each policy, array offsets, malformed
 * arrays refused with the column named (never read out of bounds), and the
 * batcher's order (seeded, a permutation, the same however rows are cut
 * into chunks).
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "table/batcher.h"
#include "table/table.h"

typedef struct Col {
    struct ArrowSchema s;
    struct ArrowArray a;
    const void *bufs[3];
    struct ArrowSchema *schildren[4];
    struct ArrowArray *achildren[4];
} Col;

static void release_schema(struct ArrowSchema *s)
{
    s->release = NULL;
}

static void release_array(struct ArrowArray *a)
{
    a->release = NULL;
}

static void make(Col *c, const char *fmt, const char *name, int64_t length, int64_t nbuf,
                 const void *b0, const void *b1, const void *b2)
{
    memset(c, 0, sizeof *c);
    c->bufs[0] = b0;
    c->bufs[1] = b1;
    c->bufs[2] = b2;
    c->s = (struct ArrowSchema){.format = fmt,
                                .name = name,
                                .flags = ARROW_FLAG_NULLABLE,
                                .children = c->schildren,
                                .release = release_schema};
    c->a = (struct ArrowArray){.length = length,
                               .n_buffers = nbuf,
                               .buffers = c->bufs,
                               .children = c->achildren,
                               .release = release_array};
}

static void add_child(Col *parent, Col *child)
{
    parent->schildren[parent->s.n_children++] = &child->s;
    parent->achildren[parent->a.n_children++] = &child->a;
}

static int convert(TblChunk **out, Col *batch, TblPlan *plans, size_t n, SgError *err)
{
    TblWhere where = {"t.parquet", 2, 100};
    return tbl_chunk_from_arrow(out, &batch->s, &batch->a, plans, n, &where, NULL, NULL, err);
}

/* int32 with a null, list<float>, string, struct<v: double>, over 4 rows. */
static const int32_t ints[4] = {10, 20, 30, 40};
static const uint8_t valid_0101[1] = {0x0d}; /* rows 0, 2, 3 valid */
static const int32_t list_off[5] = {0, 2, 2, 5, 6};
static const float list_vals[6] = {1, 2, 3, 4, 5, 6};
static const int32_t str_off[5] = {0, 1, 3, 3, 6};
static const char str_data[] = "abbccc";
static const double dbl[4] = {0.5, 1.5, 2.5, 3.5};

typedef struct Fixture {
    Col batch, a, l, lv, s, st, v;
} Fixture;

static void fixture(Fixture *f)
{
    make(&f->batch, "+s", "", 4, 1, NULL, NULL, NULL);
    make(&f->a, "i", "a", 4, 2, valid_0101, ints, NULL);
    f->a.a.null_count = 1;
    make(&f->l, "+l", "l", 4, 2, NULL, list_off, NULL);
    make(&f->lv, "f", "item", 6, 2, NULL, list_vals, NULL);
    add_child(&f->l, &f->lv);
    make(&f->s, "u", "s", 4, 3, NULL, str_off, str_data);
    make(&f->st, "+s", "st", 4, 1, NULL, NULL, NULL);
    make(&f->v, "g", "v", 4, 2, NULL, dbl, NULL);
    add_child(&f->st, &f->v);
    add_child(&f->batch, &f->a);
    add_child(&f->batch, &f->l);
    add_child(&f->batch, &f->s);
    add_child(&f->batch, &f->st);
}

static void test_columns_and_nulls(void)
{
    Fixture f;
    fixture(&f);
    TblPlan plans[4] = {{.name = "a", .nulls = TBL_NULLS_FILL, .fill = -1},
                        {.name = "l", .width = 2, .pad = 9, .truncate = 1},
                        {.name = "s"},
                        {.name = "st.v"}};
    TblChunk *c = NULL;
    SgError err = {0};
    CHECK(convert(&c, &f.batch, plans, 4, &err) == 0);
    if (c == NULL)
        return;
    CHECK(c->rows == 4 && plans[0].width == 1 && plans[1].lengths == 1 &&
          plans[2].out == TBL_OUT_STR);
    const float want_a[4] = {10, -1, 30, 40}, want_l[8] = {1, 2, 9, 9, 3, 4, 6, 9},
                want_v[4] = {0.5, 1.5, 2.5, 3.5};
    const int32_t want_len[4] = {2, 0, 2, 1};
    const int64_t want_off[5] = {0, 1, 3, 3, 6};
    CHECK(memcmp(c->cols[0].values, want_a, sizeof want_a) == 0);
    CHECK(memcmp(c->cols[1].values, want_l, sizeof want_l) == 0);
    CHECK(memcmp(c->cols[1].lengths, want_len, sizeof want_len) == 0);
    CHECK(memcmp(c->cols[2].offsets, want_off, sizeof want_off) == 0 &&
          memcmp(c->cols[2].bytes, "abbccc", 6) == 0);
    CHECK(memcmp(c->cols[3].values, want_v, sizeof want_v) == 0);
    tbl_chunk_free(c);

    /* integers as exact int64 ids: the null filled, lists padded */
    TblPlan ids[2] = {{.name = "a", .nulls = TBL_NULLS_FILL, .fill = -1, .ints = 1},
                      {.name = "st.v", .ints = 1}};
    CHECK(convert(&c, &f.batch, ids, 1, &err) == 0);
    if (c != NULL) {
        const int64_t want_ids[4] = {10, -1, 30, 40};
        CHECK(c->cols[0].out == TBL_OUT_I64 &&
              memcmp(c->cols[0].ints, want_ids, sizeof want_ids) == 0);
        tbl_chunk_free(c);
    }
    CHECK(convert(&c, &f.batch, &ids[1], 1, &err) == SG_ESCHEMA && c == NULL);
    CHECK(strstr(err.msg, "column 'st.v' is read as int64 ids, but it holds no integers") != NULL);

    /* skip drops row 1 from every column; error names the file, row group and row */
    plans[0].nulls = TBL_NULLS_SKIP;
    CHECK(convert(&c, &f.batch, plans, 4, &err) == 0);
    if (c != NULL) {
        const float want_v3[3] = {0.5, 2.5, 3.5};
        CHECK(c->rows == 3 && memcmp(c->cols[3].values, want_v3, sizeof want_v3) == 0);
        CHECK(c->cols[2].offsets[2] == 1 && c->cols[2].offsets[3] == 4 &&
              memcmp(c->cols[2].bytes, "accc", 4) == 0);
        tbl_chunk_free(c);
    }
    plans[0].nulls = TBL_NULLS_ERROR;
    CHECK(convert(&c, &f.batch, plans, 4, &err) == SG_ESCHEMA && c == NULL);
    CHECK(strstr(err.msg, "file 't.parquet', row group 2, row 101: column 'a' is null") != NULL);

    /* the batch's offset: rows 2 and 3 */
    f.batch.a.offset = 2;
    f.batch.a.length = 2;
    CHECK(convert(&c, &f.batch, plans, 4, &err) == 0);
    if (c != NULL) {
        CHECK(c->rows == 2 && c->cols[0].values[0] == 30 && c->cols[3].values[1] == 3.5f);
        CHECK(c->cols[1].lengths[0] == 2 && c->cols[1].values[0] == 3 &&
              c->cols[1].values[1] == 4); /* cut */
        CHECK(c->cols[2].offsets[1] == 0 && c->cols[2].offsets[2] == 3);
        tbl_chunk_free(c);
    }
}

static void expect_fail(Fixture *f, const char *name, size_t width, int code, const char *msg)
{
    TblPlan plan = {.name = name, .width = width};
    TblChunk *c = NULL;
    SgError err = {0};
    int rc = convert(&c, &f->batch, &plan, 1, &err);
    CHECK(rc == code && c == NULL);
    if (rc != code || strstr(err.msg, msg) == NULL)
        fprintf(stderr, "  %s: got %d '%s', want %d '%s'\n", name, rc, err.msg, code, msg);
    CHECK(strstr(err.msg, msg) != NULL);
    tbl_chunk_free(c);
}

static void test_malformed_arrays_are_refused(void)
{
    Fixture f;
    fixture(&f);
    expect_fail(&f, "nope", 0, SG_ESCHEMA, "no column 'nope' (the batch has: a, l, s, st.v)");
    expect_fail(&f, "st.w", 0, SG_ESCHEMA, "the struct has no field 'w'");
    expect_fail(&f, "a.b", 0, SG_ESCHEMA, "'a' has Arrow format 'i', not a struct");

    static const int32_t bad_off[5] = {0, 2, 1, 5, 6};
    f.l.bufs[1] = bad_off;
    expect_fail(&f, "l", 2, SG_ECORRUPT, "column 'l': offsets decrease");
    static const int32_t far_off[5] = {0, 2, 2, 5, 7};
    f.l.bufs[1] = far_off;
    expect_fail(&f, "l", 2, SG_ECORRUPT,
                "column 'l' (Arrow format 'f'): rows 0..7 read, but the array holds 6");
    f.l.bufs[1] = list_off;

    f.a.a.n_buffers = 3;
    expect_fail(&f, "a", 0, SG_ECORRUPT, "column 'a' (Arrow format 'i') has 3 buffers, not 2");
    f.a.a.n_buffers = 2;
    f.a.bufs[0] = NULL;
    expect_fail(&f, "a", 0, SG_ECORRUPT, "column 'a' counts 1 nulls but has no validity bitmap");
    f.a.bufs[0] = valid_0101;

    f.v.a.length = 3; /* shorter than its struct */
    expect_fail(&f, "st.v", 0, SG_ECORRUPT,
                "column 'st.v' (Arrow format 'g'): rows 0..4 read, but the array holds 3");
    f.v.a.length = 4;
    f.s.a.offset = -1;
    expect_fail(&f, "s", 0, SG_ECORRUPT, "length 4 or offset -1 out of range");
    f.s.a.offset = 0;
    f.s.s.format = "tdD";
    expect_fail(&f, "s", 0, SG_ESCHEMA, "column 's' has Arrow format 'tdD', which cannot be fed");
    f.s.s.format = "u";
    f.s.bufs[1] = NULL;
    expect_fail(&f, "s", 0, SG_ECORRUPT, "column 's' (Arrow format 'u'): buffer 1 is missing");
    f.s.bufs[1] = str_off;
    expect_fail(&f, "l", 0, SG_ESCHEMA, "variable-length list: give its width");
    expect_fail(&f, "l", 1, SG_ESCHEMA, "column 'l' holds 2 values, more than its width 1");
    struct ArrowSchema dict = {.format = "u"};
    f.s.s.dictionary = &dict;
    expect_fail(&f, "s", 0, SG_ESCHEMA, "column 's' is dictionary-encoded");
}

/* struct<type:int8, size:int32, indices:list<int32>, values:list<double>>, rows: dense [1, 2, 3]
 * (as Spark writes it, size and indices null), sparse (3, {2: 7}) */
static void test_vectors(void)
{
    static const int8_t types[2] = {1, 0};
    static const int32_t sizes[2] = {3, 3}, ind_off[3] = {0, 0, 1}, indices[1] = {2},
                         val_off[3] = {0, 3, 4};
    static int32_t bad_indices[1] = {5};
    static const double values[4] = {1, 2, 3, 7};
    Col batch, vec, type, size, ind, indv, val, valv;
    make(&batch, "+s", "", 2, 1, NULL, NULL, NULL);
    make(&vec, "+s", "features", 2, 1, NULL, NULL, NULL);
    make(&type, "c", "type", 2, 2, NULL, types, NULL);
    static const uint8_t row1_valid[1] = {0x02}; /* Spark's dense row: null size and indices */
    make(&size, "i", "size", 2, 2, row1_valid, sizes, NULL);
    size.a.null_count = 1;
    make(&ind, "+l", "indices", 2, 2, row1_valid, ind_off, NULL);
    ind.a.null_count = 1;
    make(&indv, "i", "element", 1, 2, NULL, indices, NULL);
    make(&val, "+l", "values", 2, 2, NULL, val_off, NULL);
    make(&valv, "g", "element", 4, 2, NULL, values, NULL);
    add_child(&ind, &indv);
    add_child(&val, &valv);
    add_child(&vec, &type);
    add_child(&vec, &size);
    add_child(&vec, &ind);
    add_child(&vec, &val);
    add_child(&batch, &vec);
    TblPlan plan = {.name = "features"};
    TblChunk *c = NULL;
    SgError err = {0};
    CHECK(convert(&c, &batch, &plan, 1, &err) == 0 && plan.width == 3);
    if (c != NULL) {
        const float want[6] = {1, 2, 3, 0, 0, 7};
        CHECK(memcmp(c->cols[0].values, want, sizeof want) == 0);
        tbl_chunk_free(c);
    }
    indv.bufs[1] = bad_indices;
    CHECK(convert(&c, &batch, &plan, 1, &err) == SG_ESCHEMA && c == NULL);
    CHECK(strstr(err.msg, "row 101: column 'features': a sparse vector of size 3 has index 5") !=
          NULL);
}

/* A chunk of rows [lo, hi) of one float column holding the row numbers. */
static TblChunk *rows_chunk(size_t lo, size_t hi)
{
    TblChunk *c = calloc(1, sizeof *c + sizeof(TblColumn));
    c->rows = hi - lo;
    c->ncols = 1;
    c->cols[0].out = TBL_OUT_F32;
    c->cols[0].width = 1;
    c->cols[0].values = malloc((hi - lo) * sizeof(float) + 1);
    for (size_t i = lo; i < hi; i++)
        c->cols[0].values[i - lo] = (float)i;
    return c;
}

/* The rows of every batch, pushing chunks of `step` rows of 0..n-1. */
static void drain(float *out, size_t n, size_t step, size_t shuffle, uint64_t seed)
{
    TblBatcher *b = NULL;
    SgError err = {0};
    CHECK(tbl_batcher_new(&b, 7, shuffle, seed, &err) == 0);
    size_t got = 0;
    for (size_t lo = 0;; lo += step) {
        int final = lo >= n;
        if (!final)
            CHECK(tbl_batcher_push(b, rows_chunk(lo, lo + step < n ? lo + step : n), &err) == 0);
        TblChunk *batch;
        while (tbl_batcher_next(b, final, &batch, &err) == 1) {
            CHECK(batch->rows == 7 || (final && batch->rows < 7));
            for (size_t i = 0; i < batch->rows && got < n; i++)
                out[got++] = batch->cols[0].values[i];
            tbl_chunk_free(batch);
        }
        if (final)
            break;
    }
    CHECK(got == n && tbl_batcher_rows(b) == 0);
    tbl_batcher_free(b);
}

static void test_batcher_order(void)
{
    enum { N = 200 };
    float a[N], b[N], c[N], sorted[N];
    drain(a, N, 13, 50, 9);
    drain(b, N, 64, 50, 9); /* other chunks, the same order */
    drain(c, N, 13, 50, 10);
    CHECK(memcmp(a, b, sizeof a) == 0 && memcmp(a, c, sizeof a) != 0);
    int seen[N] = {0}, moved = 0;
    for (size_t i = 0; i < N; i++) {
        if (a[i] >= 0 && a[i] < N)
            seen[(int)a[i]]++;
        moved += a[i] != (float)i;
    }
    for (size_t i = 0; i < N; i++)
        CHECK(seen[i] == 1);
    CHECK(moved > N / 2);
    drain(sorted, N, 13, 0, 9);
    for (size_t i = 0; i < N; i++)
        CHECK(sorted[i] == (float)i);

    /* freed with rows still held: no leak or double free under ASan */
    TblBatcher *bt = NULL;
    SgError err = {0};
    CHECK(tbl_batcher_new(&bt, 4, 10, 1, &err) == 0);
    for (size_t lo = 0; lo < 30; lo += 6)
        tbl_batcher_push(bt, rows_chunk(lo, lo + 6), &err);
    TblChunk *batch;
    CHECK(tbl_batcher_next(bt, 0, &batch, &err) == 1);
    tbl_chunk_free(batch);
    tbl_batcher_free(bt);
}

static void test_pool_reuses_buffers(void)
{
    Fixture f;
    fixture(&f);
    TblPlan plans[2] = {{.name = "l", .width = 3}, {.name = "s"}};
    TblWhere where = {"t.parquet", 0, 0};
    TblPool *pool = NULL;
    SgError err = {0};
    CHECK(tbl_pool_new(&pool, 1 << 16, &err) == 0);
    TblChunk *a = NULL, *b = NULL;
    CHECK(tbl_chunk_from_arrow(&a, &f.batch.s, &f.batch.a, plans, 2, &where, pool, NULL, &err) ==
          0);
    if (a == NULL)
        return;
    float first[12];
    memcpy(first, a->cols[0].values, sizeof first);
    tbl_chunk_free(a);
    size_t held = tbl_pool_bytes(pool);
    CHECK(held >= sizeof first);
    CHECK(tbl_chunk_from_arrow(&b, &f.batch.s, &f.batch.a, plans, 2, &where, pool, NULL, &err) ==
          0);
    if (b != NULL) {
        CHECK(tbl_pool_bytes(pool) < held); /* taken from the pool */
        CHECK(memcmp(first, b->cols[0].values, sizeof first) == 0);
        CHECK(memcmp(b->cols[1].bytes, "abbccc", 6) == 0);
        tbl_chunk_free(b);
    }
    TblPool *tiny = NULL; /* a full pool frees what comes back */
    CHECK(tbl_pool_new(&tiny, 4, &err) == 0);
    CHECK(tbl_chunk_from_arrow(&a, &f.batch.s, &f.batch.a, plans, 2, &where, tiny, NULL, &err) ==
          0);
    tbl_chunk_free(a);
    CHECK(tbl_pool_bytes(tiny) <= 4);
    tbl_pool_free(tiny);
    tbl_pool_free(pool);
}

static int released; /* release_counted's calls */

static void release_counted(struct ArrowArray *a)
{
    released++;
    a->release = NULL;
}

/* A lent batch: its binary column is borrowed (the array moves into the
 * chunk and is released once the chunk and then the queue are freed); a row
 * skipped for a null, or no lender, copies instead and leaves it. */
static void test_binary_rows_borrow_the_lent_batch(void)
{
    static const int32_t bin_off[4] = {0, 3, 6, 9};
    static const uint8_t bin_data[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    static const uint8_t valid_101[1] = {0x05};
    Col batch, bin, lab;
    make(&batch, "+s", "", 3, 1, NULL, NULL, NULL);
    make(&bin, "z", "px", 3, 3, NULL, bin_off, bin_data);
    make(&lab, "i", "y", 3, 2, NULL, ints, NULL);
    add_child(&batch, &bin);
    add_child(&batch, &lab);
    batch.a.release = release_counted;
    TblRelease *lend = NULL;
    SgError err = {0};
    CHECK(tbl_release_new(&lend, &err) == 0);
    TblWhere where = {"t.parquet", 0, 0};
    TblPlan plans[2] = {{.name = "px"}, {.name = "y"}};
    TblChunk *c = NULL;
    released = 0;
    CHECK(tbl_chunk_from_arrow(&c, &batch.s, &batch.a, plans, 2, &where, NULL, lend, &err) == 0);
    if (c == NULL)
        return;
    CHECK(batch.a.release == NULL && c->held.release == release_counted); /* moved */
    CHECK(c->cols[0].borrowed && c->cols[0].u8 && c->cols[0].bytes == bin_data + 0);
    CHECK(!c->cols[1].borrowed && c->cols[1].values[2] == 30);
    TblBatcher *b = NULL;
    CHECK(tbl_batcher_new(&b, 3, 0, 1, &err) == 0);
    CHECK(tbl_batcher_push(b, c, &err) == 0);
    TblChunk *out = NULL;
    CHECK(tbl_batcher_next(b, 1, &out, &err) == 1 && out != NULL);
    if (out != NULL) {
        float got[9];
        for (int r = 0; r < 3; r++) /* the batcher's order: find each row by its label */
            memcpy(got + (size_t)(out->cols[1].values[r] / 10 - 1) * 3, out->cols[0].values + r * 3,
                   3 * sizeof(float));
        const float want[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
        CHECK(memcmp(got, want, sizeof want) == 0);
        tbl_chunk_free(out);
    }
    CHECK(released == 0); /* the emptied chunk queued its batch: not released from here */
    tbl_release_drain(lend);
    CHECK(released == 1);
    tbl_batcher_free(b);

    /* row 1 null and skipped: copied, the batch stays the caller's */
    batch.a.release = release_counted;
    bin.a.buffers[0] = valid_101;
    bin.a.null_count = 1;
    plans[0].nulls = TBL_NULLS_SKIP;
    CHECK(tbl_chunk_from_arrow(&c, &batch.s, &batch.a, plans, 2, &where, NULL, lend, &err) == 0);
    if (c != NULL) {
        CHECK(c->rows == 2 && !c->cols[0].borrowed && batch.a.release == release_counted);
        CHECK(c->cols[0].bytes[3] == 7);
        tbl_chunk_free(c);
    }
    /* no lender: copied */
    bin.a.null_count = 0;
    CHECK(tbl_chunk_from_arrow(&c, &batch.s, &batch.a, plans, 2, &where, NULL, NULL, &err) == 0);
    if (c != NULL) {
        CHECK(!c->cols[0].borrowed && c->cols[0].bytes != bin_data && batch.a.release != NULL);
        tbl_chunk_free(c);
    }
    tbl_release_free(lend);
    CHECK(released == 1);
}

int main(void)
{
    test_binary_rows_borrow_the_lent_batch();
    test_pool_reuses_buffers();
    test_columns_and_nulls();
    test_malformed_arrays_are_refused();
    test_vectors();
    test_batcher_order();
    return check_report("test_table_arrow");
}
