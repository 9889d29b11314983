/*
 * ps.h - the parameter server: a flat float32 parameter buffer of `total`
 * values split into num_ps contiguous shards (ps_shard_range_rows, the one
 * split both sides use: whole rows of the model's embedding tables); each
 * PsServer owns one shard, each worker's PsClient talks to every shard.
 *
 * Wire (frame version 2): NET_FRAME_PS frames, flags = PsOp; payload =
 * 32-byte little-endian op header (u64 a, b, c, d) followed by the op's data:
 *   HELLO      a=worker_id | tables << 32 b=total c=offset d=count, tables x
 *              (u64 off, rows, dim): the model's embedding tables, which must
 *              be the shard's (SG_ECLUSTER naming the table otherwise)
 *                                                    -> a=step b=initialized c=num_workers d=mode
 *   PULL       -                                     -> a=step, count floats
 *   PUSH       a=wire, count gradients              -> a=step after apply
 *   PUSH_PULL  a=wire, count gradients              -> a=step, count floats (params after apply)
 *              (wire PS_WIRE_F32: float32; PS_WIRE_BF16: bf16, 2 bytes each, rounded
 *              to nearest even, widened to float32 by the shard before it applies
 *              or accumulates them)
 *   INIT       count floats                          -> a=step b=1 if this call initialized
 *   SET_STATE  a=step b=optimizer step c=k d=has_optimizer_state,
 *              count + k floats (params, then the optimizer state;
 *              d = 0 leaves the optimizer as it is)  -> a=step
 *   GET_STATE  -                                     -> a=step b=optimizer step c=k
 *                                                       d=has_optimizer, count + k floats
 *   DONE       -                                     -> a=step
 *   WAIT_OTHERS a=timeout in ms                      -> a=step, count floats, once every
 *              other worker said DONE (the final parameters, for the chief's last
 *              checkpoint and evaluation); SG_ETIMEOUT / SG_ECANCELLED otherwise
 *   PUT_STATE  a=n, n floats (the worker's model state) -> a=workers whose state
 *              the shard holds b=n
 *   MEAN_STATE a=n expected                          -> a=workers averaged b=n, n floats
 *              (their elementwise mean); a=0 b=0 and no data while no worker put any
 *   PULL_ROWS  a=table b=k, k int32 row ids (sorted, unique, all on this shard)
 *                                                    -> a=step, k * dim floats (the rows)
 *   PUSH_PULL_ROWS a=wire b=e c=k d=r, e entries (u32 table, u32 n; tables
 *              ascending), k int32 ids (each entry's n in turn), then in the
 *              wire format the shard's dense segments' gradients (every float
 *              outside the tables' rows, in order) and r row gradients (each
 *              id's dim)                             -> a=step after apply, the
 *              dense segments' floats (rows come back by PULL_ROWS)
 *   any        -> ERROR a=status code (int64), data = message text
 * Floats travel in host order: sparkgrad supports little-endian hosts only.
 *
 * Security (session.h): server and client agree on a mode in the handshake;
 * under "auth" or "encrypt" every frame after it, both ways (requests,
 * replies, errors), carries a seq and a tag. The shard reads a request's
 * data straight into its buffers but acts on it (applies a gradient, sets
 * parameters or optimizer state) only once the frame's tag checked; a frame
 * that fails its check closes that connection (SG_EAUTH naming the peer,
 * frame type and seq, answered with an error frame when the send direction
 * is still intact) and the shard keeps serving the others.
 *
 * Async mode applies each gradient as it arrives (global step += 1 per push).
 * Sync mode sums exactly one gradient per active worker per step, applies the
 * average, bumps the step and only then answers those pushes; a worker that
 * says DONE stops being waited for, one that disconnects without DONE breaks
 * the step for everyone (SG_ENODE naming it) instead of hanging them.
 *
 * Model state (non-trainable: BatchNorm's moving mean and variance) is not
 * a gradient: each worker updates its own while it trains and puts it with
 * PUT_STATE; whoever reads it (the chief's checkpoint, the final model) gets
 * the mean over the workers that put one, as Keras' MirroredStrategy reads
 * its SyncOnRead variables. A shard keeps each worker's last state (one
 * buffer per worker id, replaced by its next PUT_STATE), under a lock of its
 * own so that a put never waits on a synchronous step; every worker must put
 * the same n (SG_ECLUSTER naming both sizes otherwise), at most PS_STATE_MAX.
 * Every shard accepts the two ops; the client sends them to shard 0 alone
 * (the state is small), so only shard 0 holds it.
 *
 * Embedding tables (PsServerConfig.tables, the client's at connect): a
 * shard holds whole rows of them, and a table may span several shards. A
 * sparse hook (ps_client_grad_hook) pushes each step's touched rows with
 * PUSH_PULL_ROWS and pulls the rows a forward reads with PULL_ROWS, so a
 * step costs the rows it uses, not the table. The shard adds pushed rows
 * into its accumulator and marks them; applying (per push in async mode,
 * once per step in sync mode: the union of the workers' rows, the sum
 * scaled by 1 / workers as any sync step) touches the dense segments and the
 * marked rows alone: optim_step_rows on the shard's tables in shard
 * coordinates (SGD, Adagrad: what the dense update gives; SGD's momentum and
 * Adam lazily, as torch.optim.SparseAdam; other optimizers update the
 * tables densely), or the apply function per segment and per row. A sync
 * step in which some worker pushed dense (PUSH_PULL) is applied densely.
 * Gradient rows travel as f32 or bf16 (ps_client_set_wire), rows and
 * parameters as f32. Rows of a table the shard does not hold, ids outside
 * it, out of order or of an unknown table: SG_EINVAL naming the table, row,
 * peer and shard, answered with an error frame (the connection stays
 * usable); counts beyond the shard are SG_EPROTO from the op header, before
 * anything is allocated for them. A peer of frame version 1 is refused by
 * the frame header check, which names both versions.
 *
 * Optimizer state lives on the ps: a shard configured with an Optimizer
 * (nn/nn_optim.h, created for `count` values) applies every gradient (async)
 * or every step's average (sync) with it, under the shard lock, and its state
 * and step travel with the parameters in GET_STATE / SET_STATE. Clipping by
 * global norm needs the norm of the whole gradient, which one shard of several
 * cannot see: ps_server_new refuses it unless the shard holds every
 * parameter (num_ps = 1).
 */
