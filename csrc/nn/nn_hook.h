/*
 * nn_hook.h - how a distribution strategy plugs into the C training loop.
 *
 * A training step is gather -> forward -> backward -> update. A gradient hook
 * lets something outside nn/ (the allreduce communicator of net/coll*.c, the
 * parameter-server client of net/ps_client.c) see the gradients between
 * backward and update, without the loop returning to Python:
 *
 *   ready(ctx, grads, offset, count)  optional; called during backward as soon
 *       as grads[offset, offset + count) are final, one call per layer that
 *       has parameters, last layer first (so the ranges walk the flat buffer
 *       from its end towards 0). It may start reducing them in the background
 *       (buckets, as DDP does) but must not write outside that range before
 *       step() is called. NULL: not told.
 *   step(ctx, params, grads, n, tables, ntables, global_step)  called once per step after
 *       backward, before the optimizer. Returns 0: the loop applies its
 *       optimizer to grads (which step() may have replaced, e.g. by the
 *       average over ranks); 1: step() already updated params itself (a
 *       parameter server applied the update and sent them back) and the
 *       loop's optimizer is skipped; < 0: a status with err filled, which
 *       ends the loop. On entry *global_step is the model's step count after
 *       this step; step() may overwrite it (the ps' global step).
 *
 * Embedding tables (nn_op_embedding.c), whose gradient is a set of rows:
 *   sparse = 0  the hook sees them as any other range: ready() is told each
 *       table's whole range, step() gets ntables = 0 and may write any row;
 *       the loop's optimizer then updates the tables densely and the next
 *       backward clears their gradient ranges whole.
 *   sparse = 1  the tables stay rows: ready() is never told a table's range,
 *       and step() gets tables[0..ntables) (nn_optim.h's OptimRows: each
 *       table's place in the flat buffer and the rows its gradient holds,
 *       sorted and unique; zero elsewhere). step() may change a table's ids
 *       and nids to say which rows its gradient holds after it (the union
 *       over ranks, say), pointing at memory of its own that stays valid
 *       until its next call (the loop copies them into the model's own
 *       buffers as soon as step() returns), and must leave the rest of the
 *       range zero. The loop's optimizer (step() returned 0) updates those
 *       rows alone.
 *   rows(ctx, params, table, ids, nids)  optional (sparse hooks): called in a
 *       training forward by each Embedding call before it reads its table,
 *       with the rows the batch reads (sorted, unique); it may bring them up
 *       to date in params (a parameter server's current rows). NULL: the
 *       table is read as it is.
 *
 * With a hook the loop never folds the SGD update into the weight-gradient
 * products (that path leaves no gradients to hand over).
 *
 * Python: an object that offers a hook has a method grad_hook(...) returning a
 * PyCapsule named NN_GRAD_HOOK_CAPSULE whose pointer is an NnGradHook; the
 * capsule keeps the object alive (capsule context holds a reference, released
 * by the capsule's destructor), so the hook stays valid while the capsule is.
 * The loop calls the hook with the GIL released; ready/step must not touch
 * Python objects.
 */
#ifndef NN_HOOK_H
#define NN_HOOK_H

#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"
#include "nn/nn_optim.h"

#define NN_GRAD_HOOK_CAPSULE "sparkgrad._core.NnGradHook"

typedef struct NnGradHook {
    int (*ready)(void *ctx, float *grads, size_t offset, size_t count, SgError *err);
    int (*step)(void *ctx, float *params, float *grads, size_t n, OptimRows *tables, int ntables,
                int64_t *global_step, SgError *err);
    int (*rows)(void *ctx, float *params, const OptimRows *table, const int32_t *ids, size_t nids,
                SgError *err);
    int sparse;
    void *ctx;
} NnGradHook;

#endif /* NN_HOOK_H */
