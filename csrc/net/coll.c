/*
 * coll.c - the ring communicator of coll.h: forming the ring (connect to
 * the right and accept from the left at once, HMAC handshake and HELLO on
 * both), the transfer engine (send to the right while receiving from the
 * left on non-blocking sockets, consuming what arrives as it arrives), the
 * per-collective header exchange and the collectives themselves.
 * Not here: the arithmetic (coll_ops.c), the gradient hook (coll_hook.c).
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "net/accept.h"
#include "net/auth.h"
#include "net/coll_internal.h"
#include "net/frame.h"
#include "net/sock.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the collectives send values in host order: little-endian hosts only"
#endif

#define COLL_HELLO_LEN 16 /* u32 rank, u32 size, u64 check */
#define COLL_HDR_LEN   48 /* see coll.h */
#define COLL_HDR_FRAME (NET_FRAME_HEADER_SIZE + COLL_HDR_LEN)
#define COLL_TMP_BYTES (256u << 10) /* receive chunk of a reducing step */
/* The most one plain send call writes. Without a cap the first step of a
 * 4 MB allreduce writes its 2 MB segment in one call, which the receiver then
 * reads cold from the socket queue while its own call runs; 256 KiB pieces
 * alternate with the reads, keep the bytes in flight in cache and let the
 * receiver reduce and forward while the rest comes: on 2 loopback ranks this
 * took the CPU time of a 4 to 64 MB allreduce down by a quarter to a third. */
#define COLL_SEND_BYTES COLL_TMP_BYTES
/* Seconds a waiting collective keeps polling without sleeping (yielding the
 * CPU between polls) before it blocks in poll(). The data a ring step waits
 * for is usually a peer's write of at most COLL_SEND_BYTES away; sleeping and
 * being woken costs more than that on a virtual machine (two context switches,
 * an inter-processor interrupt). Only when the ranks of this host fit its
 * CPUs (coll_comm_new): with more ranks than CPUs a spinning rank would delay
 * the very rank it waits for. */
#define COLL_SPIN_SECONDS 100e-6
/* The payload of a protected data record (<= COLL_TMP_BYTES). A record is
 * reduced and forwarded only once whole, so smaller records pipeline the
 * steps better; each costs an AEAD setup, a tag and a wakeup more. 128 KiB had
 * the lowest 436 KB latency and the highest 16 MB bandwidth of 16 KiB ..
 * 256 KiB on 2 loopback ranks ("auth" and "encrypt"). */
#define COLL_REC_BYTES   (128u << 10)
#define COLL_HANDSHAKE   10.0 /* seconds for one accepted connection's handshake */
#define COLL_NOTICE_WAIT 0.3  /* seconds a failing rank listens for a notice from the right */

enum { KIND_ALLREDUCE = 1, KIND_BROADCAST, KIND_BROADCAST_VAR, KIND_ALLGATHER, KIND_BARRIER };

static const char *kind_name(uint32_t k)
{
    static const char *names[] = {"?",         "allreduce", "broadcast", "broadcast_bytes",
                                  "allgather", "barrier"};
    return k < sizeof names / sizeof *names ? names[k] : "?";
}

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
    int sec;                  /* net_session_on: data travels in records (see coll.h) */
    NetSession sleft, sright; /* the sessions of fd_left (server side) and fd_right (client) */
    char *peers;              /* size * NET_PEER_MAX: "host:port" of every rank */
    int right_eof; /* the right neighbour closed its end (fine once nothing is left to send) */
    int spin;      /* waits poll for COLL_SPIN_SECONDS before sleeping (see there) */
    int have_notice, notice_code, notice_origin;
    char notice[SG_ERROR_MAX - 100]; /* the first failure, passed to the left */
};

size_t coll_dtype_size(int dtype)
{
    switch (dtype) {
    case COLL_F32:
    case COLL_I32:
        return 4;
    case COLL_F64:
    case COLL_I64:
        return 8;
    case COLL_BYTES:
        return 1;
    default:
        return 0;
    }
}

static void put_u32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, sizeof v);
}

static void put_u64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, sizeof v);
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* ---- forming the ring ----------------------------------------------------------- */

static uint64_t ring_check(int size, const char *const *hosts, const int *ports)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a over "size;host:port;..." */
    char buf[NET_PEER_MAX + 16];
    for (int i = -1; i < size; i++) {
        int n = i < 0 ? snprintf(buf, sizeof buf, "%d;", size)
                      : snprintf(buf, sizeof buf, "%s:%d;", hosts[i], ports[i]);
        for (int j = 0; j < n && j < (int)sizeof buf; j++)
            h = (h ^ (uint8_t)buf[j]) * 1099511628211ull;
    }
    return h;
}

/* The ranks whose listener has this rank's host (as spelled in the address list). */
static int local_ranks(int size, int rank, const char *const *hosts)
{
    int k = 0;
    for (int i = 0; i < size; i++)
        k += strcmp(hosts[i], hosts[rank]) == 0;
    return k;
}

/* The CPUs this process may run on (1 if unknown). */
static int usable_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static void hello_encode(uint8_t out[COLL_HELLO_LEN], int rank, int size, uint64_t check)
{
    put_u32(out, (uint32_t)rank);
    put_u32(out + 4, (uint32_t)size);
    put_u64(out + 8, check);
}

typedef struct Acceptor {
    CollComm *c;
    int lfd, wake[2];
    const uint8_t *secret;
    size_t secret_len;
    double deadline;
    int rc;
    SgError err;
    char refused[SG_ERROR_MAX / 2];
    NetGate gate;
    int grace_ms; /* set before a wake: accept for this long more, then give up */
} Acceptor;

/* One accepted connection: handshake and HELLO; 1 if it is our left
 * neighbour, 0 if refused (reason in a->refused), < 0 never (refusals are
 * not fatal: the right connection may still come). */
static int accept_one(Acceptor *a, int fd, const char *peer)
{
    CollComm *c = a->c;
    SgError e;
    double d = net_now() + COLL_HANDSHAKE;
    if (d > a->deadline)
        d = a->deadline;
    NetFrameHeader h;
    uint8_t *p = NULL;
    NetSession s = {0};
    int rc = net_auth_server(fd, a->secret, a->secret_len, c->mode, d, peer, &s, &e);
    if (rc == 0)
        rc = net_frame_recv(fd, &s, 64, d, peer, &h, &p, &e);
    if (rc == 0 &&
        (h.type != NET_FRAME_COLL || h.flags != COLL_FRAME_HELLO || h.length != COLL_HELLO_LEN))
        rc = sg_fail(&e, SG_EPROTO, "%s sent a %s frame (flags %u) instead of a collective hello",
                     peer, net_frame_type_name(h.type), h.flags);
    if (rc == 0) {
        int prank = (int)get_u32(p), psize = (int)get_u32(p + 4);
        uint64_t pcheck = get_u64(p + 8);
        if (psize != c->size || pcheck != c->check)
            rc = sg_fail(&e, SG_ECLUSTER,
                         "%s says it is rank %d of a ring of %d with another address list (this "
                         "ring has %d ranks)",
                         peer, prank, psize, c->size);
        else if (prank != c->left)
            rc = sg_fail(&e, SG_ECLUSTER,
                         "%s says it is rank %d, but only rank %d (%s) connects to rank %d", peer,
                         prank, c->left, c->left_peer, c->rank);
        /* A REFUSE comes after the handshake, so the session exists: it is
         * protected like every later frame (a peer the handshake refused was
         * closed without a reason). */
        if (rc < 0)
            (void)net_frame_send(fd, &s, NET_FRAME_COLL, COLL_FRAME_REFUSE, e.msg, strlen(e.msg), d,
                                 peer, &(SgError){0});
    }
    free(p);
    if (rc == 0) {
        uint8_t hello[COLL_HELLO_LEN];
        hello_encode(hello, c->rank, c->size, c->check);
        rc = net_frame_send(fd, &s, NET_FRAME_COLL, COLL_FRAME_HELLO_OK, hello, sizeof hello, d,
                            peer, &e);
    }
    if (rc < 0) {
        net_session_free(&s);
        snprintf(a->refused, sizeof a->refused,
                 "a connection from %.80s, where rank %d (%.80s) was expected: %.300s", peer,
                 c->left, c->left_peer, e.msg);
        return 0;
    }
    c->sleft = s; /* the main thread reads it after joining this one */
    return 1;
}

