/*
 * coll_xfer.c - the transfer engine of the ring communicator
 * (coll_internal.h): a transfer is a run of ring steps, each sending one span
 * to the right neighbour while receiving one from the left, as one stream
 * each way on non-blocking sockets polled together. What arrives lands in its
 * span or goes through c->tmp to the transfer's consume (the allreduce's
 * reduction) as it arrives, and a send step fed by a receive step goes out
 * as soon as its bytes are consumed.
 *
 * How bytes cross a connection is its sealer, chosen once from the security
 * mode: "plain" writes and reads raw streams; "sealed" cuts each step's
 * stream into protected records (coll.h "Security") and counts a record's
 * bytes only once its tag checked. The loop is the same for both.
 *
 * Also here: the failure notices the right neighbour sends, and breaking the
 * ring (the notice passed to the left, both connections shut down). Not
 * here: what the steps carry (coll.c), the connections themselves
 * (coll_ring.c).
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "common/sg_le.h"
#include "net/coll_internal.h"
#include "net/frame.h"

/* The most one plain send call writes. Without a cap the first step of a
 * 4 MB allreduce writes its 2 MB segment in one call, which the receiver then
 * reads cold from the socket queue while its own call runs; 256 KiB pieces
 * alternate with the reads, keep the bytes in flight in cache and let the
 * receiver reduce and forward while the rest comes: on 2 loopback ranks this
 * took the CPU time of a 4 to 64 MB allreduce down by a quarter to a third. */
#define COLL_SEND_BYTES COLL_TMP_BYTES
/* COLL_SPIN_SECONDS (coll_internal.h): a waiting collective keeps polling
 * without sleeping (yielding the CPU between polls) before it blocks in
 * poll(). The data a ring step waits
 * for is usually a peer's write of at most COLL_SEND_BYTES away; sleeping and
 * being woken costs more than that on a virtual machine (two context switches,
 * an inter-processor interrupt). Only when the ranks of this host fit its
 * CPUs (coll_comm_new): with more ranks than CPUs a spinning rank would delay
 * the very rank it waits for. */
/* The payload of a protected data record (<= COLL_TMP_BYTES). A record is
 * reduced and forwarded only once whole, so smaller records pipeline the
 * steps better; each costs an AEAD setup, a tag and a wakeup more. 128 KiB had
 * the lowest 436 KB latency and the highest 16 MB bandwidth of 16 KiB ..
 * 256 KiB on 2 loopback ranks ("auth" and "encrypt"). */
#define COLL_REC_BYTES   (128u << 10)
#define COLL_NOTICE_WAIT 0.3 /* seconds a failing rank listens for a notice from the right */

/* ---- failures -------------------------------------------------------------------- */

/* A failure notice or a goodbye from the right neighbour (all a right
 * neighbour ever sends on our connection to it): reads one frame within
 * `wait` seconds; returns 1 for a notice (out filled), 2 for a goodbye
 * (coll_comm_close between collectives), 0 for anything else (silence,
 * EOF, reset: the neighbour died). */
static int read_notice(CollComm *c, double wait, SgError *out)
{
    NetFrameHeader h;
    uint8_t *p = NULL;
    SgError e;
    int got = 0;
    int rc = net_frame_recv(c->fd_right, &c->sright, SG_ERROR_MAX + 8, sg_now() + wait,
                            c->right_peer, &h, &p, &e);
    if (rc == SG_EAUTH) {
        /* a notice that fails its check is this rank's failure to report
         * (and the session is spent: nothing more is read from the right) */
        c->right_eof = 1;
        sg_fail(out, SG_EAUTH, "rank %d (%s): %.900s", c->right, c->right_peer, e.msg);
        got = 1;
    } else if (rc == 0 && h.type == NET_FRAME_COLL && h.flags == COLL_FRAME_ABORT &&
               h.length >= 8) {
        int32_t code = (int32_t)sg_get_le32(p);
        c->notice_origin = (int)sg_get_le32(p + 4);
        c->notice_code = code < 0 && code > -100 ? code : SG_ENODE;
        snprintf(c->notice, sizeof c->notice, "%.*s", (int)(h.length - 8), (char *)p + 8);
        c->have_notice = 1;
        sg_fail(out, c->notice_code, "%.900s (reported by rank %d (%s))", c->notice, c->right,
                c->right_peer);
        got = 1;
    } else if (p != NULL && h.type == NET_FRAME_COLL && h.flags == COLL_FRAME_BYE) {
        got = 2;
    }
    free(p);
    return got;
}

