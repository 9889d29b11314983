/*
 * coll_internal.h - what the files of the ring communicator (coll.h) share
 * and nothing outside csrc/net/coll*.c uses:
 *   coll_ring.c  forming the ring (handshake, HELLO), the communicator's life
 *                (close, free, stats), entering a collective and the header
 *                exchange that starts it
 *   coll_xfer.c  the transfer engine (ring steps both ways at once) and its
 *                two sealers (plain streams, sealed records), failure notices
 *   coll.c       the collectives: what each ring step sends and receives
 *   coll_ops.c   element sizes, fp16 conversions, reduction kernels
 *   coll_rows.c  the gradient hook's Embedding tables, reduced as rows
 *   coll_shm.c   the shared-memory links of a ring on one host
 * coll_hook.c uses coll.h and coll_rows.c's part below.
 */
#ifndef NET_COLL_INTERNAL_H
#define NET_COLL_INTERNAL_H

#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "net/coll.h"
#include "net/sock.h"

#define COLL_TMP_BYTES (256u << 10) /* c->tmp and c->stage: a receive chunk, a send batch */
/* Seconds a waiting collective keeps looking (a socket polled without
 * blocking, or a shared ring re-read) before it sleeps, when the ranks of
 * this host fit its CPUs (c->spin): see coll_xfer.c. */
#define COLL_SPIN_SECONDS 100e-6

typedef struct CollSealer CollSealer;
typedef struct CollShm CollShm;

struct CollComm {
    int rank, size, left, right;
    int fd_left, fd_right;
    char left_peer[NET_PEER_MAX], right_peer[NET_PEER_MAX];
    double timeout, cur_timeout;
    uint64_t check, seq;
    pthread_mutex_t mu;
    int closed, broken;
    SgError broken_err;
    CollStats stats;
    uint8_t *tmp, *stage; /* COLL_TMP_BYTES each */
    NetSecurity mode;
    const CollSealer *sealer; /* how data crosses both connections (coll_sealer(mode)) */
    NetSession sleft, sright; /* the sessions of fd_left (server side) and fd_right (client) */
    char *peers;              /* size * NET_PEER_MAX: "host:port" of every rank */
    int right_eof; /* the right neighbour closed its end (fine once nothing is left to send) */
    int spin;      /* waits poll for COLL_SPIN_SECONDS before sleeping (coll_xfer.c) */
    CollShm *shm;  /* every link in shared memory (coll_shm.c), or NULL: TCP */
    int have_notice, notice_code, notice_origin;
    char notice[SG_ERROR_MAX - 100]; /* the first failure, passed to the left */
};

/* ---- coll_ring.c: entering a collective, its header ---- */

enum { KIND_ALLREDUCE = 1, KIND_BROADCAST, KIND_BROADCAST_VAR, KIND_ALLGATHER, KIND_BARRIER };

/* The per-collective header (coll.h, docs/design/net.md). */
typedef struct CollHeader {
    uint64_t seq, count;
    uint32_t kind, op, dtype, comp, rank;
    int32_t root;
} CollHeader;

/* The header fields every rank must agree on (coll_begin's mask). */
enum {
    AGREE_KIND = 1u << 0,
    AGREE_OP = 1u << 1,
    AGREE_DTYPE = 1u << 2,
    AGREE_COMP = 1u << 3,
    AGREE_COUNT = 1u << 4,
    AGREE_ROOT = 1u << 5,
    AGREE_TAG = 1u << 6,
};

/* An allgather of fixed-size blocks (blocks[size * blk], this rank's at
 * blocks + rank * blk) as size - 1 ring steps; errors say "<what> (the
 * <unit> of rank r)". */
int coll_allgather_blocks(CollComm *c, uint8_t *blocks, size_t blk, double deadline,
                          const char *what, const char *unit, SgError *err);

/* Locks c and checks it can run a collective; sets *deadline (timeout < 0:
 * the communicator's). On failure c is unlocked. */