static void *acceptor_main(void *arg)
{
    Acceptor *a = arg;
    CollComm *c = a->c;
    for (;;) {
        int ms = net_poll_ms(a->deadline);
        /* the listener is left out while the gate backs off after EMFILE & co */
        int lfd = net_gate_poll_fd(&a->gate, a->lfd, &ms);
        struct pollfd p[2] = {{.fd = lfd, .events = POLLIN}, {.fd = a->wake[0], .events = POLLIN}};
        int n = poll(p, 2, ms);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            a->rc = sg_fail_errno(&a->err, SG_EIO, errno, "poll on this rank's listener");
            return NULL;
        }
        if (p[1].revents) {
            int grace = __atomic_exchange_n(&a->grace_ms, 0, __ATOMIC_SEQ_CST);
            if (grace > 0) {
                char b;
                double until = net_now() + grace / 1000.0;
                (void)!read(a->wake[0], &b, 1);
                if (until < a->deadline)
                    a->deadline = until;
                continue;
            }
            a->rc = sg_fail(&a->err, SG_ECANCELLED, "forming the ring was abandoned");
            return NULL;
        }
        if (n == 0 && lfd < 0 && net_now() < a->deadline)
            n = 1; /* the backoff is over: accept again */
        if (n == 0) {
            a->rc = sg_fail(&a->err, SG_ETIMEOUT,
                            "forming the ring: timed out waiting for rank %d (%s) to connect to "
                            "rank %d's listener%s%s",
                            c->left, c->left_peer, c->rank,
                            a->refused[0] ? "; refused meanwhile: " : "", a->refused);
            return NULL;
        }
        int fd = -1;
        char peer[NET_PEER_MAX];
        /* a failed accept backs off, it does not end the formation (no caps: one
         * connection is handled at a time, each within COLL_HANDSHAKE) */
        int got = net_gate_accept(&a->gate, a->lfd, &fd, peer, sizeof peer);
        if (got != 1)
            continue;
        net_gate_release(&a->gate, peer);
        if (accept_one(a, fd, peer)) {
            c->fd_left = fd;
            a->rc = 0;
            return NULL;
        }
        net_close(&fd);
    }
}

/* Connects to the right neighbour, authenticates and says HELLO. */
static int connect_right(CollComm *c, const char *host, int port, const uint8_t *secret,
                         size_t secret_len, double deadline, SgError *err)
{
    /* A refused connection is retried until the deadline: the right
     * neighbour's process may not have bound its listener yet. */
    int rc, tries = 0;
    while ((rc = net_connect(host, port, deadline, &c->fd_right, err)) == SG_EIO &&
           net_now() + 0.05 < deadline)
        tries++, poll(NULL, 0, 50);
    if (rc < 0 && tries > 0)
        sg_context(err, "retried for %.1fs: ", 0.05 * tries);
    if (rc == 0)
        rc = net_auth_client(c->fd_right, secret, secret_len, c->mode, deadline, c->right_peer,
                             &c->sright, err);
    uint8_t hello[COLL_HELLO_LEN], *p = NULL;
    hello_encode(hello, c->rank, c->size, c->check);
    if (rc == 0)
        rc = net_frame_send(c->fd_right, &c->sright, NET_FRAME_COLL, COLL_FRAME_HELLO, hello,
                            sizeof hello, deadline, c->right_peer, err);
    NetFrameHeader h;
    if (rc == 0)
        rc = net_frame_recv(c->fd_right, &c->sright, SG_ERROR_MAX, deadline, c->right_peer, &h, &p,
                            err);
    if (rc == 0 && h.type == NET_FRAME_COLL && h.flags == COLL_FRAME_REFUSE)
        rc = sg_fail(err, SG_ECLUSTER, "it refused this rank: %.*s", (int)h.length, (char *)p);
    else if (rc == 0 && (h.type != NET_FRAME_COLL || h.flags != COLL_FRAME_HELLO_OK ||
                         h.length != COLL_HELLO_LEN))
        rc = sg_fail(err, SG_EPROTO, "it sent a %s frame (flags %u) instead of a collective hello",
                     net_frame_type_name(h.type), h.flags);
    else if (rc == 0 && ((int)get_u32(p) != c->right || get_u64(p + 8) != c->check))
        rc = sg_fail(err, SG_ECLUSTER, "it answers as rank %d of another ring", (int)get_u32(p));
    free(p);
    if (rc < 0)
        sg_context(err, "forming the ring: connecting to rank %d (%s): ", c->right, c->right_peer);
    return rc;
}