/* First it looks for a notice from the right (a failure elsewhere, which then
 * is the error to report, naming the rank that failed rather than the
 * neighbour whose connection closed because of it), then passes the notice
 * on to the left neighbour (on the direction of that connection no data
 * uses) and shuts both connections down, so the whole ring fails now rather
 * than each rank at its timeout. */
int coll_break(CollComm *c, SgError *err)
{
    int closed = __atomic_load_n(&c->closed, __ATOMIC_SEQ_CST);
    SgError n;
    if (!closed && !c->have_notice && !c->right_eof && c->fd_right >= 0 &&
        read_notice(c, COLL_NOTICE_WAIT, &n) == 1)
        *err = n;
    if (!c->have_notice) {
        c->notice_code = err->code, c->notice_origin = c->rank;
        snprintf(c->notice, sizeof c->notice, "%.900s", err->msg);
    }
    if (!closed && c->fd_left >= 0) {
        uint8_t buf[8 + sizeof c->notice];
        size_t len = strlen(c->notice);
        sg_put_le32(buf, (uint32_t)c->notice_code);
        sg_put_le32(buf + 4, (uint32_t)c->notice_origin);
        memcpy(buf + 8, c->notice, len);
        (void)net_frame_send(c->fd_left, &c->sleft, NET_FRAME_COLL, COLL_FRAME_ABORT, buf, 8 + len,
                             sg_now() + 0.05, c->left_peer, &n);
    }
    c->broken = 1;
    c->broken_err = *err;
    if (c->fd_left >= 0)
        shutdown(c->fd_left, SHUT_RDWR);
    if (c->fd_right >= 0)
        shutdown(c->fd_right, SHUT_RDWR);
    return err->code;
}

static int peer_failure(CollComm *c, int rc, int left, const SgError *e, const char *what,
                        SgError *err)
{
    if (__atomic_load_n(&c->closed, __ATOMIC_SEQ_CST))
        sg_fail(err, SG_ESTATE, "the communicator was closed during %s", what);
    else if (rc == SG_EPEER)
        sg_fail(err, SG_ENODE, "rank %d (%s) is gone: the connection closed during %s",
                left ? c->left : c->right, left ? c->left_peer : c->right_peer, what);
    else
        sg_fail(err, rc, "%s with rank %d (%s): %s", what, left ? c->left : c->right,
                left ? c->left_peer : c->right_peer, e->msg);
    return coll_break(c, err);
}

/* ---- the two sealers --------------------------------------------------------------
 *
 * A sealed step's stream is cut into records of rec_len(done, total) bytes
 * (COLL_REC_BYTES but the last); a record is seq | payload | tag on the wire.
 * The sender seals a whole record before writing it: "auth" authenticates the
 * payload where it lies and sends it from there (no copy: a record's bytes are
 * not changed before the right neighbour has received them, the same property
 * the plain stream relies on), "encrypt" encrypts it into c->stage (in place
 * when compression already encoded it there). The receiver reads a record
 * into its destination (the span, or c->tmp for what is consumed), opening it
 * in place as it arrives, and the record's bytes count only once its tag
 * checked. Both ends cut alike, so a relayed step's records are whole. */
typedef struct Rec {
    uint8_t seq[NET_SESSION_SEQ], tag[NET_SESSION_TAG];
    uint8_t *payload;
    size_t len, pos; /* payload bytes; wire bytes of the record done so far */
    int busy;        /* a record is being written / read */
} Rec;

#define REC_WIRE(len) (NET_SESSION_SEQ + (len) + NET_SESSION_TAG)

/* The send side of a transfer's current step. */
typedef struct XferOut {
    const uint8_t *src;      /* the step's span (float32 values with comp) */
    size_t done, avail, len; /* wire bytes: sent (sealed: whole records), sendable now, in all */
    CollCompression comp;
    size_t stage_have, stage_pos; /* plain with comp: bytes encoded in c->stage, written of them */
    Rec rec;                      /* sealed: the record being written */
} XferOut;