int coll_enter(CollComm *c, double timeout, double *deadline, SgError *err);

/* Counts the collective begun at t0 and unlocks c; returns rc. */
int coll_leave(CollComm *c, double t0, int rc);

/* Starts the next collective: numbers it (mine->seq, and `what` = "<kind>
 * #seq" for every message about it), exchanges this rank's header with every
 * rank's and checks that they agree on the fields in mask (AGREE_*). hs (size
 * entries) receives every rank's header when not NULL. A ring of one agrees
 * with itself. */
int coll_begin(CollComm *c, CollHeader *mine, const char *kind, unsigned mask, char *what,
               size_t what_len, CollHeader *hs, double deadline, SgError *err);

const char *coll_dtype_name(uint32_t dtype);
const char *coll_comp_name(uint32_t comp);

/* ---- coll_xfer.c: the transfer engine ---- */

/* One direction of one ring step: len wire bytes at ptr. A send with
 * compression reads the float32 values at ptr and sends them encoded. A
 * receive with consume set goes through c->tmp to the transfer's consume,
 * which gets ptr; without, the bytes land at ptr as they arrive. */
typedef struct CollSpan {
    uint8_t *ptr;
    size_t len;
    int consume;
} CollSpan;

/* A transfer: `steps` ring steps, each sending one span to the right while
 * receiving one from the left. The two directions step on their own, so a
 * send step fed by a receive step (lag) goes out as its bytes arrive and are
 * consumed: no step waits for the one before it to complete, and the send
 * never runs ahead of what exists. */
typedef struct CollXfer CollXfer;
struct CollXfer {
    int steps;
    /* >= 0: send step j carries the bytes receive step j - lag brings (0: a
     * relay, 1: the allreduce), so only those received and consumed go out;
     * < 0: every send is ready from the start */
    int lag;
    CollSpan tx, rx; /* the current steps' spans (given, with one step and no next) */
    /* fills step j's span (send: tx, else rx), for every step from 0 */
    void (*next)(CollXfer *x, int j, int send, CollSpan *span);
    /* n wire elements of receive step j, which belong at element `elem` of its span (base) */
    void (*consume)(CollXfer *x, int j, uint8_t *base, size_t elem, const uint8_t *wire, size_t n);
    size_t wsz;           /* wire bytes per element, with consume */
    CollCompression comp; /* the encoding of sends */
    int from_rank;        /* whose data arrives (for timeouts); -1: the left neighbour's */
    const char *what;     /* the transfer in messages, or describe(step) when set: */
    const char *(*describe)(const CollXfer *x, int step, char *out, size_t cap);
};

/* Runs x to its end before deadline, or fails breaking the communicator
 * (coll_break), naming peer, rank, step and what arrived. */
int coll_xfer_run(CollComm *c, CollXfer *x, double deadline, SgError *err);

/* Breaks the communicator on err: looks for a notice from the right first
 * (then the error to report), passes the notice to the left, shuts both
 * connections down. Returns err->code. */
int coll_break(CollComm *c, SgError *err);

/* The sealer of a connection in security mode `mode`. */
const CollSealer *coll_sealer(NetSecurity mode);

/* ---- coll_shm.c: shared-memory links ---- */

/* After the TCP ring formed: when `allow` and every rank's host is the same,
 * tries shared-memory links (every rank agrees on the outcome) and sets
 * c->shm if they all work; c stays on TCP otherwise. Fails only as the ring's
 * own exchanges fail. */
int coll_shm_setup(CollComm *c, const char *const *hosts, int allow, double deadline, SgError *err);
void coll_shm_free(CollShm *s);

/* Bytes this rank may write to its ring now. */
size_t coll_shm_room(const CollComm *c);
/* Writes len <= room bytes to this rank's ring and wakes the right neighbour. */
void coll_shm_put(CollComm *c, const uint8_t *src, size_t len);
/* The left neighbour's unread bytes as two pieces (the second from the
 * ring's start); returns their total. */