int coll_comm_new(int lfd, const uint8_t *secret, size_t secret_len, NetSecurity mode, int rank,
                  int size, const char *const *hosts, const int *ports, double timeout,
                  CollComm **out, SgError *err)
{
    double deadline;
    int rc;
    *out = NULL;
    if ((rc = net_auth_check_secret(secret_len, err)) < 0 ||
        (rc = net_deadline(timeout, "forming the ring", &deadline, err)) < 0)
        return rc;
    if (mode != NET_SEC_NONE && mode != NET_SEC_AUTH && mode != NET_SEC_ENCRYPT)
        return sg_fail(err, SG_EINVAL, "unknown security mode %d", (int)mode);
    if (size < 1 || rank < 0 || rank >= size)
        return sg_fail(err, SG_EINVAL, "rank %d is outside 0..%d (the address list has %d entries)",
                       rank, size - 1, size);
    CollComm *c = calloc(1, sizeof *c);
    if (c == NULL || (c->tmp = malloc(COLL_TMP_BYTES)) == NULL ||
        (c->stage = malloc(COLL_TMP_BYTES)) == NULL ||
        (c->peers = calloc((size_t)size, NET_PEER_MAX)) == NULL) {
        coll_comm_free(c);
        return sg_fail(err, SG_ENOMEM, "allocating a communicator");
    }
    pthread_mutex_init(&c->mu, NULL);
    c->rank = rank, c->size = size, c->timeout = timeout;
    c->mode = mode, c->sec = mode != NET_SEC_NONE;
    c->left = (rank + size - 1) % size, c->right = (rank + 1) % size;
    c->fd_left = c->fd_right = -1;
    c->check = ring_check(size, hosts, ports);
    for (int i = 0; i < size; i++)
        snprintf(c->peers + (size_t)i * NET_PEER_MAX, NET_PEER_MAX, "%s:%d", hosts[i], ports[i]);
    snprintf(c->left_peer, sizeof c->left_peer, "%s:%d", hosts[c->left], ports[c->left]);
    snprintf(c->right_peer, sizeof c->right_peer, "%s:%d", hosts[c->right], ports[c->right]);
    c->spin = local_ranks(size, rank, hosts) <= usable_cpus();
    if (size == 1) {
        *out = c;
        return SG_OK;
    }
    Acceptor a = {.c = c,
                  .lfd = lfd,
                  .secret = secret,
                  .secret_len = secret_len,
                  .deadline = deadline,
                  .wake = {-1, -1}};
    pthread_t th;
    if ((rc = net_gate_init(&a.gate, 0, 0, err)) < 0) {
        coll_comm_free(c);
        return rc;
    }
    if ((rc = net_wake_pipe(a.wake, err)) < 0) {
        net_gate_free(&a.gate);
        coll_comm_free(c);
        return rc;
    }
    if (pthread_create(&th, NULL, acceptor_main, &a) != 0) {
        net_close(&a.wake[0]), net_close(&a.wake[1]);
        net_gate_free(&a.gate);
        coll_comm_free(c);
        return sg_fail(err, SG_ENOMEM, "starting the ring's accept thread");
    }
    rc = connect_right(c, hosts[c->right], ports[c->right], secret, secret_len, deadline, err);
    /* Another secret or security mode is a configuration error the left
     * neighbour is likely to meet at this very moment: the listener serves
     * handshakes 1 s more, so that the left's fails naming the mismatch
     * rather than finding this rank gone (and the right's, which waits for
     * this rank's response, ends now: its connection closes). */
    if (rc == SG_EAUTH)
        __atomic_store_n(&a.grace_ms, 1000, __ATOMIC_SEQ_CST);
    if (rc < 0) {
        net_close(&c->fd_right); /* the right's listener sees it now, not at its deadline */
        net_wake(a.wake[1]);
    }
    pthread_join(th, NULL);
    net_close(&a.wake[0]), net_close(&a.wake[1]);
    net_gate_free(&a.gate);
    if (rc == 0 && a.rc < 0) {
        *err = a.err;
        rc = a.rc;
    } else if (rc < 0 && a.refused[0]) {
        size_t len = strlen(err->msg);
        snprintf(err->msg + len, sizeof err->msg - len,
                 "; meanwhile this rank's listener refused: %s", a.refused);
    }
    if (rc < 0) {
        coll_comm_free(c);
        return rc;
    }
    *out = c;
    return SG_OK;
}

int coll_comm_rank(const CollComm *c)
{
    return c->rank;
}

int coll_comm_size(const CollComm *c)
{
    return c->size;
}

double coll_comm_timeout(const CollComm *c)
{
    return c->timeout;
}

void coll_comm_stats(CollComm *c, CollStats *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->stats;
    out->broken = c->broken || c->closed;
    pthread_mutex_unlock(&c->mu);
}

void coll_comm_close(CollComm *c)
{
    /* Between collectives, a goodbye tells the left neighbour (which may
     * still be receiving the last collective's data) that this is no
     * failure; during one, the shutdown alone fails it everywhere. */
    if (pthread_mutex_trylock(&c->mu) == 0) {
        SgError e;
        if (!c->broken && !c->closed && c->fd_left >= 0)
            (void)net_frame_send(c->fd_left, &c->sleft, NET_FRAME_COLL, COLL_FRAME_BYE, NULL, 0,
                                 net_now() + 0.05, c->left_peer, &e);
        pthread_mutex_unlock(&c->mu);
    }
    __atomic_store_n(&c->closed, 1, __ATOMIC_SEQ_CST);
    /* shutdown first, without the lock: a collective blocked in poll wakes
     * up with an error; then the lock is free to close the descriptors. */
    if (c->fd_left >= 0)
        shutdown(c->fd_left, SHUT_RDWR);
    if (c->fd_right >= 0)
        shutdown(c->fd_right, SHUT_RDWR);
    pthread_mutex_lock(&c->mu);
    net_close(&c->fd_left);
    net_close(&c->fd_right);
    net_session_free(&c->sleft); /* wipes the keys */
    net_session_free(&c->sright);
    pthread_mutex_unlock(&c->mu);
}

