/*
 * feed.h - feeding Spark partitions to workers (InputMode.SPARK).
 *
 * A feeder (a Spark task) connects to a worker's FeedServer, authenticates
 * (auth.h), sends batches and finally END, then waits for the worker's ACK.
 * Frames are NET_FRAME_FEED with flags = FeedOp. A BATCH payload
 * (little-endian):
 *   u8 input_len, input name       which named input ("train", "validation")
 *   u64 rows, u16 ncols (1..FEED_MAX_COLUMNS)
 *   per column: u8 name_len, name, u8 dtype (FeedDtype), u8 ndim (1..8),
 *               u64 dims[ndim] (dims[0] == rows), u64 data_len, data
 * data_len must equal the product of dims times the dtype size; every length
 * is checked against the bytes that remain before anything is read.
 * END payload: the input name. ACK: empty. ERROR: u32 status code (as
 * int32), message text. RESULT (worker -> feeder): a BATCH payload of result
 * columns for rows that feeder sent, in that feeder's row order; results may
 * arrive before or after the ACK of END, so the feeder reads its connection
 * from a background thread and never blocks the worker's results.
 *
 * The server queues whole batches per input in a bounded C queue (bytes):
 * when it is full a feeder's connection is not read, so TCP pushes back on
 * the feeder. feed_server_next takes rows across batches. End of data: an
 * input is finished when feed_server_finish is called (the driver knows all
 * partitions are fed) or expected_feeders feeders sent END; then next returns
 * the rest, short or empty, instead of waiting.
 *
 * Security (session.h): server and feeder agree on a mode in the handshake;
 * each connection keeps its own NetSession, so every frame after it (BATCH,
 * END, ACK, ERROR, RESULT) carries a seq and a tag. A batch is queued only
 * after its tag checked; a frame that fails is named (peer, frame type,
 * seq), the server tells that feeder why through the session (its own
 * direction is intact), closes the connection and keeps serving the others.
 */
#ifndef NET_FEED_H
#define NET_FEED_H

#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"
#include "net/session.h"

#define FEED_MAX_COLUMNS 256
#define FEED_MAX_NDIM    8
#define FEED_NAME_MAX    255
#define FEED_MAX_INPUTS  16

typedef enum FeedOp {
    FEED_OP_BATCH = 1,
    FEED_OP_END = 2,
    FEED_OP_ACK = 3,
    FEED_OP_ERROR = 4,
    FEED_OP_RESULT = 5,
} FeedOp;

typedef enum FeedDtype {
    FEED_F32 = 1,
    FEED_F64 = 2,
    FEED_I32 = 3,
    FEED_I64 = 4,
    FEED_U8 = 5,
    FEED_I8 = 6,
    FEED_I16 = 7,
    FEED_U16 = 8,
    FEED_BOOL = 9,
} FeedDtype;

/* Bytes per value of a dtype code, 0 for an unknown code. */
size_t feed_dtype_size(int dtype);

typedef struct FeedColumn {
    char name[FEED_NAME_MAX + 1];
    uint8_t dtype;
    uint8_t ndim;
    uint64_t dims[FEED_MAX_NDIM]; /* dims[0] = rows */
    uint64_t row_bytes;           /* product of dims[1..] times the dtype size */
    const uint8_t *data;          /* rows * row_bytes bytes */
} FeedColumn;

typedef struct FeedBatch {
    char input[FEED_NAME_MAX + 1];
    uint64_t rows;
    int ncols;
    FeedColumn cols[FEED_MAX_COLUMNS];
} FeedBatch;

/* Decodes a BATCH payload; column data points into buf. SG_EPROTO names
 * the byte offset and column of the first inconsistency. */
int feed_batch_decode(const uint8_t *buf, size_t len, FeedBatch *out, SgError *err);

/* Encodes the metadata of b (all but column data) into meta (capacity
 * meta_cap) and describes the whole payload as iovecs: iov receives
 * 2 * ncols + 1 entries (meta pieces interleaved with column data).
 * Returns the payload length or a negative status. */