struct CollSealer {
    /* Writes what the right connection takes of o's step, up to o->avail:
     * returns the bytes of the step now sent (sealed: a record's, once it is
     * all written), or a negative status. */
    long (*send)(CollComm *c, XferOut *o, SgError *err);
    /* Reads what has arrived from the left into dst, at most cap bytes:
     * returns the bytes that count (sealed: a record of at most cap bytes
     * started at dst, once all of it is in and its tag checked), or a
     * negative status. */
    long (*recv)(CollComm *c, Rec *r, uint8_t *dst, size_t cap, SgError *err);
};

/* Plain: what the socket takes of the stream from done up to avail, capped
 * at COLL_SEND_BYTES; or, with comp, of fp16/bf16 values encoded through
 * c->stage, COLL_TMP_BYTES / 2 of them at most, a batch encoded once the
 * previous one is all written. */
static long plain_send(CollComm *c, XferOut *o, SgError *err)
{
    const uint8_t *src;
    size_t len;
    if (o->comp != COLL_COMP_NONE) {
        if (o->stage_pos == o->stage_have) {
            size_t elems = (o->avail - o->done) / 2;
            if (elems > COLL_TMP_BYTES / 2)
                elems = COLL_TMP_BYTES / 2;
            coll_encode(c->stage, (const float *)o->src + o->done / 2, elems, o->comp);
            o->stage_have = 2 * elems, o->stage_pos = 0;
        }
        src = c->stage + o->stage_pos, len = o->stage_have - o->stage_pos;
    } else {
        src = o->src + o->done, len = o->avail - o->done;
        if (len > COLL_SEND_BYTES)
            len = COLL_SEND_BYTES;
    }
    long put = net_write_some(c->fd_right, src, len, c->right_peer, err);
    if (put < 0)
        return put;
    o->stage_pos += (size_t)put;
    c->stats.bytes_sent += (uint64_t)put;
    return put;
}

static long plain_recv(CollComm *c, Rec *r, uint8_t *dst, size_t cap, SgError *err)
{
    (void)r;
    long got = net_read_some(c->fd_left, dst, cap, c->left_peer, err);
    if (got > 0)
        c->stats.bytes_received += (uint64_t)got;
    return got;
}

static size_t rec_len(size_t done, size_t total)
{
    size_t left = total - done;
    return left < COLL_REC_BYTES ? left : COLL_REC_BYTES;
}

/* The record's associated data: a frame header that is not sent. */
static void rec_ad(uint8_t ad[NET_FRAME_HEADER_SIZE], size_t len)
{
    net_frame_header_encode(ad, NET_FRAME_COLL, COLL_FRAME_DATA, (uint32_t)len);
}

/* The record's wire bytes from r->pos on, as up to 3 pieces. */
static int rec_iov(Rec *r, struct iovec iov[3])
{
    uint8_t *base[3] = {r->seq, r->payload, r->tag};
    size_t len[3] = {NET_SESSION_SEQ, r->len, NET_SESSION_TAG}, at = r->pos;
    int k = 0;
    for (int i = 0; i < 3; i++) {
        if (at >= len[i]) {
            at -= len[i];
            continue;
        }
        iov[k].iov_base = base[i] + at;
        iov[k++].iov_len = len[i] - at;
        at = 0;
    }
    return k;
}

static void rec_start(Rec *r, uint8_t *payload, size_t len)
{
    r->payload = payload, r->len = len, r->pos = 0, r->busy = 1;
}

/* Sealed: once the previous record is all written, seals the next one (its
 * fp16/bf16 values encoded into c->stage first, with comp); then writes what
 * the socket takes of it. */
