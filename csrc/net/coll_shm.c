/*
 * coll_shm.c - the shared-memory links of a ring whose ranks all run on one
 * host (coll_internal.h "CollShm").
 *
 * Over loopback TCP every byte of a ring step is copied twice (into the
 * sender's socket buffer, out into the receiver's), through the kernel's
 * network stack, and under "auth" or "encrypt" sealed and opened once more
 * each way. Between processes of one host a ring buffer in shared memory does
 * with one copy: the sender writes its bytes into its own segment and the
 * right neighbour reduces them from there or copies them to their place.
 *
 * Each rank owns one segment, a file under /dev/shm created with mode 0600,
 * O_EXCL and its pages reserved (posix_fallocate, so a full /dev/shm is an
 * error here and never a SIGBUS later):
 *   magic | cap | nonce | bell, sleeping | head | tail | cap ring bytes
 * head counts the bytes its owner has written in all, tail those its right
 * neighbour has taken; the bytes in [tail, head) are the ring's, at their
 * offset modulo cap. bell is the owner's futex: the left neighbour bumps it
 * after writing into its own ring (the owner's input), the right after taking
 * from the owner's ring (room for the owner's output). A rank maps its own
 * segment, its left's and its right's (one and the same with two ranks).
 *
 * Forming: after the TCP ring formed, when every rank's listener has the same
 * host, each rank creates its segment and the ranks allgather the segments'
 * names and nonces over the ring's sessions; each opens its neighbours'
 * segments and checks that they are regular files of this user of the
 * expected size holding the expected nonce (so a rank in another container,
 * whose /dev/shm is another, finds no segment or a foreign one), and a second
 * allgather says whether every rank did. Only then does the ring use shared
 * memory, on every link, and each rank unlinks its own file (the mappings
 * stay; nothing is left behind once the ranks exit). Otherwise the ring stays
 * on TCP. The TCP connections remain: they carry failure notices and
 * goodbyes, and their EOF is how a rank learns that a neighbour died.
 *
 * The segment is not sealed in "auth" or "encrypt" mode: those protect bytes
 * on a network; these never leave the host, and the processes that can open
 * a file of this user's under /dev/shm could read and change the ranks'
 * memory anyway.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/sg_clock.h"
#include "net/coll_internal.h"

#define SHM_MAGIC  0x314d485347525053ull /* "SPRGSHM1" */
#define SHM_DIR    "/dev/shm/"
#define SHM_PREFIX "sparkgrad-coll-"
#define SHM_NAME   48 /* bytes of a segment's name in the exchange, NUL included */
/* Ring bytes per segment. 1 MiB holds four of the engine's 256 KiB pieces,
 * enough for the sender to keep ahead, and stays within a core's L2 and
 * Docker's default 64 MiB /dev/shm with dozens of ranks. */
#define SHM_CAP ((uint64_t)1 << 20)
/* The longest a waiting rank sleeps before it looks at its sockets (a
 * neighbour's death shows there, as EOF) and at its deadline. */
#define SHM_NAP_SECONDS 0.005

typedef struct ShmSeg {
    uint64_t magic, cap;
    uint8_t nonce[16];
    uint8_t pad0[32];
    uint32_t bell, sleeping; /* offset 64 */
    uint8_t pad1[56];
    uint64_t head; /* offset 128 */
    uint8_t pad2[56];
    uint64_t tail; /* offset 192 */
    uint8_t pad3[56];
} ShmSeg; /* 256 bytes; the ring follows */

#define SEG_BYTES (sizeof(ShmSeg) + SHM_CAP)

struct CollShm {
    ShmSeg *own, *left, *right; /* right == left with two ranks */
};

static uint8_t *ring_of(ShmSeg *s)
{
    return (uint8_t *)s + sizeof(ShmSeg);
}

/* The exchange of the forming: a segment's name and nonce, or ok = 0. */
#define BLOCK_BYTES (SHM_NAME + 16 + 8)

static long futex(uint32_t *word, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, word, op, val, ts, NULL, 0);
}

/* Wakes the owner of s if it sleeps (after its input or room changed). */
static void ring_bell(ShmSeg *s)
{
    __atomic_add_fetch(&s->bell, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&s->sleeping, __ATOMIC_SEQ_CST))
        (void)futex(&s->bell, FUTEX_WAKE, 1, NULL);
}