struct iovec;
long feed_batch_encode(const FeedBatch *b, uint8_t *meta, size_t meta_cap, struct iovec *iov,
                       SgError *err);

/* SG_ESCHEMA if b's columns (names, dtypes, trailing dims, order) differ
 * from ref's. */
int feed_schema_check(const FeedBatch *ref, const FeedBatch *b, SgError *err);

/* ---- server ---- */

typedef struct FeedServer FeedServer;

typedef struct FeedOut {
    int want_sources;  /* set by the caller: fill sources */
    uint32_t *sources; /* [rows] the feeder connection id of each row (malloc'd) */
    int ncols;
    uint64_t rows;
    FeedColumn cols[FEED_MAX_COLUMNS]; /* data malloc'd per column, owned by the caller */
} FeedOut;

typedef struct FeedStats {
    long feeders, ended, batches, rows_in, rows_out;
    size_t queued_bytes;
    long rejected;
    char last_error[256];
} FeedStats;

/* Serves feeders on lfd (not owned) from a background thread. */
int feed_server_start(int lfd, const uint8_t *secret, size_t secret_len, NetSecurity mode,
                      size_t capacity_bytes, int expected_feeders, uint32_t max_frame,
                      FeedServer **out, SgError *err);

/* Up to n rows of input; waits until min_rows (0..n; n: a full batch, 0: no
 * wait) rows are queued, then takes min(n, queued) - or until the input is
 * finished (then what is left, possibly 0). min_rows 1 returns whatever is
 * queued as soon as there is a row (inference: a partition's last rows must not wait
 * for a full batch). SG_ETIMEOUT says what was queued and how many feeders
 * came and ended. *out columns are malloc'd. */
int feed_server_next(FeedServer *s, const char *input, uint64_t n, uint64_t min_rows,
                     double timeout, FeedOut *out, SgError *err);

/* Marks input (NULL: every input, including ones not seen yet) finished. */
void feed_server_finish(FeedServer *s, const char *input);

/* 1 when input is finished and drained. */
int feed_server_drained(FeedServer *s, const char *input);
void feed_server_stats(FeedServer *s, FeedStats *out);

/* Sends result columns back to the feeder whose connection id is source
 * (from FeedOut.sources). SG_EPEER if that feeder has gone. */
int feed_server_send_results(FeedServer *s, uint32_t source, const FeedBatch *b, double timeout,
                             SgError *err);
/* Seconds a connection may take to authenticate (default 10; applies to
 * later connections). Unauthenticated connections are capped (accept.h). */
void feed_server_set_auth_timeout(FeedServer *s, double seconds);
void feed_server_stop(FeedServer *s);
void feed_server_free(FeedServer *s);
void feed_out_free(FeedOut *out);

/* One BATCH/RESULT frame of b on fd before deadline, protected by s (NULL:
 * plain): the caller's column buffers are the frame's pieces (no copy, but
 * for "encrypt", which encrypts through s's scratch block). The caller
 * serializes senders on one connection. */
int feed_send_batch(int fd, NetSession *s, int op, const FeedBatch *b, double deadline,
                    const char *peer, SgError *err);

/* ---- feeder ---- */

typedef struct FeedClient FeedClient;

/* mode must be the worker's (SG_EAUTH naming both otherwise). */
int feed_client_connect(const char *host, int port, const uint8_t *secret, size_t secret_len,
                        NetSecurity mode, double timeout, FeedClient **out, SgError *err);
/* Sends one batch (b->input set, cols' data filled); bounded by the timeout. */
int feed_client_send(FeedClient *c, const FeedBatch *b, SgError *err);
/* Sends END for input and waits for the worker's ACK. */
int feed_client_end(FeedClient *c, const char *input, SgError *err);
/* Next RESULT batch from the worker: *payload (malloc'd, caller frees) holds
 * the data out's columns point into; *payload = NULL after timeout. */
int feed_client_recv_results(FeedClient *c, double timeout, FeedBatch *out, uint8_t **payload,
                             SgError *err);
void feed_client_free(FeedClient *c);

#endif /* NET_FEED_H */