#ifndef NET_PS_H
#define NET_PS_H

#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"
#include "net/session.h"
#include "nn/nn_hook.h"
#include "nn/nn_optim.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the parameter-server wire format sends float32 in host order: little-endian hosts only"
#endif

typedef enum PsOp {
    PS_OP_HELLO = 1,
    PS_OP_PULL = 2,
    PS_OP_PUSH = 3,
    PS_OP_PUSH_PULL = 4,
    PS_OP_INIT = 5,
    PS_OP_SET_STATE = 6,
    PS_OP_DONE = 7,
    PS_OP_GET_STATE = 8,
    PS_OP_WAIT_OTHERS = 9,
    PS_OP_PUT_STATE = 10,
    PS_OP_MEAN_STATE = 11,
    PS_OP_PULL_ROWS = 12,
    PS_OP_PUSH_PULL_ROWS = 13,
    PS_OP_REPLY = 100,
    PS_OP_ERROR = 101,
} PsOp;

typedef enum PsWire { PS_WIRE_F32 = 0, PS_WIRE_BF16 = 1 } PsWire;

typedef enum PsMode { PS_MODE_ASYNC = 0, PS_MODE_SYNC = 1 } PsMode;

#define PS_OP_HEADER 32

/* Floats of model state one PUT_STATE may carry (1 GiB): refused, before
 * anything is allocated for it, above this. */
#define PS_STATE_MAX ((uint64_t)1 << 28)