static long sealed_send(CollComm *c, XferOut *o, SgError *err)
{
    Rec *r = &o->rec;
    if (!r->busy) {
        NetSession *s = &c->sright;
        size_t len = rec_len(o->done, o->len);
        const uint8_t *src = o->src + o->done;
        if (o->comp != COLL_COMP_NONE) {
            coll_encode(c->stage, (const float *)o->src + o->done / 2, len / 2, o->comp);
            src = c->stage;
        }
        /* "auth": in == out, so the session only authenticates (nothing is written) */
        uint8_t *out = s->mode == NET_SEC_ENCRYPT ? c->stage : (uint8_t *)src;
        uint8_t ad[NET_FRAME_HEADER_SIZE];
        rec_ad(ad, len);
        rec_start(r, out, len);
        int rc = net_session_seal_begin(s, ad, sizeof ad, r->seq, err);
        if (rc == 0)
            rc = net_session_seal_update(s, src, out, len, err);
        if (rc == 0)
            rc = net_session_seal_end(s, r->tag, err);
        if (rc < 0)
            return rc;
    }
    struct iovec iov[3];
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)rec_iov(r, iov)};
    ssize_t n;
    do {
        n = sendmsg(c->fd_right, &m, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET))
        return sg_fail(err, SG_EPEER, "%s closed the connection", c->right_peer);
    if (n < 0)
        return sg_fail_errno(err, SG_EIO, errno, "writing to %s", c->right_peer);
    r->pos += (size_t)n;
    c->stats.bytes_sent += (uint64_t)n;
    if (r->pos < REC_WIRE(r->len))
        return 0;
    r->busy = 0;
    return (long)r->len;
}

/* Sealed: reads what has arrived of the record r (started at dst when none
 * is under way; never past it) and opens it in place; SG_EAUTH from the
 * session names the peer, the frame and its seq. */
