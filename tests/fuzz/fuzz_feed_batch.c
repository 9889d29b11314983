/* fuzz_feed_batch.c - libFuzzer harness for the feed BATCH payload decoder
 * (feed_codec.c): decode arbitrary bytes, and for a decoded batch re-encode it
 * and check the encoding reproduces the input byte for byte. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "net/feed.h"

static FeedBatch batch, again;
static uint8_t meta[1 << 20];
static struct iovec iov[2 * FEED_MAX_COLUMNS + 1];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    SgError err;
    if (feed_batch_decode(data, size, &batch, &err) != 0)
        return 0;
    long len = feed_batch_encode(&batch, meta, sizeof meta, iov, &err);
    if (len < 0 || (size_t)len != size)
        abort();
    size_t off = 0;
    for (int i = 0; i < 2 * batch.ncols; i++) {
        if (memcmp(data + off, iov[i].iov_base, iov[i].iov_len) != 0)
            abort();
        off += iov[i].iov_len;
    }
    if (feed_schema_check(&batch, &batch, &err) != 0 ||
        feed_batch_decode(data, size, &again, &err) != 0)
        abort();
    return 0;
}