/* Applies grads (n) to params (n); returns 0 or a status with err filled.
 * Called with the shard locked, never concurrently. */
typedef int (*PsApplyFn)(void *ctx, float *params, const float *grads, size_t n, SgError *err);

/* Built-in: params -= lr * grads, ctx points to a float lr. */
int ps_apply_sgd(void *ctx, float *params, const float *grads, size_t n, SgError *err);

/* Shard `index` of `num_shards` over `total` values: [*offset, *offset + *count).
 * Shards differ in size by at most one value; SG_EINVAL for bad arguments. */
int ps_shard_range(uint64_t total, int num_shards, int index, uint64_t *offset, uint64_t *count,
                   SgError *err);

/* Embedding tables (nn_optim.h's OptimRows: off, rows, dim; ids unused) at
 * most a model may have on the ps wire. */
#define PS_TABLES_MAX 4096

/* SG_EINVAL naming the table unless tables[0..ntables) (at most
 * PS_TABLES_MAX) are non-empty, sorted by off, apart and inside total. */
int ps_tables_check(uint64_t total, const OptimRows *tables, int ntables, SgError *err);

/* ps_shard_range with whole table rows (tables as ps_tables_check wants them): a split point inside
 * a row of one of tables[0..ntables) (sorted by off, not overlapping) moves down to that row's
 * start. SG_EINVAL when a shard would be left empty. Both ends use it. */
int ps_shard_range_rows(uint64_t total, const OptimRows *tables, int ntables, int num_shards,
                        int index, uint64_t *offset, uint64_t *count, SgError *err);

/* The rows of one table a shard holds: global rows [row0, row0 + nrows) at
 * float `off` of the shard (its local coordinates). */
typedef struct PsTable {
    int index; /* in the model's list of tables */
    uint64_t row0, nrows, dim, off;
} PsTable;

/* The tables' rows shard [offset, +count) holds, in order, into out
 * (ntables entries at most); returns how many. The shard's other floats
 * are its dense segments. */
int ps_shard_tables(uint64_t offset, uint64_t count, const OptimRows *tables, int ntables,
                    PsTable *out);

/* The dense segments of a shard of count floats holding tables[0..n)
 * (ps_shard_tables): [segs[i][0], segs[i][1]) in shard coordinates, in
 * order, empty ones left out; returns how many (at most n + 1). */
int ps_dense_segments(const PsTable *tables, int n, uint64_t count, uint64_t (*segs)[2]);

/* Encodes / decodes the 32-byte op header. */
void ps_op_encode(uint8_t out[PS_OP_HEADER], uint64_t a, uint64_t b, uint64_t c, uint64_t d);
void ps_op_decode(const uint8_t in[PS_OP_HEADER], uint64_t v[4]);

/* One NET_FRAME_PS frame of op: the op header v, then data and data2 (either
 * may be empty), sent as pieces. what names it in I/O errors. */
int ps_send_op(int fd, NetSession *s, int op, const uint64_t v[4], const void *data, size_t len,
               const void *data2, size_t len2, double deadline, const char *peer, const char *what,
               SgError *err);

/* Both ends, for a frame whose (not yet verified) header or op header broke
 * a rule (rc, err filled by the caller): on a protected connection reads the
 * frame's remaining `left` payload bytes and its tag, so that an altered
 * frame is named as such (SG_EAUTH, err replaced) rather than by what the
 * alteration made of it. Otherwise (also on a plain connection, where
 * nothing is read) the frame was as its sender wrote it: returns rc. */
int ps_frame_drain_check(int fd, NetSession *s, uint8_t type, size_t left, double deadline,
                         const char *peer, int rc, SgError *err);

/* ---- server ---- */

typedef struct PsServer PsServer;

