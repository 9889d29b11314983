/*
 * coll.h - collectives among `size` ranks connected as a ring over the
 * cluster's authenticated transport: allreduce, broadcast, allgather of
 * unequal sizes, barrier, and the gradient hook of nn/nn_hook.h.
 *
 * Ring: rank r connects to rank (r + 1) % size ("right") and accepts one
 * connection from rank (r - 1) % size ("left") on its own listener. Every
 * connection does the mutual HMAC handshake of auth.h, then a HELLO naming
 * rank, size and the communicator's check (a hash of the address list), so a
 * connection from another rank or another ring is refused, naming it.
 *
 * Wire, per collective (NET_FRAME_COLL frames, flags = CollFrame):
 *   1. header allgather: size - 1 ring steps, each sends one 48-byte header
 *      frame to the right and receives one from the left, so that every rank
 *      sees every rank's header (u64 seq, u32 kind, u32 op, u32 dtype,
 *      u32 compression, i32 root, u32 rank, u64 count, u64 reserved;
 *      little-endian). Ranks that disagree (kind, op, dtype, count, root)
 *      all fail with SG_ECLUSTER naming the ranks and their values; the
 *      streams stay in step, so the communicator remains usable. A barrier is
 *      this step alone.
 *   2. data as raw bytes, lengths agreed by step 1: allreduce is a ring
 *      reduce-scatter then allgather over `size` contiguous segments, one
 *      stream each way (sends to the right and receives from the left at
 *      once on non-blocking sockets, reducing what arrives as it arrives and
 *      forwarding it as soon as it is reduced); broadcast is a pipelined relay
 *      from the root around the ring; allgather passes each rank's block
 *      size - 1 steps around.
 *
 * Security (session.h): every connection keeps one NetSession, keyed by its
 * handshake in the communicator's mode (every rank must use the same: a
 * mismatch fails the formation naming both modes). With "auth" or "encrypt"
 * every frame after the handshake is protected (HELLO, HELLO_OK, REFUSE,
 * ABORT, BYE), and so is every data stream of step 1 and 2: the bytes one
 * ring step sends one way are cut into records of at most 128 KiB (both
 * ends know the length, so the cut is implied) and each record travels as
 *   seq (u64 LE, 8) | payload | tag (16)
 * sealed under the connection's session with, as associated data, the frame
 * header (NET_FRAME_COLL, COLL_FRAME_DATA, payload length) that is not
 * sent. A receiver counts a record's bytes (reduces them, relays them,
 * moves to the next step) only after its tag checked: an altered, injected,
 * replayed or cut record fails the collective with SG_EAUTH naming the peer
 * and "integrity" (or the sequence), and breaks the ring as any failure.
 * A record is read into its destination and opened in place, so after a
 * failure the destination (an allreduce's or broadcast's buffer) may hold
 * unverified bytes, as it holds partial results after any failure.
 * "none" sends the raw streams and plain frames of before.
 * Values travel in host order (little-endian hosts only, as ps.h). With
 * compression a float32 allreduce sends fp16 or bf16 (round to nearest
 * even) and accumulates in float32; the owner of each segment rounds its
 * result to the wire format too, so every rank ends with identical values.
 *
 * Shared memory (coll_shm.c): when every rank's listener has the same host
 * and every rank can open its neighbours' segments under /dev/shm, step 1
 * and 2 move through one ring buffer per rank in shared memory instead of
 * the TCP streams (one copy instead of two, and no sealing: the bytes never
 * leave the host); the TCP connections stay for notices, goodbyes and to see
 * a neighbour die. The ranks agree on it while the ring forms.
 *
 * Failures: a transport error or timeout breaks the communicator: the rank
 * writes a notice (ABORT frame: i32 status, u32 rank, text) to its left
 * neighbour on the direction of that connection no data uses, and shuts both
 * ring connections down; each rank that reads a notice from its right fails
 * with it and passes it on, so every rank fails promptly naming the rank
 * that failed instead of waiting out its timeout. That call and every later
 * one fail, naming the peer rank and host:port (SG_ENODE when a peer closed
 * or reset the connection, SG_ETIMEOUT, SG_EPROTO). coll_comm_close between
 * collectives sends a BYE frame instead: no failure for a neighbour still
 * receiving the last collective's data.
 * Calls are serialized by a mutex; every rank must issue the same collectives
 * in the same order.
 */
