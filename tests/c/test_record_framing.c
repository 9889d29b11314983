/* test_record_framing.c - CRC32C vectors (docs/design/records.md), both implementations,
 * and TFRecord framing: round trips, truncation, corruption, forged lengths. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "record/crc32c.h"
#include "record/tfrecord.h"

static void test_crc_vectors(void)
{
    const uint8_t *digits = (const uint8_t *)"123456789";
    uint8_t zeros[32] = {0};
    CHECK(crc32c(digits, 9) == 0xe3069283u);
    CHECK(crc32c_extend_portable(0, digits, 9) == 0xe3069283u);
    CHECK(crc32c(zeros, 32) == 0x8a9136aau);
    CHECK(crc32c_extend_portable(0, zeros, 32) == 0x8a9136aau);
    CHECK(crc32c_mask(crc32c(NULL, 0)) == 0xa282ead8u);
    CHECK(crc32c_unmask(crc32c_mask(0x12345678u)) == 0x12345678u);
    uint8_t header[TFR_HEADER_BYTES];
    uint32_t crc;
    tfr_header_encode(header, 0);
    memcpy(&crc, header + 8, 4);
    CHECK(crc == 0x07980329u);
    tfr_header_encode(header, 24);
    memcpy(&crc, header + 8, 4);
    CHECK(crc == 0x224b7fa3u);
    /* Hardware and table agree on every length and alignment up to 300. */
    uint8_t buf[320];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)(i * 7 + 3);
    for (size_t off = 0; off < 8; off++)
        for (size_t n = 0; n < 300; n++)
            CHECK(crc32c_extend(5, buf + off, n) == crc32c_extend_portable(5, buf + off, n));
    /* ... and on long buffers that take the three-stream path. */
    size_t big_n = 3 * 4096 * 3 + 1000;
    uint8_t *big = malloc(big_n);
    for (size_t i = 0; i < big_n; i++)
        big[i] = (uint8_t)((i * 2654435761u) >> 13);
    for (size_t n = 380; n < big_n; n = n * 5 / 4 + 7)
        for (size_t off = 0; off < 3; off++)
            CHECK(crc32c_extend(9, big + off, n - off) ==
                  crc32c_extend_portable(9, big + off, n - off));
    free(big);
    /* Extending equals one pass. */
    CHECK(crc32c_extend(crc32c(digits, 4), digits + 4, 5) == 0xe3069283u);
    printf("crc32c hardware path: %s\n", crc32c_hardware() ? "sse4.2" : "table");
}

static size_t frame(uint8_t *out, const char *s)
{
    size_t n = strlen(s);
    tfr_header_encode(out, n);
    memcpy(out + TFR_HEADER_BYTES, s, n);
    tfr_footer_encode(out + TFR_HEADER_BYTES + n, (const uint8_t *)s, n);
    return TFR_HEADER_BYTES + n + TFR_FOOTER_BYTES;
}

static void test_parse_buffer(void)
{
    uint8_t buf[256];
    size_t n = frame(buf, "hello");
    n += frame(buf + n, "");
    SgError err;
    TfrReader *r;
    CHECK(tfr_reader_open_memory(&r, buf, n, TFR_NONE, 1, "mem", &err) == 0);
    const uint8_t *d;
    size_t len;
    CHECK(tfr_reader_next(r, &d, &len, &err) == 1 && len == 5 && memcmp(d, "hello", 5) == 0);
    CHECK(tfr_reader_next(r, &d, &len, &err) == 1 && len == 0);
    CHECK(tfr_reader_offset(r) == 21);
    CHECK(tfr_reader_next(r, &d, &len, &err) == 0);
    tfr_reader_close(r);

    /* Every proper prefix that is not a record boundary is truncated. */
    for (size_t cut = 1; cut < n; cut++) {
        if (cut == 21)
            continue;
        CHECK(tfr_reader_open_memory(&r, buf, cut, TFR_NONE, 1, "mem", &err) == 0);
        int rc;
        while ((rc = tfr_reader_next(r, &d, &len, &err)) == 1)
            ;
        CHECK(rc == SG_ETRUNCATED);
        CHECK(strstr(err.msg, "'mem': truncated record at byte") != NULL);
        tfr_reader_close(r);
    }
    /* Flipping any byte gives a CRC error (or truncation if in the length). */
    for (size_t i = 0; i < n; i++) {
        buf[i] ^= 0x01;
        CHECK(tfr_reader_open_memory(&r, buf, n, TFR_NONE, 1, "mem", &err) == 0);
        int rc;
        while ((rc = tfr_reader_next(r, &d, &len, &err)) == 1)
            ;
        CHECK(rc == SG_ECORRUPT);
        tfr_reader_close(r);
        buf[i] ^= 0x01;
    }
    /* Forged length 2^60 with a valid header CRC: rejected without allocating. */
    tfr_header_encode(buf, (uint64_t)1 << 60);
    CHECK(tfr_reader_open_memory(&r, buf, 40, TFR_NONE, 1, "mem", &err) == 0);
    CHECK(tfr_reader_next(r, &d, &len, &err) == SG_ETRUNCATED);
    tfr_reader_close(r);
}

static void roundtrip_file(TfrCompression comp)
{
    char path[] = "/tmp/sg_test_framingXXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    SgError err;
    TfrWriter *w;
    CHECK(tfr_writer_open(&w, path, comp, &err) == 0);
    uint8_t *big = malloc(3u << 20);
    for (size_t i = 0; i < (3u << 20); i++)
        big[i] = (uint8_t)(i * 31 + (i >> 9));
    for (int i = 0; i < 100; i++) {
        size_t n = i == 50 ? (3u << 20) : (size_t)i * 100;
        CHECK(tfr_writer_write(w, big, n, &err) == 0);
        if (i == 10)
            CHECK(tfr_writer_flush(w, &err) == 0);
    }
    CHECK(tfr_writer_close(w, &err) == 0);
    TfrReader *r;
    char url[128];
    snprintf(url, sizeof url, "file://%s", path);
    CHECK(tfr_reader_open(&r, url, comp, 1, &err) == 0);
    const uint8_t *d;
    size_t len;
    for (int i = 0; i < 100; i++) {
        size_t n = i == 50 ? (3u << 20) : (size_t)i * 100;
        CHECK(tfr_reader_next(r, &d, &len, &err) == 1 && len == n && memcmp(d, big, n) == 0);
    }
    CHECK(tfr_reader_next(r, &d, &len, &err) == 0);
    tfr_reader_close(r);
    free(big);
    unlink(path);
}

static void test_paths(void)
{
    char out[64];
    SgError err;
    CHECK(tfr_path_resolve("dbfs:/x/y", out, sizeof out, &err) == 0 &&
          strcmp(out, "/dbfs/x/y") == 0);
    CHECK(tfr_path_resolve("file:///a/b", out, sizeof out, &err) == 0 && strcmp(out, "/a/b") == 0);
    CHECK(tfr_path_resolve("/dbfs/z", out, sizeof out, &err) == 0 && strcmp(out, "/dbfs/z") == 0);
    TfrReader *r;
    CHECK(tfr_reader_open(&r, "/nonexistent/x.tfrecord", TFR_NONE, 1, &err) == SG_EIO);
    CHECK(strstr(err.msg, "/nonexistent/x.tfrecord") != NULL);
}

int main(void)
{
    test_crc_vectors();
    test_parse_buffer();
    roundtrip_file(TFR_NONE);
    roundtrip_file(TFR_GZIP);
    roundtrip_file(TFR_ZLIB);
    test_paths();
    return check_report("test_record_framing");
}