typedef struct PsServerConfig {
    uint64_t total, offset, count; /* this shard: [offset, offset + count) of total */
    int num_workers;
    PsMode mode;
    PsApplyFn apply; /* NULL: optim if set, else ps_apply_sgd with lr */
    void *apply_ctx;
    float lr;
    /* Optional optimizer for `count` values (not owned: keep it alive until
     * ps_server_free; the server alone steps it, under the shard lock). Its
     * state and step are part of get_state/set_state. */
    Optimizer *optim;
    const float *init; /* count initial values, or NULL: wait for a worker's INIT */
    uint64_t step;
    /* Seconds a connection may take to authenticate; 0: 10 s. Connections
     * that have not authenticated are capped (accept.h); a worker's buffer
     * (count floats) is allocated only once it has authenticated. */
    double auth_timeout;
    /* The mode every worker connection must use (a worker with another is
     * refused, both modes named). Zero-initialized: NET_SEC_NONE; the
     * bindings pass NET_SEC_DEFAULT unless told otherwise. */
    NetSecurity security;
    /* The model's embedding tables (global offsets, sorted; ids unused;
     * copied), at most PS_TABLES_MAX: the shard then takes their rows
     * (PULL_ROWS, PUSH_PULL_ROWS) and checks each worker's layout at HELLO.
     * The shard must not cut a row (ps_shard_range_rows). */
    const OptimRows *tables;
    int ntables;
} PsServerConfig;

/* Serves on the listening socket lfd (not owned: the caller closes it). */
int ps_server_new(int lfd, const uint8_t *secret, size_t secret_len, const PsServerConfig *cfg,
                  PsServer **out, SgError *err);

/* Accepts and serves workers (a thread per connection) until every worker
 * said DONE (returns 1), ps_server_stop was called (returns 2), or timeout
 * seconds passed (timeout < 0: none; returns 0). Then closes every worker
 * connection and joins their threads. */
int ps_server_serve(PsServer *s, double timeout, SgError *err);

/* Thread-safe, idempotent: makes serve return promptly. */
void ps_server_stop(PsServer *s);

/* Connections closed because a frame failed its integrity check (or its
 * seq was not the expected one) since ps_server_new; the last such error
 * into *last if not NULL (code 0 when there was none). Thread-safe. */
uint64_t ps_server_integrity_failures(PsServer *s, SgError *last);

/* One shard's optimizer state: its step and len floats (state may be NULL
 * when len is 0, e.g. SGD without momentum, whose step still matters for
 * learning-rate schedules). */
typedef struct PsOptState {
    int64_t step;
    float *state;
    size_t len;
    int present; /* client side: this shard has an optimizer / restore it */
} PsOptState;

/* Floats of optimizer state (0 without an optimizer or with a stateless one). */
size_t ps_server_optim_state_size(const PsServer *s);

/* Copies the shard into params (count values), its step and, if opt_state is
 * not NULL, the optimizer's state (ps_server_optim_state_size floats) and
 * step (*opt_step; 0 without an optimizer), all under one lock. */
int ps_server_get_state(PsServer *s, float *params, uint64_t *step, float *opt_state,
                        int64_t *opt_step, SgError *err);
/* Overwrites params and step; opt (len must equal ps_server_optim_state_size)
 * restores the optimizer, or NULL leaves it as it is. */
int ps_server_set_state(PsServer *s, const float *params, uint64_t step, const PsOptState *opt,
                        SgError *err);
uint64_t ps_server_step(PsServer *s);
void ps_server_free(PsServer *s);

/* ---- client ---- */

typedef struct PsClient PsClient;

/* Connects to num_ps shards (hosts[i]:ports[i] serves shard i), authenticates
 * in `security` mode (the shards' own) and says HELLO as worker_id; every
 * call is bounded by timeout seconds. tables[0..ntables) (NULL, 0: none) are
 * the model's embedding tables: they decide the split (ps_shard_range_rows)
 * and the shards check them at HELLO. */
int ps_client_connect(const char *const *hosts, const int *ports, int num_ps, const uint8_t *secret,
                      size_t secret_len, NetSecurity security, uint64_t total,
                      const OptimRows *tables, int ntables, int worker_id, double timeout,
                      PsClient **out, SgError *err);

