/* fuzz_ps_rows.c - libFuzzer harness for a ps shard's embedding rows
 * (ps_rows.c): the input is a PUSH_PULL_ROWS request (32-byte op header,
 * then its entries, ids and f32 gradients) to a shard holding rows of two
 * tables and two dense segments. A request the checks pass must add and
 * apply without error and leave the accumulator zero; one they refuse must
 * leave it untouched; a layout check of the same bytes never reads past
 * them. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/ps.h"
#include "net/ps_rows.h"

/* dense [0, 6), table 0: 10 rows of 3 at 6, dense [36, 40), table 1: 5 rows of 2
 * at 40; the shard [24, 50): rows 6..9 of table 0, table 1, dense [36, 40) */
#define TOTAL 50
static const OptimRows LAYOUT[2] = {{6, 10, 3, NULL, 0}, {40, 5, 2, NULL, 0}};

static PsShardRows rows;
static float params[26], accum[26];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    SgError err;
    if (rows.layout == NULL) {
        PsServerConfig cfg = {
            .total = TOTAL, .offset = 24, .count = 26, .tables = LAYOUT, .ntables = 2};
        if (ps_rows_init(&rows, &cfg, &err) != 0)
            abort();
    }
    uint64_t v[4];
    size_t aux, nvals;
    if (size < PS_OP_HEADER)
        return 0;
    ps_op_decode(data, v);
    if (size - PS_OP_HEADER >= 48)
        ps_rows_check_layout(&rows, "fuzz", 2, data + PS_OP_HEADER, &err);
    if (ps_rows_push_size(&rows, "fuzz", v, &aux, &nvals, &err) != 0 ||
        size - PS_OP_HEADER != aux + nvals * sizeof(float))
        return 0;
    uint8_t *a = malloc(aux + 1);
    float *vals = malloc(nvals * sizeof(float) + 1);
    if (a == NULL || vals == NULL)
        abort();
    memcpy(a, data + PS_OP_HEADER, aux);
    memcpy(vals, data + PS_OP_HEADER + aux, nvals * sizeof(float));
    float lr = 0.5f;
    if (ps_rows_push(&rows, "fuzz", v, a, vals, NULL, &err) == 0) {
        if (ps_rows_push(&rows, "fuzz", v, a, vals, accum, &err) != 0 ||
            ps_rows_apply(&rows, params, accum, 0.5f, NULL, ps_apply_sgd, &lr, &err) != 0)
            abort();
    }
    for (size_t i = 0; i < 26; i++)
        if (accum[i] != 0.0f)
            abort();
    free(a);
    free(vals);
    return 0;
}