static long sealed_recv(CollComm *c, Rec *r, uint8_t *dst, size_t cap, SgError *err)
{
    NetSession *s = &c->sleft;
    if (!r->busy)
        rec_start(r, dst, cap < COLL_REC_BYTES ? cap : COLL_REC_BYTES);
    struct iovec iov[3];
    int k = rec_iov(r, iov);
    ssize_t n;
    do {
        n = readv(c->fd_left, iov, k);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    if (n < 0 && errno == ECONNRESET)
        return sg_fail(err, SG_EPEER, "%s reset the connection", c->left_peer);
    if (n < 0)
        return sg_fail_errno(err, SG_EIO, errno, "reading from %s", c->left_peer);
    if (n == 0)
        return sg_fail(err, SG_EPEER, "%s closed the connection", c->left_peer);
    size_t a = r->pos, b = a + (size_t)n, end = NET_SESSION_SEQ + r->len;
    int rc = SG_OK;
    r->pos = b;
    c->stats.bytes_received += (uint64_t)n;
    if (a < NET_SESSION_SEQ && b >= NET_SESSION_SEQ) {
        uint8_t ad[NET_FRAME_HEADER_SIZE];
        rec_ad(ad, r->len);
        rc = net_session_open_begin(s, ad, sizeof ad, r->seq, c->left_peer, NET_FRAME_COLL, err);
    }
    size_t pa = a > NET_SESSION_SEQ ? a : NET_SESSION_SEQ, pb = b < end ? b : end;
    if (rc == 0 && pb > pa) {
        uint8_t *p = r->payload + (pa - NET_SESSION_SEQ);
        rc = net_session_open_update(s, p, p, pb - pa, err);
    }
    if (rc == 0 && b == REC_WIRE(r->len)) {
        rc = net_session_open_end(s, r->tag, c->left_peer, NET_FRAME_COLL, err);
        r->busy = 0;
        if (rc == 0)
            return (long)r->len;
    }
    return rc;
}

const CollSealer *coll_sealer(NetSecurity mode)
{
    static const CollSealer plain = {plain_send, plain_recv}, sealed = {sealed_send, sealed_recv};
    return mode == NET_SEC_NONE ? &plain : &sealed;
}

/* ---- the engine ------------------------------------------------------------------- */

/* poll() of a transfer step until the deadline: returns as poll does (0 once
 * the deadline passed). With c->spin it first polls without blocking for up
 * to COLL_SPIN_SECONDS, yielding the CPU between polls. */
static int coll_poll(const CollComm *c, struct pollfd *p, nfds_t np, double deadline)
{
    if (c->spin) {
        double until = sg_now() + COLL_SPIN_SECONDS;
        if (until > deadline)
            until = deadline;
        for (;;) {
            int n = poll(p, np, 0);
            if (n != 0)
                return n;
            if (sg_now() >= until)
                break;
            sched_yield();
        }
    }
    return poll(p, np, sg_poll_ms(deadline));
}

/* The bytes of send step sj that exist yet (len in all): all of them, unless
 * they are those of the receive step under way (consumed of them so far). */
static size_t sendable(const CollXfer *x, int sj, int rj, size_t consumed, size_t len)
{
    int fed = sj - x->lag; /* (fed > rj: past an empty step, wait for the receive to catch up) */
    if (sj >= x->steps)
        return 0;
    if (x->lag < 0 || fed < rj)
        return len;
    return fed == rj ? consumed : 0;
}

/* Hands the whole elements of the `have` bytes in c->tmp (the last of rdone
 * bytes of receive step j) to x->consume and keeps the rest, part of an
 * element, at the start of c->tmp; returns its length. */
static size_t consume_tmp(CollComm *c, CollXfer *x, int j, size_t rdone, size_t have)
{
    size_t whole = have / x->wsz;
    if (whole > 0)
        x->consume(x, j, x->rx.ptr, (rdone - have) / x->wsz, c->tmp, whole);
    memmove(c->tmp, c->tmp + whole * x->wsz, have - whole * x->wsz);
    return have - whole * x->wsz;
}

static const char *xfer_what(const CollXfer *x, int step, char *out, size_t cap)
{
    return x->describe != NULL ? x->describe(x, step, out, cap) : x->what;
}

/* The step's timeout, naming the rank waited for (and the neighbour it comes
 * through) and how much of the step arrived or was taken. */
static int xfer_timeout(CollComm *c, const CollXfer *x, const char *what, size_t rdone,
                        const XferOut *o, int receiving, SgError *err)
{
    if (receiving) {
        int from = x->from_rank >= 0 ? x->from_rank : c->left;
        char via[NET_PEER_MAX + 32] = "";
        if (from != c->left)
            snprintf(via, sizeof via, ", through rank %d (%s)", c->left, c->left_peer);
        sg_fail(err, SG_ETIMEOUT,
                "timed out after %gs in %s waiting for rank %d (%s%s) (%zu of %zu bytes arrived)",
                c->cur_timeout, what, from, c->peers + (size_t)from * NET_PEER_MAX, via, rdone,
                x->rx.len);
    } else {
        sg_fail(err, SG_ETIMEOUT,
                "timed out after %gs in %s sending to rank %d (%s) (%zu of %zu bytes taken)",
                c->cur_timeout, what, c->right, c->right_peer, o->done, o->len);
    }
    return coll_break(c, err);
}

#define WHAT xfer_what(x, rj < x->steps ? rj : sj, what, sizeof what)

/* The spans of step 0 both ways (x->next), and the send side of step 0. */
static XferOut xfer_begin(CollXfer *x)
{
    if (x->next != NULL) {
        x->next(x, 0, 1, &x->tx);
        x->next(x, 0, 0, &x->rx);
    }
    return (XferOut){.src = x->tx.ptr, .len = x->tx.len, .comp = x->comp};
}

/* Moves the receive side (rdone of its step done) or the send side on to its
 * next step once its current one is done: 1 if it moved one. */
static int xfer_next_step(CollXfer *x, int *sj, int *rj, size_t *rdone, XferOut *out)
{
    if (*rj < x->steps && *rdone == x->rx.len) {
        if (++*rj < x->steps)
            x->next(x, *rj, 0, &x->rx);
        *rdone = 0;
        return 1;
    }
    if (*sj < x->steps && out->done == out->len) {
        if (++*sj < x->steps)
            x->next(x, *sj, 1, &x->tx);
        *out = (XferOut){.src = x->tx.ptr, .len = x->tx.len, .comp = x->comp};
        return 1;
    }
    return 0;
}

/* Shared memory: what the send step has ready, up to the ring's room and
 * COLL_SEND_BYTES, written to this rank's ring (encoded through c->stage
 * with comp); returns the bytes. */
static size_t shm_send(CollComm *c, XferOut *o)
{
    size_t len = o->avail - o->done, room = coll_shm_room(c);
    if (len > COLL_SEND_BYTES)
        len = COLL_SEND_BYTES;
    if (len > room)
        len = room;
    const uint8_t *src = o->src + o->done;
    if (o->comp != COLL_COMP_NONE) {
        len &= ~(size_t)1;
        coll_encode(c->stage, (const float *)o->src + o->done / 2, len / 2, o->comp);
        src = c->stage;
    }
    if (len == 0)
        return 0;
    coll_shm_put(c, src, len);
    c->stats.bytes_sent += len;
    return len;
}

/* Shared memory: what the left's ring holds of receive step j (rdone of it
 * done), up to COLL_SEND_BYTES: copied to the span, or handed to consume
 * where it lies (whole elements; one that wraps around the ring's end goes
 * through c->tmp); returns the bytes taken. */
static size_t shm_recv(CollComm *c, CollXfer *x, int j, size_t rdone)
{
    const uint8_t *piece[2];
    size_t len[2], want = x->rx.len - rdone, took = 0;
    size_t have = coll_shm_readable(c, piece, len);
    if (want > COLL_SEND_BYTES)
        want = COLL_SEND_BYTES;
    if (have > want)
        have = want;
    size_t first = len[0] < have ? len[0] : have;
    if (!x->rx.consume) {
        memcpy(x->rx.ptr + rdone, piece[0], first);
        memcpy(x->rx.ptr + rdone + first, piece[1], have - first);
        took = have;
    } else {
        size_t wsz = x->wsz, whole = first / wsz;
        if (whole > 0)
            x->consume(x, j, x->rx.ptr, rdone / wsz, piece[0], whole);
        took = whole * wsz;
        if (whole == 0 && have >= wsz) { /* an element split by the ring's end */
            memcpy(c->tmp, piece[0], first);
            memcpy(c->tmp + first, piece[1], wsz - first);
            x->consume(x, j, x->rx.ptr, rdone / wsz, c->tmp, 1);
            took = wsz;
        }
    }
    if (took > 0) {
        coll_shm_take(c, took);
        c->stats.bytes_received += took;
    }
    return took;
}

/* coll_xfer_run over shared memory: the same steps, the bytes through the
 * rings (coll_shm.c); the sockets are watched only while waiting, for a
 * notice from the right or either neighbour's EOF. */
static int shm_xfer_run(CollComm *c, CollXfer *x, double deadline, SgError *err)
{
    int steps = x->steps, sj = 0, rj = 0, left_eof = 0;
    size_t rdone = 0;
    SgError e;
    char what[128];
    XferOut out = xfer_begin(x);
    while (sj < steps || rj < steps) {
        if (xfer_next_step(x, &sj, &rj, &rdone, &out))
            continue;
        out.avail = sendable(x, sj, rj, rdone, out.len);
        size_t moved = 0;
        if (sj < steps && out.done < out.avail) {
            size_t put = shm_send(c, &out);
            out.done += put, moved += put;
        }
        if (rj < steps) {
            size_t got = shm_recv(c, x, rj, rdone);
            rdone += got, moved += got;
        }
        if (moved > 0)
            continue;
        if (sj < steps && c->right_eof)
            return peer_failure(c, SG_EPEER, 0, &e, WHAT, err);
        struct pollfd p[2];
        int np = 0, is = -1, il = -1;
        if (!c->right_eof) {
            p[np] = (struct pollfd){.fd = c->fd_right, .events = POLLIN};
            is = np++;
        }
        if (!left_eof) {
            p[np] = (struct pollfd){.fd = c->fd_left, .events = POLLIN};
            il = np++;
        }
        /* the least that makes progress: a compressed value, an element to consume */
        size_t send_need = sj < steps && out.done < out.avail ? (out.comp ? 2 : 1) : 0;
        size_t recv_need = rj < steps ? (x->rx.consume ? x->wsz : 1) : 0;
        int w = coll_shm_wait(c, send_need, recv_need, p, (nfds_t)np, deadline);
        if (w < 0) {
            sg_fail_errno(err, SG_EIO, errno, "poll during %s", WHAT);
            return coll_break(c, err);
        }
        if (w == 0)
            return xfer_timeout(c, x, WHAT, rdone, &out, rj < steps, err);
        if (w == 1)
            continue;
        if (is >= 0 && (p[is].revents & (POLLIN | POLLHUP | POLLERR))) {
            int got = read_notice(c, COLL_NOTICE_WAIT, err);
            if (got == 1)
                return coll_break(c, err);
            c->right_eof = 1;
            if (got == 0 || sj < steps)
                return peer_failure(c, SG_EPEER, 0, &e, WHAT, err);
        }
        /* nothing comes on the left connection while the rings carry the
         * data: an event there is its end (the left neighbour is gone) */
        if (il >= 0 && p[il].revents) {
            left_eof = 1;
            if (rj < steps)
                return peer_failure(c, SG_EPEER, 1, &e, WHAT, err);
        }
    }
    return SG_OK;
}

int coll_xfer_run(CollComm *c, CollXfer *x, double deadline, SgError *err)
{
    if (c->shm != NULL)
        return shm_xfer_run(c, x, deadline, err);
    const CollSealer *io = c->sealer;
    int steps = x->steps, sj = 0, rj = 0;
    size_t rdone = 0, tmp_have = 0; /* of the receive step; bytes in c->tmp not consumed yet */
    Rec rx = {0};
    SgError e;
    char what[128];
    XferOut out = xfer_begin(x);
    while (sj < steps || rj < steps) {
        if (xfer_next_step(x, &sj, &rj, &rdone, &out)) {
            if (rdone == 0)
                tmp_have = 0; /* a new receive step (the last one left none: whole elements) */
            continue;
        }
        out.avail = sendable(x, sj, rj, rdone - tmp_have, out.len);
        int want_send = out.done < out.avail;
        /* The right is watched while it is open: it sends nothing but a
         * failure notice. Its EOF fails the step only if we still have to
         * send to it (a right neighbour that finished and left is fine). */
        if (sj < steps && c->right_eof)
            return peer_failure(c, SG_EPEER, 0, &e, WHAT, err);
        struct pollfd p[2];
        int np = 0, is = -1, ir = -1;
        if (!c->right_eof) {
            p[np] =
                (struct pollfd){.fd = c->fd_right, .events = POLLIN | (want_send ? POLLOUT : 0)};
            is = np++;
        }
        if (rj < steps) {
            p[np] = (struct pollfd){.fd = c->fd_left, .events = POLLIN};
            ir = np++;
        }
        int n = coll_poll(c, p, (nfds_t)np, deadline);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            sg_fail_errno(err, SG_EIO, errno, "poll during %s", WHAT);
            return coll_break(c, err);
        }
        if (n == 0)
            return xfer_timeout(c, x, WHAT, rdone, &out, ir >= 0, err);
        if (is >= 0 && (p[is].revents & (POLLIN | POLLHUP | POLLERR))) {
            int got = read_notice(c, COLL_NOTICE_WAIT, err);
            if (got == 1)
                return coll_break(c, err);
            c->right_eof = 1;
            if (got == 0 || sj < steps) /* died, or left with data still owed to it */
                return peer_failure(c, SG_EPEER, 0, &e, WHAT, err);
            continue;
        }
        /* The send first: what it writes was there before this poll (avail),
         * and the peer waits for it while this rank reads and consumes. */
        if (want_send && is >= 0 && (p[is].revents & POLLOUT)) {
            long put = io->send(c, &out, &e);
            if (put < 0)
                return peer_failure(c, (int)put, 0, &e, WHAT, err);
            out.done += (size_t)put;
        }
        if (ir >= 0 && p[ir].revents) {
            int via_tmp = x->rx.consume;
            uint8_t *dst = via_tmp ? c->tmp + tmp_have : x->rx.ptr + rdone;
            size_t cap = x->rx.len - rdone;
            if (via_tmp && cap > COLL_TMP_BYTES - tmp_have)
                cap = COLL_TMP_BYTES - tmp_have;
            long got = io->recv(c, &rx, dst, cap, &e);
            if (got < 0)
                return peer_failure(c, (int)got, 1, &e, WHAT, err);
            rdone += (size_t)got;
            if (via_tmp && got > 0)
                tmp_have = consume_tmp(c, x, rj, rdone, tmp_have + (size_t)got);
        }
    }
    return SG_OK;
}
#undef WHAT
