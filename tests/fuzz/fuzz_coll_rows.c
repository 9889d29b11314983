/* fuzz_coll_rows.c - libFuzzer harness for the sparse gradient hook's table
 * block (coll_rows.c, the wire in net/coll.h): the input, copied to an
 * aligned buffer, is checked as a peer's block against two tables; a block
 * accepted must list, per table, ids sorted, unique and below its rows, all
 * inside the input. Run with `make fuzz`. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/coll_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const OptimRows tables[2] = {{100, 50, 3, NULL, 0}, {300, 20, 2, NULL, 0}};
    int32_t *b = malloc(size ? size : 1);
    if (b == NULL)
        return 0;
    memcpy(b, data, size);
    const int32_t *ids[2];
    size_t cnt[2];
    SgError err;
    if (coll_rows_check_block(b, size, 1, tables, 2, ids, cnt, &err) == 0) {
        for (int t = 0; t < 2; t++) {
            const uint8_t *lo = (const uint8_t *)ids[t], *end = (const uint8_t *)b + size;
            if (cnt[t] > tables[t].rows || lo < (const uint8_t *)b ||
                (size_t)(end - lo) < cnt[t] * sizeof(int32_t))
                abort();
            for (size_t k = 0; k < cnt[t]; k++)
                if (ids[t][k] < 0 || (size_t)ids[t][k] >= tables[t].rows ||
                    (k > 0 && ids[t][k] <= ids[t][k - 1]))
                    abort();
        }
    }
    free(b);
    return 0;
}
