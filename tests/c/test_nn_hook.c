/*
 * test_nn_hook.c - the training loop's contract with a sparse gradient hook
 * (nn/nn_hook.h) on a model with an Embedding table:
 *   ids [1, 1, 3] -> Embedding(10, 2) -> Flatten -> Dense(1) -> MSE.
 * rows() is asked, in the training forward, for the batch's rows sorted and
 * unique, and what it writes there is what the forward reads; step() sees
 * the table with the rows its gradient holds (zero elsewhere); rows step()
 * adds to the list (an allreduce's union) reach the optimizer, and the next
 * backward clears them; a dense hook (sparse = 0) is told the whole table
 * and gets no tables.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "nn/nn_model_impl.h"

enum { B = 2, K = 3, ROWS = 10, D = 2 };

static NnNode node(LayerKind kind, int units, int in)
{
    NnNode nd;
    memset(&nd, 0, sizeof nd);
    nd.spec.kind = kind;
    nd.spec.units = units;
    nd.ninputs = 1;
    nd.inputs[0] = in;
    nd.shares = -1;
    return nd;
}

static Model *make_model(SgError *err)
{
    NnShape in = {1, 1, K};
    NnNode nodes[3] = {node(LAYER_EMBEDDING, D, 0), node(LAYER_FLATTEN, 0, 1),
                       node(LAYER_DENSE, 1, 2)};
    nodes[0].spec.input_dim = ROWS;
    int out = 3;
    Model *m = NULL;
    if (model_create_graph(&m, &in, 1, nodes, 3, &out, 1, err) < 0)
        return NULL;
    NnLoss mse = {NN_LOSS_MSE, 0, 0.0f, 1.0f};
    if (model_set_loss(m, &mse, err) < 0) {
        model_free(m);
        return NULL;
    }
    model_init_params(m, 7);
    return m;
}

typedef struct Log {
    int rows_calls, step_calls, ready_calls;
    int32_t asked[ROWS];
    size_t nasked;
    size_t ready_off[4], ready_cnt[4];
    int ntables;
    int32_t seen[ROWS];
    size_t nseen;
    int grads_zero_elsewhere;
    int32_t union_ids[ROWS]; /* what step() says the gradient holds after it */
    size_t nunion;
    int extra;   /* a row step() adds to the list, with gradient 1 */
    int applied; /* step()'s return */
} Log;

static int log_rows(void *ctx, float *params, const OptimRows *t, const int32_t *ids, size_t nids,
                    SgError *err)
{
    (void)err;
    Log *lg = ctx;
    lg->rows_calls++;
    lg->nasked = nids;
    memcpy(lg->asked, ids, nids * sizeof *ids);
    for (size_t i = 0; i < nids; i++) /* "the ps' current rows" */
        for (size_t j = 0; j < t->dim; j++)
            params[t->off + (size_t)ids[i] * t->dim + j] = (float)ids[i] + 0.25f * (float)j;
    return 0;
}

static int log_ready(void *ctx, float *grads, size_t offset, size_t count, SgError *err)
{
    (void)grads, (void)err;
    Log *lg = ctx;
    if (lg->ready_calls < 4)
        lg->ready_off[lg->ready_calls] = offset, lg->ready_cnt[lg->ready_calls] = count;
    lg->ready_calls++;
    return 0;
}

static int log_step(void *ctx, float *params, float *grads, size_t n, OptimRows *tables,
                    int ntables, int64_t *global_step, SgError *err)
{
    (void)params, (void)n, (void)global_step, (void)err;
    Log *lg = ctx;
    lg->step_calls++;
    lg->ntables = ntables;
    if (ntables != 1)
        return lg->applied;
    OptimRows *t = &tables[0];
    lg->nseen = t->nids;
    memcpy(lg->seen, t->ids, t->nids * sizeof *t->ids);
    lg->grads_zero_elsewhere = 1;
    for (size_t r = 0, k = 0; r < t->rows; r++) {
        const int listed = k < t->nids && t->ids[k] == (int32_t)r;
        k += listed;
        for (size_t j = 0; j < t->dim && !listed; j++)
            if (grads[t->off + r * t->dim + j] != 0.0f)
                lg->grads_zero_elsewhere = 0;
    }
    if (lg->extra >= 0) { /* the union over "ranks": one more row */
        size_t u = 0, k = 0;
        for (int32_t r = 0; r < ROWS; r++) {
            const int listed = k < t->nids && t->ids[k] == r;
            k += listed;
            if (listed || r == lg->extra)
                lg->union_ids[u++] = r;
        }
        for (size_t j = 0; j < t->dim; j++)
            grads[t->off + (size_t)lg->extra * t->dim + j] = 1.0f;
        lg->nunion = u;
        t->ids = lg->union_ids;
        t->nids = u;
    }
    return lg->applied;
}

