/* fuzz_inflate.c - libFuzzer harness for the two inflate backends: the input
 * is read as a GZIP and as a ZLIB TFRecord stream, once through ISA-L and
 * once through zlib (record/inflate.h), and both readings must agree record
 * for record, then on the outcome: the same clean end, or the same status
 * and message. Any difference aborts. (In a build without ISA-L it reads
 * through zlib twice, which still checks for crashes.) */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "record/inflate.h"
#include "record/tfrecord.h"

#define MAX_RECORDS 4096

typedef struct Reading {
    int rc, n;
    uint64_t crc[MAX_RECORDS]; /* a digest of each record: length and bytes */
    SgError err;
} Reading;

static uint64_t digest(const uint8_t *d, size_t len)
{
    uint64_t h = 1469598103934665603ull ^ len;
    for (size_t i = 0; i < len; i++)
        h = (h ^ d[i]) * 1099511628211ull;
    return h;
}

static void read_all(const uint8_t *data, size_t size, TfrCompression comp, int verify,
                     SgInflateBackend backend, Reading *out)
{
    TfrReader *r = NULL;
    memset(&out->err, 0, sizeof out->err);
    out->n = 0;
    out->rc = tfr_reader_open_memory(&r, data, size, comp, verify, "fuzz", &out->err);
    if (out->rc < 0)
        return;
    if ((out->rc = tfr_reader_use_inflate(r, backend, &out->err)) == 0) {
        const uint8_t *d;
        size_t len;
        while ((out->rc = tfr_reader_next(r, &d, &len, &out->err)) == 1)
            if (out->n < MAX_RECORDS)
                out->crc[out->n++] = digest(d, len);
    }
    tfr_reader_close(r);
}

static Reading a, b;

static void compare(const uint8_t *data, size_t size, TfrCompression comp, int verify)
{
    SgInflateBackend fast = sg_inflate_have_isal() ? SG_INFLATE_ISAL : SG_INFLATE_ZLIB;
    read_all(data, size, comp, verify, fast, &a);
    read_all(data, size, comp, verify, SG_INFLATE_ZLIB, &b);
    int same = a.rc == b.rc && a.n == b.n &&
               memcmp(a.crc, b.crc, sizeof a.crc[0] * (size_t)a.n) == 0 &&
               (a.rc >= 0 || (a.err.code == b.err.code && strcmp(a.err.msg, b.err.msg) == 0));
    if (!same) {
        fprintf(stderr,
                "inflate backends disagree (%s, verify %d):\n  isal: rc %d, %d records, %s\n"
                "  zlib: rc %d, %d records, %s\n",
                comp == TFR_GZIP ? "GZIP" : "ZLIB", verify, a.rc, a.n, a.rc < 0 ? a.err.msg : "",
                b.rc, b.n, b.rc < 0 ? b.err.msg : "");
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    compare(data, size, TFR_GZIP, 1);
    compare(data, size, TFR_ZLIB, 1);
    compare(data, size, TFR_GZIP, 0);
    return 0;
}