static void unmap(ShmSeg **s)
{
    if (*s != NULL)
        munmap(*s, SEG_BYTES);
    *s = NULL;
}

void coll_shm_free(CollShm *s)
{
    if (s == NULL)
        return;
    if (s->right == s->left)
        s->right = NULL;
    unmap(&s->own), unmap(&s->left), unmap(&s->right);
    free(s);
}

/* Creates this rank's segment (name in name[SHM_NAME], full path in path);
 * NULL with errno-style reason in why when /dev/shm cannot hold it. */
static ShmSeg *seg_create(char name[SHM_NAME], char *path, size_t path_len, uint8_t nonce[16],
                          char *why, size_t why_len)
{
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, 0) != sizeof r || getrandom(nonce, 16, 0) != 16) {
        snprintf(why, why_len, "getrandom: %s", strerror(errno));
        return NULL;
    }
    snprintf(name, SHM_NAME, SHM_PREFIX "%ld-%016llx", (long)getpid(), (unsigned long long)r);
    snprintf(path, path_len, SHM_DIR "%s", name);
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        snprintf(why, why_len, "creating %s: %s", path, strerror(errno));
        return NULL;
    }
    int rc = posix_fallocate(fd, 0, (off_t)SEG_BYTES);
    void *m = rc == 0 ? mmap(NULL, SEG_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : NULL;
    if (rc != 0 || m == MAP_FAILED) {
        snprintf(why, why_len, "reserving %llu bytes in %s: %s", (unsigned long long)SEG_BYTES,
                 path, strerror(rc != 0 ? rc : errno));
        close(fd);
        unlink(path);
        return NULL;
    }
    close(fd);
    ShmSeg *s = m;
    s->cap = SHM_CAP;
    memcpy(s->nonce, nonce, 16);
    __atomic_store_n(&s->magic, SHM_MAGIC, __ATOMIC_SEQ_CST);
    return s;
}

/* Maps a neighbour's segment from its block, checking that it is the one the
 * neighbour created (a file of this user's, of the size and nonce expected). */
static ShmSeg *seg_open(const uint8_t *block)
{
    char name[SHM_NAME], path[sizeof SHM_DIR + SHM_NAME];
    memcpy(name, block, SHM_NAME);
    name[SHM_NAME - 1] = '\0';
    if (block[SHM_NAME + 16] != 1 || strncmp(name, SHM_PREFIX, strlen(SHM_PREFIX)) != 0 ||
        strchr(name, '/') != NULL)
        return NULL;
    snprintf(path, sizeof path, SHM_DIR "%s", name);
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return NULL;
    struct stat st;
    void *m = MAP_FAILED;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
        (uint64_t)st.st_size == SEG_BYTES)
        m = mmap(NULL, SEG_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return NULL;
    ShmSeg *s = m;
    if (__atomic_load_n(&s->magic, __ATOMIC_SEQ_CST) != SHM_MAGIC || s->cap != SHM_CAP ||
        memcmp(s->nonce, block + SHM_NAME, 16) != 0) {
        munmap(m, SEG_BYTES);
        return NULL;
    }
    return s;
}

int coll_shm_setup(CollComm *c, const char *const *hosts, int allow, double deadline, SgError *err)
{
    int n = c->size;
    if (!allow || n < 2)
        return SG_OK;
    for (int i = 1; i < n; i++)
        if (strcmp(hosts[i], hosts[0]) != 0)
            return SG_OK; /* ranks on several hosts: TCP throughout */
    CollShm *s = calloc(1, sizeof *s);
    uint8_t *blocks = calloc((size_t)n, BLOCK_BYTES);
    if (s == NULL || blocks == NULL) {
        free(s), free(blocks);
        return sg_fail(err, SG_ENOMEM, "forming the ring: allocating its shared-memory links");
    }
    char path[sizeof SHM_DIR + SHM_NAME] = "", why[256] = "";
    uint8_t *mine = blocks + (size_t)c->rank * BLOCK_BYTES;
    s->own = seg_create((char *)mine, path, sizeof path, mine + SHM_NAME, why, sizeof why);
    mine[SHM_NAME + 16] = s->own != NULL;
    int rc = coll_allgather_blocks(c, blocks, BLOCK_BYTES, deadline, "forming the ring",
                                   "shared-memory segment", err);
    if (rc == 0) {
        s->left = seg_open(blocks + (size_t)c->left * BLOCK_BYTES);
        s->right =
            c->right == c->left ? s->left : seg_open(blocks + (size_t)c->right * BLOCK_BYTES);
        memset(blocks, 0, (size_t)n * BLOCK_BYTES);
        mine[0] = s->own != NULL && s->left != NULL && s->right != NULL;
        rc = coll_allgather_blocks(c, blocks, BLOCK_BYTES, deadline, "forming the ring",
                                   "shared-memory check", err);
    }
    if (path[0] != '\0')
        unlink(path); /* every rank has mapped it, or never will */
    int all = rc == 0;
    for (int i = 0; all && i < n; i++)
        all = blocks[(size_t)i * BLOCK_BYTES] == 1;
    free(blocks);
    if (all)
        c->shm = s;
    else
        coll_shm_free(s);
    return rc;
}

