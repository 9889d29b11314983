/* fuzz_tfrecord.c - libFuzzer harness for TFRecord framing: the input is read
 * as a plain, a ZLIB and a GZIP stream, with and without CRC checks. Every
 * outcome must be a record, a clean end or an error status: no crash, no
 * leak, no read outside the input, no allocation beyond what the input holds. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "record/tfrecord.h"

static void drain(const uint8_t *data, size_t size, TfrCompression comp, int verify)
{
    SgError err;
    TfrReader *r = NULL;
    if (tfr_reader_open_memory(&r, data, size, comp, verify, "fuzz", &err) < 0)
        return;
    const uint8_t *d;
    size_t len;
    uint64_t sum = 0;
    while (tfr_reader_next(r, &d, &len, &err) == 1)
        for (size_t i = 0; i < len; i += 64)
            sum += d[i]; /* touch the record so ASan checks its bounds */
    (void)sum;
    tfr_reader_close(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    drain(data, size, TFR_NONE, 1);
    drain(data, size, TFR_NONE, 0);
    drain(data, size, TFR_ZLIB, 1);
    drain(data, size, TFR_GZIP, 0);
    const uint8_t *d;
    size_t len, used;
    SgError err;
    size_t off = 0;
    while (off < size && tfr_parse_one(data + off, size - off, off, 1, &d, &len, &used, &err) == 1)
        off += used;
    return 0;
}
