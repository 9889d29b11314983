/*
 * coll_ring.c - the ring of the communicator (coll_internal.h): forming it
 * (connect to the right and accept from the left at once, the HMAC handshake
 * and HELLO on both), its life (stats, close with a goodbye, free), and the
 * start of every collective: entering it (the lock, the deadline, an earlier
 * failure) and the header exchange in which the ranks agree on what it is.
 * Not here: moving the data (coll_xfer.c), the collectives (coll.c).
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/sg_le.h"
#include "net/accept.h"
#include "net/auth.h"
#include "net/coll_internal.h"
#include "net/frame.h"

#define COLL_HELLO_LEN 16 /* u32 rank, u32 size, u64 check */
#define COLL_HDR_LEN   48 /* see coll.h */
#define COLL_HDR_FRAME (NET_FRAME_HEADER_SIZE + COLL_HDR_LEN)
#define COLL_HANDSHAKE 10.0 /* seconds for one accepted connection's handshake */

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
    sg_put_le32(out, (uint32_t)rank);
    sg_put_le32(out + 4, (uint32_t)size);
    sg_put_le64(out + 8, check);
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
    double d = sg_now() + COLL_HANDSHAKE;
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
        int prank = (int)sg_get_le32(p), psize = (int)sg_get_le32(p + 4);
        uint64_t pcheck = sg_get_le64(p + 8);
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
        int ms = sg_poll_ms(a->deadline);
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
                double until = sg_now() + grace / 1000.0;
                (void)!read(a->wake[0], &b, 1);
                if (until < a->deadline)
                    a->deadline = until;
                continue;
            }
            a->rc = sg_fail(&a->err, SG_ECANCELLED, "forming the ring was abandoned");
            return NULL;
        }
        if (n == 0 && lfd < 0 && sg_now() < a->deadline)
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
           sg_now() + 0.05 < deadline)
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
    else if (rc == 0 && ((int)sg_get_le32(p) != c->right || sg_get_le64(p + 8) != c->check))
        rc =
            sg_fail(err, SG_ECLUSTER, "it answers as rank %d of another ring", (int)sg_get_le32(p));
    free(p);
    if (rc < 0)
        sg_context(err, "forming the ring: connecting to rank %d (%s): ", c->right, c->right_peer);
    return rc;
}