/* ---- moving bytes ------------------------------------------------------------------ */

size_t coll_shm_room(const CollComm *c)
{
    ShmSeg *o = c->shm->own;
    uint64_t head = o->head, tail = __atomic_load_n(&o->tail, __ATOMIC_ACQUIRE);
    return (size_t)(o->cap - (head - tail));
}

void coll_shm_put(CollComm *c, const uint8_t *src, size_t len)
{
    ShmSeg *o = c->shm->own;
    uint8_t *ring = ring_of(o);
    uint64_t head = o->head;
    size_t at = (size_t)(head % o->cap), first = o->cap - at < len ? o->cap - at : len;
    memcpy(ring + at, src, first);
    memcpy(ring, src + first, len - first);
    __atomic_store_n(&o->head, head + len, __ATOMIC_SEQ_CST);
    ring_bell(c->shm->right);
}

size_t coll_shm_readable(const CollComm *c, const uint8_t *piece[2], size_t len[2])
{
    ShmSeg *l = c->shm->left;
    uint64_t tail = l->tail, head = __atomic_load_n(&l->head, __ATOMIC_ACQUIRE);
    size_t have = (size_t)(head - tail), at = (size_t)(tail % l->cap);
    len[0] = l->cap - at < have ? l->cap - at : have;
    len[1] = have - len[0];
    piece[0] = ring_of(l) + at;
    piece[1] = ring_of(l);
    return have;
}

void coll_shm_take(CollComm *c, size_t len)
{
    ShmSeg *l = c->shm->left;
    __atomic_store_n(&l->tail, l->tail + len, __ATOMIC_SEQ_CST);
    ring_bell(l);
}

static int ready(const CollComm *c, size_t send, size_t recv)
{
    const uint8_t *p[2];
    size_t n[2];
    return (send > 0 && coll_shm_room(c) >= send) ||
           (recv > 0 && coll_shm_readable(c, p, n) >= recv);
}

int coll_shm_wait(CollComm *c, size_t send, size_t recv, struct pollfd *p, nfds_t np,
                  double deadline)
{
    ShmSeg *o = c->shm->own;
    if (c->spin) {
        double until = sg_now() + COLL_SPIN_SECONDS;
        for (int k = 0;; k++) {
            if (ready(c, send, recv))
                return 1;
            if ((k & 63) == 63 && sg_now() >= until)
                break;
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        }
    }
    for (;;) {
        __atomic_store_n(&o->sleeping, 1, __ATOMIC_SEQ_CST);
        uint32_t seq = __atomic_load_n(&o->bell, __ATOMIC_SEQ_CST);
        if (ready(c, send, recv)) {
            __atomic_store_n(&o->sleeping, 0, __ATOMIC_SEQ_CST);
            return 1;
        }
        double left = deadline - sg_now();
        if (left > SHM_NAP_SECONDS)
            left = SHM_NAP_SECONDS;
        if (left > 0) {
            struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
            (void)futex(&o->bell, FUTEX_WAIT, seq, &ts);
        }
        __atomic_store_n(&o->sleeping, 0, __ATOMIC_SEQ_CST);
        if (ready(c, send, recv))
            return 1;
        int got = poll(p, np, 0);
        if (got < 0 && errno != EINTR)
            return -1;
        if (got > 0)
            return 2;
        if (sg_now() >= deadline)
            return 0;
    }
}