#ifndef NET_COLL_H
#define NET_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"
#include "net/session.h"
#include "nn/nn_hook.h"

typedef enum CollDtype {
    COLL_F32 = 1,
    COLL_F64 = 2,
    COLL_I32 = 3,
    COLL_I64 = 4,
    COLL_BYTES = 5, /* broadcast / allgather only */
} CollDtype;

typedef enum CollOp { COLL_SUM = 1, COLL_AVERAGE = 2, COLL_MIN = 3, COLL_MAX = 4 } CollOp;

typedef enum CollCompression {
    COLL_COMP_NONE = 0,
    COLL_COMP_FP16 = 1,
    COLL_COMP_BF16 = 2
} CollCompression;

typedef enum CollFrame {
    COLL_FRAME_HELLO = 1,
    COLL_FRAME_HELLO_OK = 2,
    COLL_FRAME_REFUSE = 3,
    COLL_FRAME_HEADER = 4,
    COLL_FRAME_ABORT = 5,
    COLL_FRAME_BYE = 6,
    COLL_FRAME_DATA = 7 /* a data record's associated data (never sent as a header) */
} CollFrame;

typedef struct CollComm CollComm;

typedef struct CollStats {
    uint64_t bytes_sent, bytes_received;
    uint64_t collectives, allreduces, broadcasts, allgathers, barriers;
    double seconds; /* inside collectives */
    int broken;
    /* the gradient hook's Embedding tables (coll_hook_new, sparse_tables):
     * table reductions as rows and dense, and the bytes this rank sent for
     * them (ids and values) */
    uint64_t tables_as_rows, tables_dense, table_bytes_sent;
} CollStats;

/* Forms the ring: rank `rank` of `size`, hosts[i]:ports[i] the listener of
 * rank i, lfd this rank's listening socket (not owned; it must stay open
 * while the ring forms). Bounded by timeout seconds, which is also the default
 * per-collective timeout; an error names the rank and host:port it waited for.
 * shared_memory: when every rank's host is the same, move the data through
 * shared memory if every rank can (see "Shared memory" above); 0: TCP only. */
int coll_comm_new(int lfd, const uint8_t *secret, size_t secret_len, NetSecurity mode, int rank,
                  int size, const char *const *hosts, const int *ports, double timeout,
                  int shared_memory, CollComm **out, SgError *err);

/* 1 when the ring moves its data through shared memory. */
int coll_comm_shared_memory(const CollComm *c);

int coll_comm_rank(const CollComm *c);
int coll_comm_size(const CollComm *c);
void coll_comm_stats(CollComm *c, CollStats *out);

/* Element size of a dtype (1 for COLL_BYTES), 0 if unknown. */
size_t coll_dtype_size(int dtype);

/* In place on count values. timeout < 0: the communicator's default. */
int coll_allreduce(CollComm *c, void *buf, size_t count, CollDtype dtype, CollOp op,
                   CollCompression comp, double timeout, SgError *err);

/* In place: `bytes` bytes from root to everyone. tag is compared across ranks
 * (e.g. a NumPy type number; 0 for plain bytes). */
int coll_broadcast(CollComm *c, void *buf, size_t bytes, int root, uint32_t tag, double timeout,
                   SgError *err);

/* Broadcast of a length only the root knows: non-roots get *out (malloc'd,
 * at most max_bytes) and *out_len; the root passes data/len and gets a copy. */
int coll_broadcast_var(CollComm *c, const void *data, size_t len, int root, size_t max_bytes,
                       void **out, size_t *out_len, double timeout, SgError *err);

/* Each rank contributes len bytes; *out (malloc'd) is the concatenation in
 * rank order, lens[size] each rank's length. */
