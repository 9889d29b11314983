/* fuzz_table.c - libFuzzer harness for the table reader: the input picks a
 * column kind (numbers, list, large list, fixed-size list, binary, string,
 * Spark vector), a row count, the batch's offset, a null policy and width,
 * and fills validity bitmaps, null counts, offsets and values. Every buffer
 * is as large as the lengths the arrays declare (the C data interface's
 * promise, which a consumer cannot check), while offsets, null counts,
 * child lengths, vector types, sizes and indices are arbitrary: the
 * validation must refuse what does not fit. Chunks that convert go through
 * a shuffling batcher; some plans read integers as int64 ids. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "table/batcher.h"
#include "table/table.h"

#define POOL 64 /* values in every child array; binary data bytes */

typedef struct Arr {
    struct ArrowSchema s;
    struct ArrowArray a;
    const void *bufs[3];
    struct ArrowSchema *sc[4];
    struct ArrowArray *ac[4];
} Arr;

typedef struct Input {
    const uint8_t *p;
    size_t n;
} Input;

static uint8_t take(Input *in)
{
    if (in->n == 0)
        return 0;
    in->n--;
    return *in->p++;
}

static void init(Arr *x, const char *fmt, const char *name, int64_t length, int64_t nbuf)
{
    memset(x, 0, sizeof *x);
    x->s = (struct ArrowSchema){.format = fmt, .name = name, .children = x->sc};
    x->a = (struct ArrowArray){
        .length = length, .n_buffers = nbuf, .buffers = x->bufs, .children = x->ac};
}

static void child(Arr *parent, Arr *c)
{
    parent->sc[parent->s.n_children++] = &c->s;
    parent->ac[parent->a.n_children++] = &c->a;
}

/* Validity and null_count from the input; data buffers of `slots` values. */
static void fill(Arr *x, Input *in, uint8_t *validity, void *data, size_t data_bytes)
{
    for (int i = 0; i < 8; i++)
        validity[i] = take(in);
    uint8_t nc = take(in);
    x->a.null_count = nc == 0xff ? -1 : nc % 4 == 0 ? nc % 9 : 0;
    x->bufs[0] = take(in) % 4 ? validity : NULL;
    uint8_t *d = data;
    for (size_t i = 0; i < data_bytes; i++)
        d[i] = take(in);
}

static void offsets(int32_t *off, int64_t count, Input *in, int bounded)
{
    for (int64_t i = 0; i < count; i++) {
        int32_t v = (int32_t)take(in) - (take(in) == 0xff ? 300 : 0);
        off[i] = bounded ? (v < 0 ? 0 : v % (POOL + 1)) : v;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    Input in = {data, size};
    int64_t rows = take(&in) % 16 + 1, start = take(&in) % 4, kind = take(&in) % 7;
    uint8_t policy = take(&in), width = take(&in) % 6;
    int64_t length = rows + start; /* every column declares the batch's rows */
    static uint8_t v0[8], v1[8], v2[8], v3[8], v4[8], v5[8];
    static int32_t off[32], off2[32];
    static int64_t off64[32];
    static double pool_d[POOL];
    static float pool_f[POOL * 3];
    static int32_t pool_i[POOL];
    static int8_t types[32];
    static uint8_t bytes[POOL];
    Arr batch, col, c1, c2, c3, c4, l1, l2;
    init(&batch, "+s", "", rows, 1);
    batch.a.offset = start;
    batch.a.length = rows;
    const char *fmt[7] = {"i", "+l", "+L", "+w:3", "z", "u", "+s"};
    init(&col, fmt[kind], "c", length, kind == 3 || kind == 6 ? 1 : kind >= 4 ? 3 : 2);
    col.a.offset = take(&in) % 2;
    col.a.length = length; /* logical; buffers below hold length + offset values */
    fill(&col, &in, v0, pool_i, sizeof pool_i);
    if (kind == 0) {
        col.bufs[1] = pool_i;
    } else if (kind == 1 || kind == 2 || kind == 3) {
        init(&c1, kind == 2 ? "l" : "f", "item", take(&in) % (POOL + 8), 2);
        if (c1.a.length > POOL)
            c1.a.length = POOL; /* the child's buffer holds POOL values */
        fill(&c1, &in, v1, pool_f, sizeof pool_f);
        c1.bufs[1] = pool_f;
        child(&col, &c1);
        if (kind == 1) {
            offsets(off, length + 2, &in, 0);
            col.bufs[1] = off;
        } else if (kind == 2) {
            offsets(off2, length + 2, &in, 0);
            for (int64_t i = 0; i < length + 2; i++)
                off64[i] = off2[i];
            col.bufs[1] = off64;
        }
    } else if (kind == 4 || kind == 5) {
        offsets(off, length + 2, &in, 1); /* the data buffer's size is not in the interface */
        for (size_t i = 0; i < sizeof bytes; i++)
            bytes[i] = take(&in);
        col.bufs[1] = off;
        col.bufs[2] = bytes;
    } else {
        init(&c1, "c", "type", length + 1, 2);
        init(&c2, "i", "size", length + 1, 2);
        init(&c3, "+l", "indices", length + 1, 2);
        init(&c4, "+l", "values", length + 1, 2);
        init(&l1, "i", "element", take(&in) % (POOL + 1), 2);
        init(&l2, "g", "element", take(&in) % (POOL + 1), 2);
        for (int64_t i = 0; i < 32; i++)
            types[i] = (int8_t)(take(&in) % 3);
        fill(&c1, &in, v1, NULL, 0);
        c1.bufs[1] = types;
        fill(&c2, &in, v2, NULL, 0);
        c2.bufs[1] = pool_i;
        fill(&c3, &in, v3, NULL, 0);
        offsets(off, length + 2, &in, 0);
        c3.bufs[1] = off;
        fill(&c4, &in, v4, NULL, 0);
        offsets(off2, length + 2, &in, 0);
        c4.bufs[1] = off2;
        fill(&l1, &in, v5, pool_i, sizeof pool_i);
        l1.bufs[1] = pool_i;
        fill(&l2, &in, v5, pool_d, sizeof pool_d);
        l2.bufs[1] = pool_d;
        child(&c3, &l1);
        child(&c4, &l2);
        child(&col, &c1);
        child(&col, &c2);
        child(&col, &c3);
        child(&col, &c4);
    }
    child(&batch, &col);

    SgError err = {0};
    static TblPool *pool; /* kept across inputs: buffers are reused between them */
    if (pool == NULL && tbl_pool_new(&pool, (size_t)1 << 20, &err) < 0)
        return 0;
    TblPlan plan = {.name = "c",
                    .width = width,
                    .truncate = policy & 4,
                    .nulls = (TblNulls)(policy % 3),
                    .ints = (policy & 16) != 0};
    TblWhere where = {"fuzz", 0, 0};
    TblBatcher *b = NULL;
    if (tbl_batcher_new(&b, 3, policy & 8 ? 5 : 0, policy, &err) < 0)
        return 0;
    for (int round = 0; round < 2; round++) {
        TblChunk *chunk = NULL;
        if (tbl_chunk_from_arrow(&chunk, &batch.s, &batch.a, &plan, 1, &where, pool, NULL, &err) <
            0)
            break;
        if (tbl_batcher_push(b, chunk, &err) < 0)
            break;
    }
    TblChunk *out;
    while (tbl_batcher_next(b, 1, &out, &err) == 1)
        tbl_chunk_free(out);
    tbl_batcher_free(b);
    return 0;
}