/* One op on every shard: PS_OP_PULL (into dest), PS_OP_PUSH (data: the
 * gradients), PS_OP_PUSH_PULL (both), PS_OP_INIT (data: the parameters, set
 * if no worker did yet; *initialized = 1 if this call did them). data and
 * dest hold `total` floats or are NULL; *step (NULL: not wanted) is the
 * global step of shard 0. */
int ps_client_exchange(PsClient *c, int op, const float *data, float *dest, uint64_t *step,
                       int *initialized, SgError *err);
/* Gradients of later pushes travel as `wire` (PS_WIRE_BF16 halves the bytes;
 * parameters always travel as float32). */
int ps_client_set_wire(PsClient *c, PsWire wire, SgError *err);
int ps_client_num_ps(const PsClient *c);
/* Restores every shard: params (total floats), the global step and, if opt
 * is not NULL, each shard's optimizer state (opt[num_ps]; present = 0 leaves
 * that shard's optimizer as it is). */
int ps_client_set_state(PsClient *c, const float *params, uint64_t step, const PsOptState *opt,
                        SgError *err);
/* Reads every shard: params (total floats), the global step (shard 0) and
 * each shard's optimizer state into opt[num_ps] (present = 0 for a shard
 * without optimizer; state malloc'd, NULL when len is 0; release with
 * ps_opt_states_free). */
int ps_client_get_state(PsClient *c, float *params, uint64_t *step, PsOptState *opt, SgError *err);
void ps_opt_states_free(PsOptState *opt, int n);
int ps_client_done(PsClient *c, SgError *err);
/* Waits up to `timeout` seconds until every other worker said DONE, then
 * fills params (total floats) with the final parameters. */
int ps_client_wait_others(PsClient *c, float *params, uint64_t *step, double timeout, SgError *err);
/* Puts this worker's model state (n floats, the same n on every worker, at
 * most PS_STATE_MAX) on shard 0, replacing the one it put before; *holders
 * is the number of workers whose state the shard now holds. */
int ps_client_put_state(PsClient *c, const float *state, size_t n, int *holders, SgError *err);
/* Fills state (n floats) with the elementwise mean of the model states the
 * workers put (accumulated in double); *workers is how many were averaged.
 * *workers = 0 when none put any yet: state is left as it is. SG_ECLUSTER
 * when n is not the size they put. On a failure state's contents are
 * unspecified. */
int ps_client_mean_state(PsClient *c, float *state, size_t n, int *workers, SgError *err);
/* The gradient hook (nn/nn_hook.h) of the training loop on this client: its
 * step() pushes the gradients, pulls the parameters the ps updated with them
 * into params, sets *global_step to the ps' step and returns 1 (the loop's
 * optimizer is skipped: the ps applied the update). No ready(). With sparse
 * (and tables given at connect) the tables travel as rows: step() pushes the
 * touched rows (PUSH_PULL_ROWS) and pulls the dense segments alone, rows()
 * pulls the rows a forward reads (PULL_ROWS); the rest of each local table
 * is then stale (pull everything before reading it). The hook is valid
 * while c is. */
void ps_client_grad_hook(PsClient *c, int sparse, NnGradHook *out);
/* Rows ids[0..nids) (sorted, unique) of table `index` (of the tables given
 * at connect) from the shards holding them into params (total floats). */
int ps_client_pull_rows(PsClient *c, float *params, int index, const int32_t *ids, size_t nids,
                        SgError *err);
/* Bytes this client sent and received on every shard connection (frame
 * headers and payloads; a protected session's seq and tag not counted). */
void ps_client_bytes(PsClient *c, uint64_t *sent, uint64_t *received);

/* Closes every shard connection (later calls fail with SG_ESTATE);
 * thread-safe. ps_client_free closes and frees. */
void ps_client_close(PsClient *c);
void ps_client_free(PsClient *c);

#endif /* NET_PS_H */
