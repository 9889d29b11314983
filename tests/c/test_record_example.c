/* test_record_example.c - Example encode/decode, schema batches and the
 * dataset pipeline from C (no Python), including error paths. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "record/dataset.h"
#include "record/example.h"
#include "record/example_parse.h"
#include "record/tfrecord.h"

/* An Example {label: [label], img: raw 4 bytes, tags: (label mod 3) values}. */
static PbBuf make_example(int64_t label)
{
    PbBuf b = {0};
    size_t features = pb_begin(&b);
    ex_put_int64(&b, "label", 5, &label, 1);
    uint8_t img[4] = {0, 51, 102, (uint8_t)label};
    const uint8_t *ptr = img;
    size_t len = sizeof img;
    ex_put_bytes(&b, "img", 3, &ptr, &len, 1);
    int64_t tags[3] = {-1, label, 1ll << 40};
    ex_put_int64(&b, "tags", 4, tags, (size_t)((label % 3 + 3) % 3));
    pb_end_message(&b, features, 1);
    return b;
}

typedef struct Seen {
    int n;
    int64_t label;
} Seen;

static int seen_cb(void *ctx, const ExEntry *e, SgError *err)
{
    Seen *s = ctx;
    ExFeature f;
    int rc = ex_feature_decode(e->key - 0, e->value, e->value_len, &f, err);
    if (rc < 0)
        return rc;
    s->n++;
    if (e->key_len == 5 && memcmp(e->key, "label", 5) == 0 && f.kind == EX_INT64 && f.count == 1)
        ex_values_int64(&f, &s->label);
    return 0;
}

static char n_label[] = "label", n_img[] = "img", n_tags[] = "tags";

static void schema_init(ExSpec specs[3], ExSchema *schema)
{
    memset(specs, 0, 3 * sizeof *specs);
    specs[0] = (ExSpec){.name = n_label,
                        .name_len = 5,
                        .kind = EX_SPEC_FIXED,
                        .wire = EX_INT64,
                        .out = EX_DT_INT64,
                        .count = 1};
    specs[1] = (ExSpec){.name = n_img,
                        .name_len = 3,
                        .kind = EX_SPEC_RAW,
                        .wire = EX_BYTES,
                        .out = EX_DT_FLOAT32,
                        .count = 4,
                        .raw_src = EX_DT_UINT8,
                        .scale = 0.5f};
    specs[2] = (ExSpec){.name = n_tags,
                        .name_len = 4,
                        .kind = EX_SPEC_VARLEN,
                        .wire = EX_INT64,
                        .out = EX_DT_INT64};
    schema->n = 3;
    schema->specs = specs;
}

static void test_codec_and_batch(void)
{
    PbBuf b = make_example(-7);
    CHECK(!b.oom);
    Seen s = {0, 0};
    SgError err;
    CHECK(ex_example_foreach(b.data, b.len, seen_cb, &s, &err) == 0);
    CHECK(s.n == 3 && s.label == -7);

    ExSpec specs[3];
    ExSchema schema;
    schema_init(specs, &schema);
    ExBatch batch;
    CHECK(ex_batch_init(&batch, &schema, 2, &err) == 0);
    PbBuf b2 = make_example(5);
    CHECK(ex_batch_add(&batch, b.data, b.len, &err) == 0);
    CHECK(ex_batch_add(&batch, b2.data, b2.len, &err) == 0);
    CHECK(ex_batch_add(&batch, b2.data, b2.len, &err) == SG_ESTATE); /* full */
    int64_t *labels = batch.cols[0].data;
    float *img = batch.cols[1].data;
    CHECK(labels[0] == -7 && labels[1] == 5);
    CHECK(img[1] == 25.5f && img[7] == 2.5f);
    int64_t *tags = batch.cols[2].v.values;
    CHECK(batch.cols[2].v.nvalues == 4 && tags[0] == -1 && tags[1] == -7 && tags[3] == 5);
    CHECK(batch.cols[2].row_splits[1] == 2 && batch.cols[2].row_splits[2] == 4);

    /* A failing record leaves no partial values behind. */
    CHECK(ex_batch_reset(&batch, &err) == 0);
    CHECK(ex_batch_add(&batch, b2.data, b2.len, &err) == 0);
    PbBuf bad = {0};
    size_t f = pb_begin(&bad);
    int64_t two[2] = {1, 2};
    ex_put_int64(&bad, "tags", 4, two, 2);
    ex_put_int64(&bad, "label", 5, two, 2); /* 2 values where 1 is required */
    pb_end_message(&bad, f, 1);
    CHECK(ex_batch_add(&batch, bad.data, bad.len, &err) == SG_ESCHEMA);
    CHECK(strstr(err.msg, "feature 'label': expected 1 int64 value, found 2 int64 values") != NULL);
    CHECK(batch.rows == 1 && batch.cols[2].v.nvalues == 2);
    ex_batch_free(&batch);
    pb_buf_free(&b);
    pb_buf_free(&b2);
    pb_buf_free(&bad);
}

static void test_dataset(void)
{
    char path[] = "/tmp/sg_test_datasetXXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    SgError err;
    TfrWriter *w;
    CHECK(tfr_writer_open(&w, path, TFR_NONE, &err) == 0);
    for (int i = 0; i < 25; i++) {
        PbBuf b = make_example(i);
        CHECK(tfr_writer_write(w, b.data, b.len, &err) == 0);
        pb_buf_free(&b);
    }
    CHECK(tfr_writer_close(w, &err) == 0);
    ExSpec specs[3];
    ExSchema schema;
    schema_init(specs, &schema);
    const char *paths[1] = {path};
    for (size_t prefetch = 0; prefetch < 3; prefetch += 2) {
        DsConfig cfg = {.paths = paths,
                        .npaths = 1,
                        .verify_crc = 1,
                        .schema = &schema,
                        .batch_size = 10,
                        .shuffle_buffer = 7,
                        .seed = 3,
                        .epochs = 2,
                        .num_shards = 1,
                        .prefetch = prefetch};
        Dataset *ds;
        CHECK(ds_open(&ds, &cfg, &err) == 0);
        int64_t sum = 0;
        size_t rows = 0, batches = 0;
        ExBatch *batch;
        int rc;
        while ((rc = ds_next(ds, &batch, 10.0, &err)) == 1) {
            for (size_t r = 0; r < batch->rows; r++)
                sum += ((int64_t *)batch->cols[0].data)[r];
            rows += batch->rows;
            batches++;
            ds_release(ds, batch);
        }
        CHECK(rc == 0);
        CHECK(rows == 50 && batches == 5 && sum == 2 * (24 * 25 / 2));
        CHECK(ds_close(ds) == 0);
    }
    unlink(path);
}

int main(void)
{
    test_codec_and_batch();
    test_dataset();
    return check_report("test_record_example");
}
