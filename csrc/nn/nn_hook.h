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
 *   step(ctx, params, grads, n, global_step)  called once per step after
 *       backward, before the optimizer. Returns 0: the loop applies its
 *       optimizer to grads (which step() may have replaced, e.g. by the
 *       average over ranks); 1: step() already updated params itself (a
 *       parameter server applied the update and sent them back) and the
 *       loop's optimizer is skipped; < 0: a status with err filled, which
 *       ends the loop. On entry *global_step is the model's step count after
 *       this step; step() may overwrite it (the ps' global step).
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

#define NN_GRAD_HOOK_CAPSULE "sparkgrad._core.NnGradHook"

typedef struct NnGradHook {
    int (*ready)(void *ctx, float *grads, size_t offset, size_t count, SgError *err);
    int (*step)(void *ctx, float *params, float *grads, size_t n, int64_t *global_step,
                SgError *err);
    void *ctx;
} NnGradHook;

#endif /* NN_HOOK_H */