size_t coll_shm_readable(const CollComm *c, const uint8_t *piece[2], size_t len[2]);
/* Marks len of them taken and wakes the left neighbour. */
void coll_shm_take(CollComm *c, size_t len);
/* Waits until this rank may write `send` bytes or read `recv` bytes (0:
 * not waiting for that), an event on p's sockets (poll's revents set), or
 * the deadline: 1, 2, 0; -1 on a poll error (errno). */
int coll_shm_wait(CollComm *c, size_t send, size_t recv, struct pollfd *p, nfds_t np,
                  double deadline);

/* ---- coll_ops.c: the arithmetic ---- */

/* Bytes per element on the wire: the dtype's size, or 2 with compression. */
size_t coll_wire_size(CollDtype dtype, CollCompression comp);

/* dst[i] = op(dst[i], wire[i]) for n elements; wire holds dtype values, or
 * fp16/bf16 values for a float32 dst with compression. */
void coll_reduce(void *dst, const uint8_t *wire, size_t n, CollDtype dtype, CollOp op,
                 CollCompression comp);

/* dst[i] = wire[i] converted from fp16/bf16 to float32. */
void coll_decode(float *dst, const uint8_t *wire, size_t n, CollCompression comp);

/* wire[i] = src[i] converted to fp16/bf16. */
void coll_encode(uint8_t *wire, const float *src, size_t n, CollCompression comp);

/* The owner's last touch of its reduced segment: divides by size for
 * COLL_AVERAGE (integer division truncates), then rounds float32 values to
 * the wire format with compression. */
void coll_finish(void *buf, size_t n, CollDtype dtype, CollOp op, CollCompression comp, int size);

/* ---- coll_rows.c: a sparse gradient hook's Embedding tables ---- */

/* What the hook keeps from step to step: scratch, and the unions its
 * tables' ids point at until the next step. */
typedef struct CollRows {
    int32_t *blk; /* [blkcap] this rank's block */
    size_t blkcap;
    int32_t *uids; /* [ucap] every table's union, one after another */
    size_t ucap;
    int32_t *tmp; /* [tmpcap] merge scratch */
    size_t tmpcap;
    struct CollRowsAt {
        size_t off, n; /* table i's union: uids[off, off + n) */
        int dense;     /* reduced whole (the rule of coll.h) */
    } * at;            /* [atcap] */
    size_t atcap;
    float *pack; /* [packcap] the rows tables' union rows, packed */
    size_t packcap;
} CollRows;

/* Steps 1 to 5 of coll.h's sparse hook on tables[0..nt) of grads[n]: the
 * tables' gradients reduced (op, comp) across ranks, each table's ids/nids
 * pointing at its union in st. Counts the reductions in c's stats. */
int coll_rows_reduce(CollComm *c, CollOp op, CollCompression comp, float *grads, size_t n,
                     OptimRows *tables, int nt, CollRows *st, SgError *err);

/* Checks rank q's block, len bytes at b (4-aligned, as allgather's blocks
 * are while the ones before are valid), against this rank's tables[0..nt):
 * the table count and shapes (SG_ECLUSTER naming the rank and table), then
 * each list's length and ids (sorted, unique, below rows) and the total
 * length (SG_EPROTO). On success ids[i] and cnt[i] are its table i's ids,
 * inside b, and their number. */
int coll_rows_check_block(const int32_t *b, uint64_t len, int q, const OptimRows *tables, int nt,
                          const int32_t **ids, size_t *cnt, SgError *err);

/* Frees st's buffers (st itself is the caller's). */
void coll_rows_free(CollRows *st);

/* Adds a hook's table counts to c's stats (CollStats.tables_*). */
void coll_comm_count_tables(CollComm *c, uint64_t as_rows, uint64_t dense, uint64_t bytes_sent);

#endif /* NET_COLL_INTERNAL_H */