int coll_comm_new(int lfd, const uint8_t *secret, size_t secret_len, NetSecurity mode, int rank,
                  int size, const char *const *hosts, const int *ports, double timeout,
                  int shared_memory, CollComm **out, SgError *err)
{
    double deadline;
    int rc;
    *out = NULL;
    if ((rc = net_auth_check_secret(secret_len, err)) < 0 ||
        (rc = sg_deadline(timeout, "forming the ring", &deadline, err)) < 0)
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
    c->mode = mode, c->sealer = coll_sealer(mode);
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
    if ((rc = net_gate_init(&a.gate, 0, 0, err)) == 0 && (rc = net_wake_pipe(a.wake, err)) == 0 &&
        pthread_create(&th, NULL, acceptor_main, &a) != 0)
        rc = sg_fail(err, SG_ENOMEM, "starting the ring's accept thread");
    if (rc < 0) { /* what was not set up is still zero (gate) or -1 (pipe): freeing it is a no-op */
        net_close(&a.wake[0]), net_close(&a.wake[1]);
        net_gate_free(&a.gate);
        coll_comm_free(c);
        return rc;
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
    if (rc == 0)
        rc = coll_shm_setup(c, hosts, shared_memory, deadline, err);
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

int coll_comm_shared_memory(const CollComm *c)
{
    return c->shm != NULL;
}

void coll_comm_stats(CollComm *c, CollStats *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->stats;
    out->broken = c->broken || c->closed;
    pthread_mutex_unlock(&c->mu);
}

void coll_comm_count_tables(CollComm *c, uint64_t as_rows, uint64_t dense, uint64_t bytes_sent)
{
    pthread_mutex_lock(&c->mu);
    c->stats.tables_as_rows += as_rows;
    c->stats.tables_dense += dense;
    c->stats.table_bytes_sent += bytes_sent;
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
                                 sg_now() + 0.05, c->left_peer, &e);
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
    coll_shm_free(c->shm);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* ---- per-collective header ---------------------------------------------------------- */

static void header_encode(uint8_t out[COLL_HDR_FRAME], const CollHeader *h)
{
    net_frame_header_encode(out, NET_FRAME_COLL, COLL_FRAME_HEADER, COLL_HDR_LEN);
    uint8_t *p = out + NET_FRAME_HEADER_SIZE;
    memset(p, 0, COLL_HDR_LEN);
    sg_put_le64(p, h->seq);
    sg_put_le32(p + 8, h->kind);
    sg_put_le32(p + 12, h->op);
    sg_put_le32(p + 16, h->dtype);
    sg_put_le32(p + 20, h->comp);
    sg_put_le32(p + 24, (uint32_t)h->root);
    sg_put_le32(p + 28, h->rank);
    sg_put_le64(p + 32, h->count);
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
    h->seq = sg_get_le64(p);
    h->kind = sg_get_le32(p + 8);
    h->op = sg_get_le32(p + 12);
    h->dtype = sg_get_le32(p + 16);
    h->comp = sg_get_le32(p + 20);
    h->root = (int32_t)sg_get_le32(p + 24);
    h->rank = sg_get_le32(p + 28);
    h->count = sg_get_le64(p + 32);
    return SG_OK;
}

int coll_allgather_blocks(CollComm *c, uint8_t *blocks, size_t blk, double deadline,
                          const char *what, const char *unit, SgError *err)
{
    int n = c->size, r = c->rank, rc = SG_OK;
    for (int k = 0; k < n - 1 && rc == 0; k++) {
        int s = (r - k + n) % n, t = (r - k - 1 + 2 * n) % n;
        char w[160];
        snprintf(w, sizeof w, "%s (the %s of rank %d)", what, unit, t);
        CollXfer x = {.steps = 1,
                      .lag = -1,
                      .tx = {blocks + (size_t)s * blk, blk},
                      .rx = {blocks + (size_t)t * blk, blk},
                      .from_rank = t,
                      .what = w};
        rc = coll_xfer_run(c, &x, deadline, err);
    }
    return rc;
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
    int rc = coll_allgather_blocks(c, frames, COLL_HDR_FRAME, deadline, what, "header", err);
    for (int k = 0; k < n - 1 && rc == 0; k++) {
        int t = (r - k - 1 + 2 * n) % n;
        if ((rc = header_decode(frames + (size_t)t * COLL_HDR_FRAME, &hs[t], err)) < 0) {
            sg_context(err, "%s: rank %d (%s) sent ", what, c->left, c->left_peer);
            coll_break(c, err);
        } else if (hs[t].rank != (uint32_t)t || hs[t].seq != mine->seq) {
            sg_fail(err, SG_EPROTO,
                    "%s: the ring is out of step: rank %d's header says rank %u, collective #%llu "
                    "(this rank is at #%llu)",
                    what, t, hs[t].rank, (unsigned long long)hs[t].seq,
                    (unsigned long long)mine->seq);
            rc = coll_break(c, err);
        }
    }
    free(frames);
    return rc;
}

/* The name of value v of header field 0 .. 3 (kind, op, dtype, compression). */
static const char *field_name(int field, uint64_t v)
{
    static const char *const names[4][6] = {
        {"?", "allreduce", "broadcast", "broadcast_bytes", "allgather", "barrier"},
        {"?", "sum", "average", "min", "max"},
        {"?", "float32", "float64", "int32", "int64", "bytes"},
        {"none", "fp16", "bf16"}};
    return v < 6 && names[field][v] != NULL ? names[field][v] : "?";
}

const char *coll_dtype_name(uint32_t dtype)
{
    return field_name(2, dtype);
}

const char *coll_comp_name(uint32_t comp)
{
    return field_name(3, comp);
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

/* Formats field f of header h for a mismatch message. */
static void field_str(char *out, size_t cap, int f, const CollHeader *h)
{
    if (f < 4)
        snprintf(out, cap, "%s", field_name(f, field_val(f, h)));
    else if (f == 5)
        snprintf(out, cap, "%d", h->root);
    else
        snprintf(out, cap, "%llu", (unsigned long long)field_val(f, h));
}

/* Checks that every rank agrees on the fields in mask (AGREE_*, bit f:
 * field f of field_val). Every rank sees
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

int coll_enter(CollComm *c, double timeout, double *deadline, SgError *err)
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
        rc = sg_deadline(timeout, "a collective", deadline, err);
    else
        *deadline = sg_now() + c->timeout;
    c->cur_timeout = timeout >= 0 ? timeout : c->timeout;
    if (rc < 0)
        pthread_mutex_unlock(&c->mu);
    return rc;
}

int coll_leave(CollComm *c, double t0, int rc)
{
    c->stats.collectives++;
    c->stats.seconds += sg_now() - t0;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int coll_begin(CollComm *c, CollHeader *mine, const char *kind, unsigned mask, char *what,
               size_t what_len, CollHeader *hs, double deadline, SgError *err)
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