int coll_allgather(CollComm *c, const void *data, size_t len, uint64_t *lens, void **out,
                   double timeout, SgError *err);

int coll_barrier(CollComm *c, double timeout, SgError *err);

/* Shuts both ring connections down and makes every later call SG_ESTATE;
 * thread-safe (a collective blocked in another thread fails promptly). */
void coll_comm_close(CollComm *c);
void coll_comm_free(CollComm *c);

/* ---- the gradient hook of nn/nn_hook.h ----
 *
 * step() allreduces the whole float32 gradient buffer (op, compression) and
 * returns 0 so the loop applies its own optimizer to the result.
 *
 * backward_passes_per_step = k > 1: the hook keeps the sum of the local
 * gradients of k consecutive calls. On the first k - 1 calls of each cycle
 * step() only adds grads to that sum and returns 1: the loop skips its
 * optimizer and params stay untouched. On the k-th call grads is replaced by
 * (sum of the k local gradients) / k, allreduced with op (so with "average"
 * it is the mean over k passes and every rank), and step() returns 0.
 *
 * bucket_bytes > 0: ready() gathers the ranges it is told about (from the end
 * of the buffer towards 0) into buckets of at least bucket_bytes and hands
 * each to a background thread that allreduces it while backward goes on;
 * step() reduces what no bucket covered and waits for all. bucket_bytes = 0:
 * ready() does nothing and step() reduces the whole buffer at once.
 *
 * Embedding tables (nn_hook.h's sparse hooks). sparse_tables = 1 and k = 1:
 * the hook is sparse. step() first reduces everything but the tables as
 * above (buckets included), then the tables, with O(1) collectives a step
 * whatever their number:
 *   1. one allgather of int32 blocks, one per rank:
 *        ntables, then (rows, dim, nids) per table, then each table's ids;
 *      a rank whose tables differ in number or shape fails every rank with
 *      SG_ECLUSTER naming it and the table; ids out of order or out of range
 *      fail with SG_EPROTO naming the rank and table.
 *   2. per table t the sorted union U_t of every rank's ids (|U_t| = u).
 *   3. the rule, the same on every rank since all see all blocks: with p
 *      ranks and w bytes a value on the wire (4; 2 with fp16 or bf16) the
 *      ring sends per rank
 *        as rows: 2 (p - 1) / p * u * dim * w
 *        dense:   2 (p - 1) / p * rows * dim * w
 *      and both need step 1 (the optimizer updates the union's rows alone
 *      either way, so the ids travel on both paths). So a table goes as rows
 *      when u < rows, dense when u == rows (the steps touched every row: the
 *      same bytes, without the copies in and out of the packed buffer).
 *   4. one allreduce (op, compression) of every rows table's union rows
 *      packed into one [sum u_t * dim_t] buffer (zeros for rows a rank did
 *      not touch: its gradient is zero there), unpacked into grads; then one
 *      in-place allreduce per dense table's range (zero outside the union,
 *      since every rank's gradient is).
 *   5. tables[t].ids/nids point at U_t (the hook's memory, valid until its
 *      next step()), so the loop's optimizer updates those rows alone: lazily
 *      for SGD with momentum and Adam, as single-process training does.
 * The comm's stats count each table reduction as rows or dense and the bytes
 * steps 1 and 4 sent (CollStats.tables_as_rows, tables_dense,
 * table_bytes_sent). sparse_tables = 0, or k > 1: the hook is dense (tables
 * reduced whole with the rest, the optimizer updating them densely). */
typedef struct CollHook CollHook;

int coll_hook_new(CollComm *c, CollOp op, CollCompression comp, int backward_passes_per_step,
                  size_t bucket_bytes, int sparse_tables, CollHook **out, SgError *err);
/* The NnGradHook inside (valid while the hook lives). */
NnGradHook *coll_hook_iface(CollHook *h);
/* Stops and joins the background thread, frees. */
void coll_hook_free(CollHook *h);

#endif /* NET_COLL_H */