static void test_sparse_hook(void)
{
    SgError err = {0};
    Model *m = make_model(&err);
    CHECK(m != NULL && m->ntables == 1);
    if (m == NULL) {
        fprintf(stderr, "model: %s\n", err.msg);
        return;
    }
    const size_t toff = m->touched[0].off;
    OptimConfig c;
    optim_config_default(&c, OPTIM_SGD);
    c.lr = 0.5f;
    Optimizer *opt = NULL;
    CHECK(optim_create(&opt, &c, m->nparams, &err) == 0);
    float x[B * K] = {4, 1, 4, 7, 1, 1}, y[B] = {0.5f, -0.5f};
    NnData d = nn_data(NN_F32, x, B, K, NN_F32, y, 1);
    Log lg = {0};
    lg.extra = 9, lg.applied = 0;
    NnGradHook hook = {
        .ready = log_ready, .step = log_step, .rows = log_rows, .sparse = 1, .ctx = &lg};
    float before[ROWS * D];
    memcpy(before, m->params + toff, sizeof before);
    NnStats st = {0};
    CHECK(model_train_batch(m, opt, &d, NULL, 0, B, &hook, NULL, &st, &err) == 0);
    /* rows(): once, the batch's rows sorted and unique */
    CHECK(lg.rows_calls == 1 && lg.nasked == 3);
    CHECK(lg.asked[0] == 1 && lg.asked[1] == 4 && lg.asked[2] == 7);
    /* ready(): the Dense layer's range only, never the table's */
    CHECK(lg.ready_calls == 1 && lg.ready_off[0] >= toff + ROWS * D);
    /* step(): the table with its touched rows, the gradient zero elsewhere */
    CHECK(lg.step_calls == 1 && lg.ntables == 1 && lg.nseen == 3 && lg.grads_zero_elsewhere);
    CHECK(lg.seen[0] == 1 && lg.seen[1] == 4 && lg.seen[2] == 7);
    /* the optimizer updated the union's rows: rows() values minus lr * grad,
     * row 9 by lr * 1 from its table value, the others untouched */
    for (int r = 0; r < ROWS; r++)
        for (int j = 0; j < D; j++) {
            const float now = m->params[toff + r * D + j], was = before[r * D + j];
            if (r == 1 || r == 4 || r == 7)
                CHECK(now != was && fabsf(now - ((float)r + 0.25f * (float)j)) < 5.0f);
            else if (r == 9)
                CHECK(fabsf(now - (was - 0.5f)) < 1e-6f);
            else
                CHECK(now == was);
        }
    /* the next backward clears the union's rows, row 9 included */
    lg.extra = -1;
    CHECK(model_train_batch(m, opt, &d, NULL, 0, B, &hook, NULL, &st, &err) == 0);
    CHECK(lg.step_calls == 2 && lg.grads_zero_elsewhere && lg.nseen == 3);
    for (int j = 0; j < D; j++)
        CHECK(m->grads[toff + 9 * D + j] == 0.0f);
    /* a hook that applies the update itself: the optimizer is skipped */
    lg.applied = 1;
    memcpy(before, m->params + toff, sizeof before);
    CHECK(model_train_batch(m, opt, &d, NULL, 0, B, &hook, NULL, &st, &err) == 0);
    for (int r = 0; r < ROWS; r++) /* what rows() wrote, the rest as it was */
        for (int j = 0; j < D; j++)
            CHECK(m->params[toff + r * D + j] ==
                  (r == 1 || r == 4 || r == 7 ? (float)r + 0.25f * (float)j : before[r * D + j]));
    /* a dense hook: told the whole table, given no tables, no rows() */
    Log dl = {0};
    dl.extra = -1;
    NnGradHook dense = {.ready = log_ready, .step = log_step, .rows = log_rows, .ctx = &dl};
    CHECK(model_train_batch(m, opt, &d, NULL, 0, B, &dense, NULL, &st, &err) == 0);
    CHECK(dl.rows_calls == 0 && dl.ntables == 0 && dl.ready_calls == 2);
    CHECK(dl.ready_off[1] == toff && dl.ready_cnt[1] == ROWS * D);
    optim_free(opt);
    model_free(m);
}

int main(void)
{
    test_sparse_hook();
    return check_report("test_nn_hook");
}