void coll_comm_free(CollComm *c)
{
    if (c == NULL)
        return;
    net_close(&c->fd_left);
    net_close(&c->fd_right);
    net_session_free(&c->sleft);
    net_session_free(&c->sright);
    free(c->tmp);
    free(c->stage);
    free(c->peers);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* ---- the transfer engine ----------------------------------------------------------- */

/* One ring step: send slen wire bytes from sptr to the right while receiving
 * rlen from the left; relay = 1 sends only bytes already received into sptr
 * (== rdst). Receive: straight into rdst, or through c->tmp to consume(ctx,
 * element offset, wire bytes, whole elements). Its callers send bytes as they
 * are (headers, broadcasts, allgathers); the encoding of float32 values for
 * the wire is the allreduce's own (ring_allreduce). */
typedef struct Xfer {
    const uint8_t *sptr;
    size_t slen;
    int relay;
    uint8_t *rdst;
    size_t rlen, wsz;
    void (*consume)(void *ctx, size_t elem_off, const uint8_t *wire, size_t n);
    void *ctx;
    int from_rank; /* whose data arrives (for timeouts), -1: the left neighbour */
} Xfer;

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
    int rc = net_frame_recv(c->fd_right, &c->sright, SG_ERROR_MAX + 8, net_now() + wait,
                            c->right_peer, &h, &p, &e);
    if (rc == SG_EAUTH) {
        /* a notice that fails its check is this rank's failure to report
         * (and the session is spent: nothing more is read from the right) */
        c->right_eof = 1;
        sg_fail(out, SG_EAUTH, "rank %d (%s): %.900s", c->right, c->right_peer, e.msg);
        got = 1;
    } else if (rc == 0 && h.type == NET_FRAME_COLL && h.flags == COLL_FRAME_ABORT &&
               h.length >= 8) {
        int32_t code = (int32_t)get_u32(p);
        c->notice_origin = (int)get_u32(p + 4);
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

/* Breaks the communicator. First it looks for a notice from the right (a
 * failure elsewhere, which then is the error to report, naming the rank that
 * failed rather than the neighbour whose connection closed because of it),
 * then passes the notice on to the left neighbour (on the direction of that
 * connection no data uses) and shuts both connections down, so the whole
 * ring fails now rather than each rank at its timeout. */
static int comm_break(CollComm *c, SgError *err)
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
        put_u32(buf, (uint32_t)c->notice_code);
        put_u32(buf + 4, (uint32_t)c->notice_origin);
        memcpy(buf + 8, c->notice, len);
        (void)net_frame_send(c->fd_left, &c->sleft, NET_FRAME_COLL, COLL_FRAME_ABORT, buf, 8 + len,
                             net_now() + 0.05, c->left_peer, &n);
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
    return comm_break(c, err);
}

/* ---- protected data records (a session on: coll.h "Security") ----------------------
 *
 * The logical stream of one step one way is cut into records of
 * rec_len(done, total) bytes (COLL_REC_BYTES but the last); a record is seq | payload | tag on the
 * wire. The sender seals a whole record before writing it: "auth" authenticates the payload where
 * it lies and sends it from there (no copy: a record's bytes are not changed before the right
 * neighbour has received them, the same property the plain stream relies on), "encrypt" encrypts it
 * into c->stage (in place when compression already encoded it there). The receiver reads a record
 * into its destination (rdst, or c->tmp for what is reduced or converted), opening it in place as
 * it arrives, and the record's bytes count only once its tag checked. */
typedef struct Rec {
    uint8_t seq[NET_SESSION_SEQ], tag[NET_SESSION_TAG];
    uint8_t *payload;
    size_t len, pos; /* payload bytes; wire bytes of the record done so far */
    int busy;        /* a record is being written / read */
} Rec;

#define REC_WIRE(len) (NET_SESSION_SEQ + (len) + NET_SESSION_TAG)

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

/* Seals the next record of len bytes at src (see above for where its
 * payload is sent from). */
static int rec_seal(CollComm *c, Rec *r, const uint8_t *src, size_t len, SgError *err)
{
    NetSession *s = &c->sright;
    uint8_t ad[NET_FRAME_HEADER_SIZE];
    /* "auth": in == out, so the session only authenticates (nothing is written) */
    uint8_t *out = s->mode == NET_SEC_ENCRYPT ? c->stage : (uint8_t *)src;
    rec_ad(ad, len);
    rec_start(r, out, len);
    int rc = net_session_seal_begin(s, ad, sizeof ad, r->seq, err);
    if (rc == 0)
        rc = net_session_seal_update(s, src, out, len, err);
    if (rc == 0)
        rc = net_session_seal_end(s, r->tag, err);
    return rc;
}

/* Writes what the socket takes of the sealed record r: its payload length
 * once the record is all written, else 0; or a negative status. */
static long rec_write(CollComm *c, Rec *r, SgError *err)
{
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

/* The protected send step of a transfer whose logical stream is total bytes at base (or,
 * with comp, fp16/bf16 values encoded from the float32 at base through c->stage): once the previous
 * record is all written, seals the next one at done; then writes what the socket takes.
 * Returns rec_write's result, or a negative status from sealing. */
static long rec_send_step(CollComm *c, Rec *tx, const uint8_t *base, size_t done, size_t total,
                          CollCompression comp, SgError *e)
{
    if (!tx->busy) {
        size_t len = rec_len(done, total);
        const uint8_t *src = comp != COLL_COMP_NONE ? c->stage : base + done;
        if (comp != COLL_COMP_NONE)
            coll_encode(c->stage, (const float *)base + done / 2, len / 2, comp);
        int rc = rec_seal(c, tx, src, len, e);
        if (rc < 0)
            return rc;
    }
    return rec_write(c, tx, e);
}

/* Reads what has arrived of the record r (never past it) and opens it in
 * place: its payload length once the whole record is in and its tag
 * checked, else 0; or a negative status (SG_EAUTH from the session naming
 * the peer, the frame and its seq). */
static long rec_read(CollComm *c, Rec *r, SgError *err)
{
    NetSession *s = &c->sleft;
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

/* poll() of a transfer step until the deadline: returns as poll does (0 once
 * the deadline passed). With c->spin it first polls without blocking for up
 * to COLL_SPIN_SECONDS, yielding the CPU between polls. */
static int coll_poll(const CollComm *c, struct pollfd *p, nfds_t np, double deadline)
{
    if (c->spin) {
        double until = net_now() + COLL_SPIN_SECONDS;
        if (until > deadline)
            until = deadline;
        for (;;) {
            int n = poll(p, np, 0);
            if (n != 0)
                return n;
            if (net_now() >= until)
                break;
            sched_yield();
        }
    }
    return poll(p, np, net_poll_ms(deadline));
}

/* The plain send step of a transfer (no session): writes what the socket
 * takes of the stream at base from done up to end, capped at
 * COLL_SEND_BYTES; or, with comp, of fp16/bf16 values encoded from the
 * float32 at base through c->stage, COLL_TMP_BYTES / 2 of them at most, a batch encoded once
 * the previous one is all written (*stage_have bytes staged, *stage_pos of
 * them written). Returns the bytes written (counted in c->stats.bytes_sent),
 * or a negative status. */
static long ring_write_plain(CollComm *c, const uint8_t *base, size_t done, size_t end,
                             CollCompression comp, size_t *stage_have, size_t *stage_pos,
                             SgError *e)
{
    const uint8_t *src;
    size_t len;
    if (comp != COLL_COMP_NONE) {
        if (*stage_pos == *stage_have) {
            size_t elems = (end - done) / 2;
            if (elems > COLL_TMP_BYTES / 2)
                elems = COLL_TMP_BYTES / 2;
            coll_encode(c->stage, (const float *)base + done / 2, elems, comp);
            *stage_have = 2 * elems, *stage_pos = 0;
        }
        src = c->stage + *stage_pos, len = *stage_have - *stage_pos;
    } else {
        src = base + done, len = end - done;
        if (len > COLL_SEND_BYTES)
            len = COLL_SEND_BYTES;
    }
    long put = net_write_some(c->fd_right, src, len, c->right_peer, e);
    if (put < 0)
        return put;
    *stage_pos += (size_t)put;
    c->stats.bytes_sent += (uint64_t)put;
    return put;
}

/* The plain receive step of a transfer (no session): reads what has arrived
 * from the left, at most cap bytes, straight into dst; or, with dst NULL,
 * into c->tmp after the tmp_have bytes already there (capped by the room
 * left). Returns the bytes read (counted in c->stats.bytes_received), or a
 * negative status. */
static long ring_read_plain(CollComm *c, uint8_t *dst, size_t cap, size_t tmp_have, SgError *e)
{
    if (dst == NULL) {
        dst = c->tmp + tmp_have;
        if (cap > COLL_TMP_BYTES - tmp_have)
            cap = COLL_TMP_BYTES - tmp_have;
    }
    long got = net_read_some(c->fd_left, dst, cap, c->left_peer, e);
    if (got > 0)
        c->stats.bytes_received += (uint64_t)got;
    return got;
}

static int xfer_run(CollComm *c, Xfer *x, double deadline, const char *what, SgError *err)
{
    size_t sdone = 0, rdone = 0, tmp_have = 0, stage_have = 0, stage_pos = 0;
    Rec tx = {0}, rx = {0}; /* with a session: rdone and sdone count whole records */
    SgError e;
    while (sdone < x->slen || rdone < x->rlen) {
        /* The right is watched while it is open: it sends nothing but a
         * failure notice. Its EOF fails the step only if we still have to
         * send to it (a right neighbour that finished and left is fine). */
        int want_send = sdone < x->slen && (!x->relay || sdone < rdone);
        struct pollfd p[2];
        int np = 0, is = -1, ir = -1;
        if (sdone < x->slen && c->right_eof)
            return peer_failure(c, SG_EPEER, 0, &e, what, err);
        if (!c->right_eof) {
            p[np] =
                (struct pollfd){.fd = c->fd_right, .events = POLLIN | (want_send ? POLLOUT : 0)};
            is = np++;
        }
        if (rdone < x->rlen) {
            p[np] = (struct pollfd){.fd = c->fd_left, .events = POLLIN};
            ir = np++;
        }
        int n = coll_poll(c, p, (nfds_t)np, deadline);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            sg_fail_errno(err, SG_EIO, errno, "poll during %s", what);
            return comm_break(c, err);
        }
        if (n == 0) {
            if (ir >= 0) {
                int from = x->from_rank >= 0 ? x->from_rank : c->left;
                char via[NET_PEER_MAX + 32] = "";
                if (from != c->left)
                    snprintf(via, sizeof via, ", through rank %d (%s)", c->left, c->left_peer);
                sg_fail(err, SG_ETIMEOUT,
                        "timed out after %gs in %s waiting for rank %d (%s%s) (%zu of %zu bytes "
                        "arrived)",
                        c->cur_timeout, what, from, c->peers + (size_t)from * NET_PEER_MAX, via,
                        rdone, x->rlen);
            } else {
                sg_fail(err, SG_ETIMEOUT,
                        "timed out after %gs in %s sending to rank %d (%s) (%zu of %zu bytes "
                        "taken)",
                        c->cur_timeout, what, c->right, c->right_peer, sdone, x->slen);
            }
            return comm_break(c, err);
        }
        if (is >= 0 && (p[is].revents & (POLLIN | POLLHUP | POLLERR))) {
            int got = read_notice(c, COLL_NOTICE_WAIT, err);
            if (got == 1)
                return comm_break(c, err);
            c->right_eof = 1;
            if (got == 0 || sdone < x->slen) /* died, or left with data still owed to it */
                return peer_failure(c, SG_EPEER, 0, &e, what, err);
            continue;
        }
        /* The send first (what it writes was there before this poll): the
         * peer waits for it while this rank reads. */
        if (want_send && is >= 0 && (p[is].revents & POLLOUT) && c->sec) {
            /* a relay's record is whole once sdone < rdone: the right
             * neighbour's rlen is our slen, cut the same way as ours */
            long put = rec_send_step(c, &tx, x->sptr, sdone, x->slen, COLL_COMP_NONE, &e);
            if (put < 0)
                return peer_failure(c, (int)put, 0, &e, what, err);
            sdone += (size_t)put;
        } else if (want_send && is >= 0 && (p[is].revents & POLLOUT)) {
            /* a relay sends only what has arrived */
            long put = ring_write_plain(c, x->sptr, sdone, x->relay ? rdone : x->slen,
                                        COLL_COMP_NONE, &stage_have, &stage_pos, &e);
            if (put < 0)
                return peer_failure(c, (int)put, 0, &e, what, err);
            sdone += (size_t)put;
        }
        if (ir >= 0 && p[ir].revents && c->sec) {
            if (!rx.busy)
                rec_start(&rx, x->rdst != NULL ? x->rdst + rdone : c->tmp, rec_len(rdone, x->rlen));
            long got = rec_read(c, &rx, &e);
            if (got < 0)
                return peer_failure(c, (int)got, 1, &e, what, err);
            rdone += (size_t)got;
            if (x->rdst == NULL && got > 0)
                x->consume(x->ctx, (rdone - (size_t)got) / x->wsz, c->tmp, (size_t)got / x->wsz);
        } else if (ir >= 0 && p[ir].revents) {
            long got = ring_read_plain(c, x->rdst != NULL ? x->rdst + rdone : NULL, x->rlen - rdone,
                                       tmp_have, &e);
            if (got < 0)
                return peer_failure(c, (int)got, 1, &e, what, err);
            rdone += (size_t)got;
            if (x->rdst == NULL && got > 0) {
                tmp_have += (size_t)got;
                size_t whole = tmp_have / x->wsz;
                if (whole > 0) {
                    x->consume(x->ctx, (rdone - tmp_have) / x->wsz, c->tmp, whole);
                    memmove(c->tmp, c->tmp + whole * x->wsz, tmp_have - whole * x->wsz);
                    tmp_have -= whole * x->wsz;
                }
            }
        }
    }
    return SG_OK;
}

/* ---- per-collective header ---------------------------------------------------------- */

typedef struct CollHeader {
    uint64_t seq, count;
    uint32_t kind, op, dtype, comp, rank;
    int32_t root;
} CollHeader;

static void header_encode(uint8_t out[COLL_HDR_FRAME], const CollHeader *h)
{
    net_frame_header_encode(out, NET_FRAME_COLL, COLL_FRAME_HEADER, COLL_HDR_LEN);
    uint8_t *p = out + NET_FRAME_HEADER_SIZE;
    memset(p, 0, COLL_HDR_LEN);
    put_u64(p, h->seq);
    put_u32(p + 8, h->kind);
    put_u32(p + 12, h->op);
    put_u32(p + 16, h->dtype);
    put_u32(p + 20, h->comp);
    put_u32(p + 24, (uint32_t)h->root);
    put_u32(p + 28, h->rank);
    put_u64(p + 32, h->count);
}

static int header_decode(const uint8_t in[COLL_HDR_FRAME], CollHeader *h, SgError *err)
{
    NetFrameHeader fh;
    int rc = net_frame_header_decode(in, COLL_HDR_FRAME, COLL_HDR_LEN, &fh, err);
    if (rc < 0)
        return rc;
    if (fh.type != NET_FRAME_COLL || fh.flags != COLL_FRAME_HEADER || fh.length != COLL_HDR_LEN)
        return sg_fail(err, SG_EPROTO, "a %s frame (flags %u, %u bytes) instead of a header",
                       net_frame_type_name(fh.type), fh.flags, fh.length);
    const uint8_t *p = in + NET_FRAME_HEADER_SIZE;
    h->seq = get_u64(p);
    h->kind = get_u32(p + 8);
    h->op = get_u32(p + 12);
    h->dtype = get_u32(p + 16);
    h->comp = get_u32(p + 20);
    h->root = (int32_t)get_u32(p + 24);
    h->rank = get_u32(p + 28);
    h->count = get_u64(p + 32);
    return SG_OK;
}

/* Every rank's header (hs[size]) from a ring allgather of header frames. */
static int header_exchange(CollComm *c, const CollHeader *mine, CollHeader *hs, double deadline,
                           const char *what, SgError *err)
{
    int n = c->size, r = c->rank;
    uint8_t *frames = malloc((size_t)n * COLL_HDR_FRAME);
    if (frames == NULL)
        return sg_fail(err, SG_ENOMEM, "allocating %d headers", n);
    header_encode(frames + (size_t)r * COLL_HDR_FRAME, mine);
    hs[r] = *mine;
    int rc = SG_OK;
    for (int k = 0; k < n - 1 && rc == 0; k++) {
        int s = (r - k + n) % n, t = (r - k - 1 + 2 * n) % n;
        Xfer x = {.sptr = frames + (size_t)s * COLL_HDR_FRAME,
                  .slen = COLL_HDR_FRAME,
                  .rdst = frames + (size_t)t * COLL_HDR_FRAME,
                  .rlen = COLL_HDR_FRAME,
                  .from_rank = t};
        char w[96];
        snprintf(w, sizeof w, "%s (the header of rank %d)", what, t);
        rc = xfer_run(c, &x, deadline, w, err);
        if (rc == 0 && (rc = header_decode(frames + (size_t)t * COLL_HDR_FRAME, &hs[t], err)) < 0) {
            sg_context(err, "%s: rank %d (%s) sent ", what, c->left, c->left_peer);
            comm_break(c, err);
        } else if (rc == 0 && (hs[t].rank != (uint32_t)t || hs[t].seq != mine->seq)) {
            sg_fail(err, SG_EPROTO,
                    "%s: the ring is out of step: rank %d's header says rank %u, collective #%llu "
                    "(this rank is at #%llu)",
                    what, t, hs[t].rank, (unsigned long long)hs[t].seq,
                    (unsigned long long)mine->seq);
            rc = comm_break(c, err);
        }
    }
    free(frames);
    return rc;
}

static const char *dtype_name(uint32_t d)
{
    static const char *names[] = {"?", "float32", "float64", "int32", "int64", "bytes"};
    return d < sizeof names / sizeof *names ? names[d] : "?";
}

static const char *op_name(uint32_t o)
{
    static const char *names[] = {"?", "sum", "average", "min", "max"};
    return o < sizeof names / sizeof *names ? names[o] : "?";
}

static const char *comp_name(uint32_t o)
{
    static const char *names[] = {"none", "fp16", "bf16"};
    return o < sizeof names / sizeof *names ? names[o] : "?";
}

/* Formats one field of header h for a mismatch message. */
static void field_str(char *out, size_t cap, int field, const CollHeader *h)
{
    switch (field) {
    case 0:
        snprintf(out, cap, "%s", kind_name(h->kind));
        break;
    case 1:
        snprintf(out, cap, "%s", op_name(h->op));
        break;
    case 2:
        snprintf(out, cap, "%s", dtype_name(h->dtype));
        break;
    case 3:
        snprintf(out, cap, "%s", comp_name(h->comp));
        break;
    case 4:
        snprintf(out, cap, "%llu", (unsigned long long)h->count);
        break;
    case 5:
        snprintf(out, cap, "%d", h->root);
        break;
    default:
        snprintf(out, cap, "%u", h->dtype);
    }
}

static uint64_t field_val(int field, const CollHeader *h)
{
    switch (field) {
    case 0:
        return h->kind;
    case 1:
        return h->op;
    case 2:
    case 6:
        return h->dtype;
    case 3:
        return h->comp;
    case 4:
        return h->count;
    default:
        return (uint64_t)(uint32_t)h->root;
    }
}

/* The header fields headers_agree compares (bit i: field i of field_str). */
enum {
    AGREE_KIND = 1u << 0,
    AGREE_OP = 1u << 1,
    AGREE_DTYPE = 1u << 2,
    AGREE_COMP = 1u << 3,
    AGREE_COUNT = 1u << 4,
    AGREE_ROOT = 1u << 5,
    AGREE_TAG = 1u << 6,
};

/* Checks that every rank agrees on the fields in mask (AGREE_*: kind, op,
 * dtype, compression, count, root, tag). Every rank sees
 * the same headers, so every rank fails the same way, and the streams stay in
 * step (no data was sent). */
static int headers_agree(CollComm *c, const CollHeader *hs, unsigned mask, const char *what,
                         SgError *err)
{
    static const char *fields[] = {"collective", "op",   "dtype", "compression",
                                   "count",      "root", "dtype"};
    for (int f = 0; f < 7; f++) {
        if (!(mask & (1u << f)))
            continue;
        int odd = 0;
        for (int i = 1; i < c->size; i++)
            odd += field_val(f, &hs[i]) != field_val(f, &hs[0]);
        if (odd == 0)
            continue;
        char msg[SG_ERROR_MAX], v[64];
        int len = snprintf(msg, sizeof msg, "%s: the ranks disagree on the %s%s:", what, fields[f],
                           f == 4 ? (mask & AGREE_DTYPE ? " (elements)" : " (bytes)") : "");
        for (int i = 0; i < c->size && len < (int)sizeof msg - 80; i++) {
            field_str(v, sizeof v, f, &hs[i]);
            len +=
                snprintf(msg + len, sizeof msg - (size_t)len, "%s rank %d: %s", i ? "," : "", i, v);
        }
        return sg_fail(err, SG_ECLUSTER, "%s", msg);
    }
    return SG_OK;
}

/* Locks c and checks it can run a collective; sets *deadline. */
static int comm_enter(CollComm *c, double timeout, double *deadline, SgError *err)
{
    pthread_mutex_lock(&c->mu);
    int rc = SG_OK;
    if (__atomic_load_n(&c->closed, __ATOMIC_SEQ_CST))
        rc = sg_fail(err, SG_ESTATE, "the communicator was closed");
    else if (c->broken)
        rc =
            sg_fail(err, c->broken_err.code,
                    "the communicator is unusable after an earlier failure: %s", c->broken_err.msg);
    else if (timeout >= 0 || timeout != timeout)
        rc = net_deadline(timeout, "a collective", deadline, err);
    else
        *deadline = net_now() + c->timeout;
    c->cur_timeout = timeout >= 0 ? timeout : c->timeout;
    if (rc < 0)
        pthread_mutex_unlock(&c->mu);
    return rc;
}

static int comm_leave(CollComm *c, double t0, int rc)
{
    c->stats.collectives++;
    c->stats.seconds += net_now() - t0;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Starts the next collective: numbers it (mine->seq, and `what` = "<kind>
 * #seq" for every message about it), exchanges this rank's header with every
 * rank's and checks that they agree on the fields in mask. hs (size entries)
 * receives every rank's header when not NULL. A ring of one agrees with
 * itself. */
static int collective_begin(CollComm *c, CollHeader *mine, const char *kind, unsigned mask,
                            char *what, size_t what_len, CollHeader *hs, double deadline,
                            SgError *err)
{
    mine->seq = ++c->seq;
    mine->rank = (uint32_t)c->rank;
    snprintf(what, what_len, "%s #%llu", kind, (unsigned long long)mine->seq);
    CollHeader *all = hs != NULL ? hs : malloc((size_t)c->size * sizeof *all);
    if (all == NULL)
        return sg_fail(err, SG_ENOMEM, "%s: allocating %d headers", what, c->size);
    all[0] = *mine;
    int rc = c->size > 1 ? header_exchange(c, mine, all, deadline, what, err) : SG_OK;
    if (rc == 0)
        rc = headers_agree(c, all, mask, what, err);
    if (all != hs)
        free(all);
    return rc;
}

/* ---- allreduce ---------------------------------------------------------------------- */

static void segment(size_t count, int n, int i, size_t *off, size_t *cnt)
{
    size_t q = count / (size_t)n, rem = count % (size_t)n, ii = (size_t)i;
    *off = ii * q + (ii < rem ? ii : rem);
    *cnt = q + (ii < rem ? 1 : 0);
}

/* Segments sent (*s) and received (*t) at step j of the 2(n-1) ring steps:
 * n-1 of reduce-scatter, then n-1 of allgather. The segment sent at step
 * j + 1 is always the one received at step j. */
static void ring_step(int n, int r, int j, int *s, int *t)
{
    int k = j < n - 1 ? j : j - (n - 1), base = j < n - 1 ? r : r + 1;
    *s = (base - k + 2 * n) % n;
    *t = (base - k - 1 + 2 * n) % n;
}

static const char *step_what(char *out, size_t cap, uint64_t seq, int step, int n)
{
    snprintf(out, cap, "allreduce #%llu (%s step %d of %d)", (unsigned long long)seq,
             step < n - 1 ? "reduce-scatter" : "allgather", step % (n - 1) + 1, n - 1);
    return out;
}

/* What ring_allreduce was doing, for a message (formatted only when one is). */
#define AR_WHAT step_what(what, sizeof what, seq, step, n)

/* The whole allreduce as one stream each way: the bytes of step j + 1 go
 * out as soon as the same bytes of step j have arrived and been reduced
 * (and, at the last reduce-scatter step, finished: averaged, rounded to the
 * wire format), so no step waits for the previous one to complete and the
 * send never runs more than one step ahead (no cycle, no deadlock). */
static int ring_allreduce(CollComm *c, uint8_t *buf, size_t count, CollDtype dtype, CollOp op,
                          CollCompression comp, double deadline, uint64_t seq, SgError *err)
{
    int n = c->size, r = c->rank, steps = 2 * (n - 1), sj = 0, rj = 0, s, t;
    size_t esz = coll_dtype_size(dtype), wsz = coll_wire_size(dtype, comp);
    size_t sdone = 0, rdone = 0, tmp_have = 0, stage_have = 0, stage_pos = 0;
    size_t soff, scnt, toff, tcnt;
    Rec tx = {0}, rx = {0}; /* with a session: rdone and sdone count whole records, tmp_have 0 */
    SgError e;
    char what[96];
    ring_step(n, r, 0, &s, &t);
    segment(count, n, s, &soff, &scnt);
    segment(count, n, t, &toff, &tcnt);
    while (sj < steps || rj < steps) {
        if (rj < steps && rdone == tcnt * wsz) { /* next receive step */
            if (++rj < steps) {
                ring_step(n, r, rj, &s, &t);
                segment(count, n, t, &toff, &tcnt);
            }
            rdone = tmp_have = 0;
            continue;
        }
        if (sj < steps && sdone == scnt * wsz) { /* next send step */
            if (++sj < steps) {
                ring_step(n, r, sj, &s, &t);
                segment(count, n, s, &soff, &scnt);
            }
            sdone = stage_have = stage_pos = 0;
            continue;
        }
        /* what of the current send step exists yet: all of it, unless it is
         * the segment still being received */
        size_t avail = 0;
        if (sj < steps && (sj == 0 || sj - 1 < rj))
            avail = scnt * wsz;
        else if (sj < steps && sj - 1 == rj)
            avail = rdone - tmp_have;
        /* (sj - 1 > rj: past an empty step, wait for the receive to catch up) */
        int want_send = sdone < avail;
        int step = rj < steps ? rj : sj;
        if (sj < steps && c->right_eof)
            return peer_failure(c, SG_EPEER, 0, &e, AR_WHAT, err);
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
        int pn = coll_poll(c, p, (nfds_t)np, deadline);
        if (pn < 0 && errno == EINTR)
            continue;
        if (pn < 0) {
            sg_fail_errno(err, SG_EIO, errno, "poll during %s", AR_WHAT);
            return comm_break(c, err);
        }
        if (pn == 0) {
            if (rj < steps)
                sg_fail(err, SG_ETIMEOUT,
                        "timed out after %gs in %s waiting for rank %d (%s) (%zu of %zu bytes "
                        "arrived)",
                        c->cur_timeout, AR_WHAT, c->left, c->left_peer, rdone, tcnt * wsz);
            else
                sg_fail(err, SG_ETIMEOUT,
                        "timed out after %gs in %s sending to rank %d (%s) (%zu of %zu bytes "
                        "taken)",
                        c->cur_timeout, AR_WHAT, c->right, c->right_peer, sdone, scnt * wsz);
            return comm_break(c, err);
        }
        if (is >= 0 && (p[is].revents & (POLLIN | POLLHUP | POLLERR))) {
            int got = read_notice(c, COLL_NOTICE_WAIT, err);
            if (got == 1)
                return comm_break(c, err);
            c->right_eof = 1;
            if (got == 0 || sj < steps)
                return peer_failure(c, SG_EPEER, 0, &e, AR_WHAT, err);
            continue;
        }
        /* The send first: what it writes was there before this poll (avail),
         * and the peer waits for it while this rank reads and reduces. */
        if (want_send && is >= 0 && (p[is].revents & POLLOUT) && c->sec) {
            /* avail is whole records: the segment sent now is the one
             * received at the step before, cut the same way */
            const uint8_t *seg = buf + soff * esz;
            long put = rec_send_step(c, &tx, seg, sdone, scnt * wsz, comp, &e);
            if (put < 0)
                return peer_failure(c, (int)put, 0, &e, AR_WHAT, err);
            sdone += (size_t)put;
        } else if (want_send && is >= 0 && (p[is].revents & POLLOUT)) {
            const uint8_t *seg = buf + soff * esz;
            long put = ring_write_plain(c, seg, sdone, avail, comp, &stage_have, &stage_pos, &e);
            if (put < 0)
                return peer_failure(c, (int)put, 0, &e, AR_WHAT, err);
            sdone += (size_t)put;
        }
        if (ir >= 0 && p[ir].revents && c->sec) {
            int reducing = rj < n - 1, direct = !reducing && comp == COLL_COMP_NONE;
            uint8_t *seg = buf + toff * esz;
            if (!rx.busy)
                rec_start(&rx, direct ? seg + rdone : c->tmp, rec_len(rdone, tcnt * wsz));
            long got = rec_read(c, &rx, &e);
            if (got < 0)
                return peer_failure(c, (int)got, 1, &e, AR_WHAT, err);
            size_t whole = (size_t)got / wsz, at = rdone / wsz;
            rdone += (size_t)got;
            if (whole > 0 && reducing) {
                coll_reduce(seg + at * esz, c->tmp, whole, dtype, op, comp);
                if (rj == n - 2)
                    coll_finish(seg + at * esz, whole, dtype, op, comp, n);
            } else if (whole > 0 && !direct) {
                coll_decode((float *)(seg + at * esz), c->tmp, whole, comp);
            }
        } else if (ir >= 0 && p[ir].revents) {
            int reducing = rj < n - 1, direct = !reducing && comp == COLL_COMP_NONE;
            uint8_t *seg = buf + toff * esz;
            long got =
                ring_read_plain(c, direct ? seg + rdone : NULL, tcnt * wsz - rdone, tmp_have, &e);
            if (got < 0)
                return peer_failure(c, (int)got, 1, &e, AR_WHAT, err);
            rdone += (size_t)got;
            if (!direct && got > 0) {
                tmp_have += (size_t)got;
                size_t whole = tmp_have / wsz, at = (rdone - tmp_have) / wsz;
                if (whole > 0 && reducing) {
                    coll_reduce(seg + at * esz, c->tmp, whole, dtype, op, comp);
                    if (rj == n - 2) /* this rank's own segment, complete */
                        coll_finish(seg + at * esz, whole, dtype, op, comp, n);
                } else if (whole > 0) {
                    coll_decode((float *)(seg + at * esz), c->tmp, whole, comp);
                }
                memmove(c->tmp, c->tmp + whole * wsz, tmp_have - whole * wsz);
                tmp_have -= whole * wsz;
            }
        }
    }
    return SG_OK;
}
#undef AR_WHAT

int coll_allreduce(CollComm *c, void *buf, size_t count, CollDtype dtype, CollOp op,
                   CollCompression comp, double timeout, SgError *err)
{
    if (coll_dtype_size(dtype) == 0 || dtype == COLL_BYTES)
        return sg_fail(err, SG_EINVAL,
                       "allreduce of dtype %d (float32, float64, int32, int64 only)", (int)dtype);
    if (op < COLL_SUM || op > COLL_MAX)
        return sg_fail(err, SG_EINVAL, "allreduce op %d (sum, average, min, max only)", (int)op);
    if (comp != COLL_COMP_NONE && (dtype != COLL_F32 || comp > COLL_COMP_BF16))
        return sg_fail(err, SG_EINVAL, "%s compression applies to float32 only, not %s",
                       comp_name(comp), dtype_name(dtype));
    double deadline, t0 = net_now();
    int rc = comm_enter(c, timeout, &deadline, err);
    if (rc < 0)
        return rc;
    c->stats.allreduces++;
    if (c->size == 1)
        return comm_leave(c, t0, SG_OK);
    CollHeader mine = {
        .count = count, .kind = KIND_ALLREDUCE, .op = op, .dtype = dtype, .comp = comp};
    char what[64];
    rc = collective_begin(c, &mine, "allreduce",
                          AGREE_KIND | AGREE_OP | AGREE_DTYPE | AGREE_COMP | AGREE_COUNT, what,
                          sizeof what, NULL, deadline, err);
    if (rc == 0)
        rc = ring_allreduce(c, buf, count, dtype, op, comp, deadline, mine.seq, err);
    return comm_leave(c, t0, rc);
}

/* ---- broadcast, allgather, barrier --------------------------------------------------- */

/* Pipelined relay of bytes from root around the ring (into buf everywhere). */
static int relay(CollComm *c, uint8_t *buf, size_t bytes, int root, double deadline,
                 const char *what, SgError *err)
{
    int is_root = c->rank == root, last = c->right == root;
    Xfer x = {.sptr = buf,
              .slen = last ? 0 : bytes,
              .relay = !is_root,
              .rdst = buf,
              .rlen = is_root ? 0 : bytes,
              .from_rank = root};
    return xfer_run(c, &x, deadline, what, err);
}

static int check_root(const CollComm *c, int root, SgError *err)
{
    if (root < 0 || root >= c->size)
        return sg_fail(err, SG_EINVAL, "broadcast root %d is outside 0..%d", root, c->size - 1);
    return SG_OK;
}

int coll_broadcast(CollComm *c, void *buf, size_t bytes, int root, uint32_t tag, double timeout,
                   SgError *err)
{
    double deadline, t0 = net_now();
    int rc = check_root(c, root, err);
    if (rc < 0 || (rc = comm_enter(c, timeout, &deadline, err)) < 0)
        return rc;
    c->stats.broadcasts++;
    if (c->size == 1)
        return comm_leave(c, t0, SG_OK);
    CollHeader mine = {.count = bytes, .kind = KIND_BROADCAST, .dtype = tag, .root = root};
    char what[64];
    rc = collective_begin(c, &mine, "broadcast", AGREE_KIND | AGREE_COUNT | AGREE_ROOT | AGREE_TAG,
                          what, sizeof what, NULL, deadline, err);
    if (rc == 0)
        rc = relay(c, buf, bytes, root, deadline, what, err);
    return comm_leave(c, t0, rc);
}

int coll_broadcast_var(CollComm *c, const void *data, size_t len, int root, size_t max_bytes,
                       void **out, size_t *out_len, double timeout, SgError *err)
{
    double deadline, t0 = net_now();
    *out = NULL, *out_len = 0;
    int rc = check_root(c, root, err);
    if (rc < 0 || (rc = comm_enter(c, timeout, &deadline, err)) < 0)
        return rc;
    c->stats.broadcasts++;
    CollHeader *hs = malloc((size_t)c->size * sizeof *hs);
    if (hs == NULL)
        return comm_leave(c, t0, sg_fail(err, SG_ENOMEM, "allocating headers"));
    CollHeader mine = {
        .count = c->rank == root ? len : 0, .kind = KIND_BROADCAST_VAR, .root = root};
    char what[64];
    rc = collective_begin(c, &mine, "broadcast_bytes", AGREE_KIND | AGREE_ROOT, what, sizeof what,
                          hs, deadline, err);
    size_t bytes = rc == 0 ? (size_t)hs[root].count : 0;
    free(hs);
    if (rc == 0 && bytes > max_bytes)
        rc = sg_fail(err, SG_EINVAL, "%s: rank %d broadcasts %zu bytes, above the limit of %zu",
                     what, root, bytes, max_bytes);
    uint8_t *buf = NULL;
    if (rc == 0 && (buf = malloc(bytes ? bytes : 1)) == NULL)
        rc = sg_fail(err, SG_ENOMEM, "%s: allocating %zu bytes", what, bytes);
    if (rc == 0 && c->rank == root && bytes > 0)
        memcpy(buf, data, bytes);
    if (rc == 0 && c->size > 1)
        rc = relay(c, buf, bytes, root, deadline, what, err);
    if (rc < 0) {
        free(buf);
        return comm_leave(c, t0, rc);
    }
    *out = buf, *out_len = bytes;
    return comm_leave(c, t0, rc);
}

int coll_allgather(CollComm *c, const void *data, size_t len, uint64_t *lens, void **out,
                   double timeout, SgError *err)
{
    double deadline, t0 = net_now();
    *out = NULL;
    int rc = comm_enter(c, timeout, &deadline, err);
    if (rc < 0)
        return rc;
    c->stats.allgathers++;
    int n = c->size, r = c->rank;
    CollHeader *hs = malloc((size_t)n * sizeof *hs);
    size_t *offs = malloc((size_t)(n + 1) * sizeof *offs);
    if (hs == NULL || offs == NULL) {
        free(hs), free(offs);
        return comm_leave(c, t0, sg_fail(err, SG_ENOMEM, "allocating headers"));
    }
    CollHeader mine = {.count = len, .kind = KIND_ALLGATHER};
    char what[64];
    rc = collective_begin(c, &mine, "allgather", AGREE_KIND, what, sizeof what, hs, deadline, err);
    offs[0] = 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        lens[i] = hs[i].count;
        if (hs[i].count > (uint64_t)SIZE_MAX - offs[i])
            rc = sg_fail(err, SG_EINVAL, "%s: sizes overflow", what);
        else
            offs[i + 1] = offs[i] + (size_t)hs[i].count;
    }
    uint8_t *buf = NULL;
    if (rc == 0 && (buf = malloc(offs[n] ? offs[n] : 1)) == NULL)
        rc = sg_fail(err, SG_ENOMEM, "%s: allocating %zu bytes", what, offs[n]);
    if (rc == 0 && len > 0)
        memcpy(buf + offs[r], data, len);
    for (int k = 0; rc == 0 && k < n - 1; k++) {
        int s = (r - k + n) % n, t = (r - k - 1 + 2 * n) % n;
        Xfer x = {.sptr = buf + offs[s],
                  .slen = offs[s + 1] - offs[s],
                  .rdst = buf + offs[t],
                  .rlen = offs[t + 1] - offs[t],
                  .from_rank = t};
        char w[96];
        snprintf(w, sizeof w, "%s (the block of rank %d)", what, t);
        rc = xfer_run(c, &x, deadline, w, err);
    }
    free(hs), free(offs);
    if (rc < 0)
        free(buf);
    else
        *out = buf;
    return comm_leave(c, t0, rc);
}

int coll_barrier(CollComm *c, double timeout, SgError *err)
{
    double deadline, t0 = net_now();
    int rc = comm_enter(c, timeout, &deadline, err);
    if (rc < 0)
        return rc;
    c->stats.barriers++;
    if (c->size == 1)
        return comm_leave(c, t0, SG_OK);
    CollHeader mine = {.kind = KIND_BARRIER};
    char what[64];
    rc = collective_begin(c, &mine, "barrier", AGREE_KIND, what, sizeof what, NULL, deadline, err);
    return comm_leave(c, t0, rc);
}
