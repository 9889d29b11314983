/*
 * tfrecord.c - TFRecord reader and writer over plain, ZLIB and GZIP streams.
 *
 * The reader keeps one window of decoded bytes and hands out records that
 * point into it. Lengths are checked before any allocation: against the
 * bytes left in a plain file or buffer, and for compressed streams the
 * window only grows (doubling) as decoded bytes actually arrive, so a forged
 * length of 2^60 ends as a truncated record, never as a huge malloc.
 *
 * Plain regular files are mapped (mmap) when the kernel allows it: records
 * are then read straight from the page cache, without read()'s copy, and
 * stay valid until the reader closes (tfr_reader_stable). The size is fixed
 * at open, so bounds are checked as for memory; a file truncated by another
 * process while it is being read is the one case this does not survive
 * (SIGBUS), as with any mapped reader. Only files on local disk and memory
 * file systems are mapped: on FUSE (/dbfs), NFS or SMB a failed page-in would
 * also arrive as SIGBUS instead of an error naming the file, so those are
 * read(). read() is also the fallback when mapping fails.
 */
#include "record/tfrecord.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <zlib.h>

#include "record/crc32c.h"
#include "record/inflate.h"

#define TFR_WINDOW    (4u << 20)   /* plain-file read size */
#define TFR_ZIN       (256u << 10) /* compressed input chunk */
#define TFR_WRITE_BUF (1u << 20)   /* writer buffer */
#define TFR_AHEAD     (8u << 10)   /* read-ahead distance of software prefetch */

static uint64_t load_u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint32_t load_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

int tfr_compression_parse(const char *name, TfrCompression *out, SgError *err)
{
    if (name == NULL || name[0] == '\0' || strcasecmp(name, "NONE") == 0)
        *out = TFR_NONE;
    else if (strcasecmp(name, "ZLIB") == 0)
        *out = TFR_ZLIB;
    else if (strcasecmp(name, "GZIP") == 0)
        *out = TFR_GZIP;
    else
        return sg_fail(err, SG_EINVAL, "compression must be None, 'ZLIB' or 'GZIP', not '%s'",
                       name);
    return 0;
}

int tfr_path_resolve(const char *path, char *out, size_t cap, SgError *err)
{
    int n;
    if (strncmp(path, "file://", 7) == 0)
        n = snprintf(out, cap, "%s", path + 7);
    else if (strncmp(path, "dbfs:/", 6) == 0)
        n = snprintf(out, cap, "/dbfs/%s", path + 6 + (path[6] == '/'));
    else
        n = snprintf(out, cap, "%s", path);
    if (n < 0 || (size_t)n >= cap)
        return sg_fail(err, SG_EINVAL, "path is longer than %zu bytes: '%.64s...'", cap - 1, path);
    if (out[0] == '\0')
        return sg_fail(err, SG_EINVAL, "empty path");
    return 0;
}

void tfr_header_encode(uint8_t out[TFR_HEADER_BYTES], uint64_t length)
{
    memcpy(out, &length, 8);
    uint32_t crc = crc32c_mask(crc32c(out, 8));
    memcpy(out + 8, &crc, 4);
}

void tfr_footer_encode(uint8_t out[TFR_FOOTER_BYTES], const uint8_t *data, size_t length)
{
    uint32_t crc = crc32c_mask(crc32c(data, length));
    memcpy(out, &crc, 4);
}

/* Checks a complete header; *length set on success. */
static int header_check(const uint8_t *p, uint64_t offset, int verify_crc, uint64_t *length,
                        SgError *err)
{
    *length = load_u64(p);
    if (verify_crc) {
        uint32_t want = load_u32(p + 8), got = crc32c_mask(crc32c(p, 8));
        if (want != got)
            return sg_fail(err, SG_ECORRUPT,
                           "corrupted record at byte %llu: length CRC mismatch (stored 0x%08x, "
                           "computed 0x%08x over length field %llu)",
                           (unsigned long long)offset, want, got, (unsigned long long)*length);
    }
    if (*length > (uint64_t)SIZE_MAX - TFR_HEADER_BYTES - TFR_FOOTER_BYTES)
        return sg_fail(err, SG_ECORRUPT, "corrupted record at byte %llu: impossible length %llu",
                       (unsigned long long)offset, (unsigned long long)*length);
    return 0;
}

int tfr_check_data_crc(const uint8_t *data, size_t len, uint64_t offset, SgError *err)
{
    uint32_t want = load_u32(data + len), got = crc32c_mask(crc32c(data, len));
    if (want != got)
        return sg_fail(err, SG_ECORRUPT,
                       "corrupted record at byte %llu: data CRC mismatch over %zu bytes (stored "
                       "0x%08x, computed 0x%08x)",
                       (unsigned long long)offset, len, want, got);
    return 0;
}

static int truncated_header(uint64_t offset, size_t have, SgError *err)
{
    return sg_fail(err, SG_ETRUNCATED,
                   "truncated record at byte %llu: stream ends %zu bytes into the %d-byte header",
                   (unsigned long long)offset, have, TFR_HEADER_BYTES);
}

static int truncated_data(uint64_t offset, uint64_t length, uint64_t have, SgError *err)
{
    return sg_fail(err, SG_ETRUNCATED,
                   "truncated record at byte %llu: length field says %llu data bytes (+%d CRC) but "
                   "only %llu bytes follow the header",
                   (unsigned long long)offset, (unsigned long long)length, TFR_FOOTER_BYTES,
                   (unsigned long long)have);
}

int tfr_parse_one(const uint8_t *buf, size_t len, uint64_t offset, int verify_crc,
                  const uint8_t **data, size_t *data_len, size_t *consumed, SgError *err)
{
    if (len == 0)
        return 0;
    if (len < TFR_HEADER_BYTES)
        return truncated_header(offset, len, err);
    uint64_t length;
    int rc = header_check(buf, offset, verify_crc, &length, err);
    if (rc < 0)
        return rc;
    size_t rest = len - TFR_HEADER_BYTES;
    if (rest < TFR_FOOTER_BYTES || length > rest - TFR_FOOTER_BYTES)
        return truncated_data(offset, length, rest, err);
    const uint8_t *d = buf + TFR_HEADER_BYTES;
    if (verify_crc && (rc = tfr_check_data_crc(d, (size_t)length, offset, err)) < 0)
        return rc;
    *data = d;
    *data_len = (size_t)length;
    *consumed = TFR_HEADER_BYTES + (size_t)length + TFR_FOOTER_BYTES;
    return 1;
}

/* ======================================================================
 * Reader
 * ====================================================================== */

struct TfrReader {
    char *name;
    int verify_crc;
    int defer_data_crc; /* the caller checks data CRCs (tfr_check_data_crc) */
    TfrCompression comp;
    int fd;             /* -1 when reading memory */
    const uint8_t *mem; /* memory source (compressed or not) */
    size_t mem_len, mem_pos;
    uint64_t raw_left; /* plain sources: undecoded bytes not yet in the window */
    SgInflate inf;     /* ZLIB / GZIP: the decoder (inflate.h) */
    int z_ready, z_done;
    const uint8_t *in; /* compressed bytes not yet given to the decoder */
    size_t in_len;
    uint8_t *zin;        /* compressed input from fd */
    uint64_t z_consumed; /* compressed bytes consumed so far, for messages */
    uint64_t src_size;   /* a regular file's size at open */
    uint8_t *buf;        /* decoded window; == mem for plain memory, == map when mapped */
    int own_buf;
    void *map; /* plain files: the whole file mapped, or NULL */
    size_t map_len;
    size_t cap, pos, end;
    uint64_t buf_offset; /* stream offset of buf[0] */
    int src_eof;
    int size_known; /* plain source whose length is known up front (memory, regular file) */
    uint64_t last_offset;
};

static int reader_alloc(TfrReader **out, const char *name, TfrCompression comp, int verify_crc,
                        SgError *err)
{
    TfrReader *r = calloc(1, sizeof *r);
    if (r == NULL || (r->name = strdup(name)) == NULL) {
        free(r);
        return sg_fail(err, SG_ENOMEM, "out of memory opening '%s'", name);
    }
    r->fd = -1;
    r->comp = comp;
    r->verify_crc = verify_crc;
    if (comp != TFR_NONE) {
        SgInflateBackend backend;
        int rc = sg_inflate_choose(&backend, err);
        if (rc == 0 && sg_inflate_init(&r->inf, comp == TFR_GZIP, backend) < 0) {
            sg_inflate_end(&r->inf);
            rc = sg_fail(err, SG_ENOMEM, "out of memory starting the %s decoder for '%s'",
                         sg_inflate_backend_name(backend), name);
        }
        if (rc < 0) {
            free(r->name);
            free(r);
            return rc;
        }
        r->z_ready = 1;
    }
    *out = r;
    return 0;
}

/* Local block-device and memory file systems (statfs f_type magic numbers of
 * linux/magic.h), where reading a mapped page can only fail the way read()
 * would not if the file shrinks underneath. */
static int mappable_fs(int fd)
{
    static const unsigned long local[] = {
        0xEF53UL,     /* ext2/3/4 */
        0x58465342UL, /* xfs */
        0x9123683EUL, /* btrfs */
        0x01021994UL, /* tmpfs */
        0x858458F6UL, /* ramfs */
        0x794C7630UL, /* overlayfs (containers) */
        0x2FC12FC1UL, /* zfs */
        0xF2F52010UL, /* f2fs */
    };
    struct statfs fs;
    if (fstatfs(fd, &fs) != 0)
        return 0;
    for (size_t i = 0; i < sizeof local / sizeof local[0]; i++)
        if ((unsigned long)fs.f_type == local[i])
            return 1;
    return 0;
}

int tfr_reader_open(TfrReader **out, const char *path, TfrCompression comp, int verify_crc,
                    SgError *err)
{
    char resolved[TFR_PATH_MAX];
    int rc = tfr_path_resolve(path, resolved, sizeof resolved, err);
    if (rc < 0)
        return rc;
    int fd;
    do
        fd = open(resolved, O_RDONLY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return sg_fail_errno(err, SG_EIO, errno, "cannot open '%s'", resolved);
    struct stat st;
    if (fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
        int e = S_ISDIR(st.st_mode) ? EISDIR : errno;
        close(fd);
        return sg_fail_errno(err, SG_EIO, e, "cannot read '%s'", resolved);
    }
    TfrReader *r = NULL;
    if ((rc = reader_alloc(&r, resolved, comp, verify_crc, err)) < 0) {
        close(fd);
        return rc;
    }
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL); /* a hint: more read-ahead */
    r->fd = fd;
    r->raw_left = r->src_size = (uint64_t)st.st_size;
    r->size_known = S_ISREG(st.st_mode); /* a FIFO or device: only EOF tells the end */
    r->own_buf = 1;
    if (comp == TFR_NONE && S_ISREG(st.st_mode) && st.st_size > 0 &&
        (uint64_t)st.st_size <= (uint64_t)SIZE_MAX && mappable_fs(fd)) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m != MAP_FAILED) {
            r->map = m;
            r->map_len = (size_t)st.st_size;
            r->buf = m;
            r->own_buf = 0;
            r->cap = r->end = r->map_len;
            r->raw_left = 0;
            r->src_eof = 1;
        }
    }
    if (comp != TFR_NONE && !S_ISREG(st.st_mode) && r->inf.backend == SG_INFLATE_ISAL &&
        (rc = tfr_reader_use_inflate(r, SG_INFLATE_ZLIB, err)) < 0) {
        /* A pipe cannot be read again for the hand-over to zlib (see
         * handover_to_zlib), so it is read with zlib throughout. */
        tfr_reader_close(r);
        return rc;
    }
    if (comp != TFR_NONE && (r->zin = malloc(TFR_ZIN)) == NULL) {
        tfr_reader_close(r);
        return sg_fail(err, SG_ENOMEM, "out of memory reading '%s'", resolved);
    }
    *out = r;
    return 0;
}

int tfr_reader_open_memory(TfrReader **out, const uint8_t *buf, size_t len, TfrCompression comp,
                           int verify_crc, const char *name, SgError *err)
{
    TfrReader *r = NULL;
    int rc = reader_alloc(&r, name ? name : "<memory>", comp, verify_crc, err);
    if (rc < 0)
        return rc;
    r->mem = buf;
    r->mem_len = len;
    if (comp == TFR_NONE) {
        r->buf = (uint8_t *)buf; /* never written: plain memory is read in place */
        r->cap = r->end = len;
        r->src_eof = 1;
        r->size_known = 1;
    } else {
        r->own_buf = 1;
    }
    *out = r;
    return 0;
}

static int read_some(int fd, uint8_t *dst, size_t n, size_t *got, const char *name, SgError *err)
{
    ssize_t k;
    do
        k = read(fd, dst, n);
    while (k < 0 && errno == EINTR);
    if (k < 0)
        return sg_fail_errno(err, SG_EIO, errno, "reading '%s'", name);
    *got = (size_t)k;
    return 0;
}

/* Refills r->in from the file or the memory buffer; in_len stays 0 at EOF. */
static int feed_input(TfrReader *r, SgError *err)
{
    if (r->fd >= 0) {
        size_t got = 0;
        int rc = read_some(r->fd, r->zin, TFR_ZIN, &got, r->name, err);
        if (rc < 0)
            return rc;
        r->in = r->zin;
        r->in_len = got;
        r->raw_left = r->raw_left > got ? r->raw_left - got : 0;
    } else if (r->mem_pos < r->mem_len) {
        size_t n = r->mem_len - r->mem_pos;
        if (n > (1u << 30))
            n = 1u << 30;
        r->in = r->mem + r->mem_pos;
        r->in_len = n;
        r->mem_pos += n;
    }
    return 0;
}

static const char *comp_name(const TfrReader *r)
{
    return r->comp == TFR_GZIP ? "GZIP" : "ZLIB";
}

static int truncated_stream(const TfrReader *r, uint64_t decoded, SgError *err)
{
    return sg_fail(err, SG_ETRUNCATED,
                   "truncated %s stream: it ends at compressed byte %llu (decoded byte %llu) "
                   "without its end marker",
                   comp_name(r), (unsigned long long)r->z_consumed, (unsigned long long)decoded);
}

static int corrupt_stream(const TfrReader *r, SgError *err)
{
    return sg_fail(err, SG_ECORRUPT, "corrupt %s data near compressed byte %llu: %s", comp_name(r),
                   (unsigned long long)r->z_consumed, r->inf.msg);
}

/* ISA-L found the stream damaged (or cut short): restart it with zlib from
 * compressed byte 0, discard the bytes already decoded, and go on with zlib,
 * so that the error (its kind, message and offsets) is the one the zlib
 * backend reports. Returns 0 when zlib now continues the stream, 1 when the
 * source cannot be read again (a pipe: ISA-L's own error stands), or a
 * negative status (zlib's) when the replay itself fails. */
static int handover_to_zlib(TfrReader *r, SgError *err)
{
    if (r->fd >= 0 && lseek(r->fd, 0, SEEK_SET) != 0)
        return 1;
    uint64_t skip = r->buf_offset + r->end;
    r->raw_left = r->src_size;
    sg_inflate_end(&r->inf); /* (a z_stream cannot be copied: zlib keeps its address) */
    if (sg_inflate_init(&r->inf, r->comp == TFR_GZIP, SG_INFLATE_ZLIB) < 0) {
        sg_inflate_end(&r->inf);
        r->z_ready = 0;
        return sg_fail(err, SG_ENOMEM, "out of memory restarting the zlib decoder");
    }
    r->mem_pos = 0;
    r->in_len = 0;
    r->z_consumed = 0;
    r->z_done = 0;
    uint8_t scratch[16384];
    while (skip > 0) {
        if (r->in_len == 0) {
            int rc = feed_input(r, err);
            if (rc < 0)
                return rc;
            if (r->in_len == 0) {
                if (!r->z_done && (r->inf.member_in > 0 || r->inf.member_out > 0))
                    return truncated_stream(r, r->buf_offset + r->end - skip, err);
                return 1;
            }
        }
        if (r->z_done) {
            if (sg_inflate_reset(&r->inf) < 0)
                return sg_fail(err, SG_ECORRUPT, "inflateReset failed");
            r->z_done = 0;
        }
        uint8_t *out = scratch;
        size_t room = skip < sizeof scratch ? (size_t)skip : sizeof scratch, room0 = room;
        size_t in0 = r->in_len;
        int zrc = sg_inflate_step(&r->inf, &r->in, &r->in_len, &out, &room);
        r->z_consumed += in0 - r->in_len;
        skip -= room0 - room;
        if (zrc < 0)
            return corrupt_stream(r, err);
        if (zrc == 1)
            r->z_done = 1;
    }
    return 0;
}

/* Every compressed byte of the source is in r->in or already decoded. */
static int input_at_end(const TfrReader *r)
{
    return r->fd >= 0 ? r->size_known && r->raw_left == 0 : r->mem_pos == r->mem_len;
}

/* Decodes more compressed bytes into buf[end..cap). */
static int inflate_some(TfrReader *r, SgError *err)
{
    size_t entry_end = r->end;
    int handed = 0; /* zlib just took over: let it decode what it holds */
    for (;;) {
        if (r->in_len == 0 && !handed) {
            int rc = feed_input(r, err);
            if (rc < 0)
                return rc;
            if (r->in_len == 0) {
                if (r->end > entry_end)
                    return 0; /* ISA-L decoded some of it, then handed over */
                if (!r->z_done && (r->inf.member_in > 0 || r->inf.member_out > 0)) {
                    if (r->inf.backend == SG_INFLATE_ISAL && (rc = handover_to_zlib(r, err)) != 1) {
                        if (rc < 0)
                            return rc;
                        handed = 1;
                        continue;
                    }
                    return truncated_stream(r, r->buf_offset + r->end, err);
                }
                r->src_eof = 1;
                return 0;
            }
        }
        if (r->z_done) {
            if (r->in_len == 0) { /* (only right after a hand-over) */
                handed = 0;
                continue;
            }
            /* More input after a finished stream: another gzip member. */
            if (sg_inflate_reset(&r->inf) < 0)
                return sg_fail(err, SG_ECORRUPT, "inflateReset failed");
            r->z_done = 0;
        }
        handed = 0;
        uint8_t *out = r->buf + r->end;
        size_t room = r->cap - r->end, room0 = room;
        size_t in0 = r->in_len;
        int zrc = sg_inflate_step(&r->inf, &r->in, &r->in_len, &out, &room);
        r->z_consumed += in0 - r->in_len;
        r->end += room0 - room;
        if (zrc == 0 && r->in_len == 0 && r->inf.backend == SG_INFLATE_ISAL && input_at_end(r)) {
            /* The stream is cut short: zlib may have decoded further (or
             * failed on the partial trailer) in this very call, and returns
             * the same output only then, so it goes on from here. */
            zrc = SG_ECORRUPT;
        }
        if (zrc == 1) {
            r->z_done = 1;
        } else if (zrc < 0) {
            int rc;
            if (r->inf.backend == SG_INFLATE_ISAL && (rc = handover_to_zlib(r, err)) != 1) {
                if (rc < 0)
                    return rc;
                handed = 1;
                continue;
            }
            return corrupt_stream(r, err);
        }
        if (room0 != room)
            return 0;
    }
}

/* Makes at least `need` bytes available at buf[pos..end) unless the stream
 * ends first (then src_eof is set). `limit_ok` has been checked by callers
 * for plain sources, so growing to `need` is safe there. */
static int reader_fill(TfrReader *r, size_t need, SgError *err)
{
    while (r->end - r->pos < need && !r->src_eof) {
        if (r->pos > 0) {
            memmove(r->buf, r->buf + r->pos, r->end - r->pos);
            r->buf_offset += r->pos;
            r->end -= r->pos;
            r->pos = 0;
        }
        if (r->end == r->cap) {
            /* Grow straight to `need` only where the length was checked
             * against the source's size; otherwise double as bytes arrive. */
            size_t want = r->comp == TFR_NONE && r->size_known ? need : r->cap * 2;
            if (want < TFR_WINDOW / 4)
                want = TFR_WINDOW / 4;
            if (r->comp == TFR_NONE && want < TFR_WINDOW)
                want = TFR_WINDOW;
            uint8_t *nb = realloc(r->buf, want);
            if (nb == NULL)
                return sg_fail(err, SG_ENOMEM, "out of memory (%zu bytes) reading '%s'", want,
                               r->name);
            r->buf = nb;
            r->cap = want;
        }
        if (r->comp != TFR_NONE) {
            int rc = inflate_some(r, err);
            if (rc < 0)
                return rc;
        } else {
            size_t got = 0;
            int rc = read_some(r->fd, r->buf + r->end, r->cap - r->end, &got, r->name, err);
            if (rc < 0)
                return rc;
            if (got == 0)
                r->src_eof = 1;
            r->end += got;
            r->raw_left = r->raw_left > got ? r->raw_left - got : 0;
        }
    }
    return 0;
}

static int reader_next(TfrReader *r, const uint8_t **data, size_t *len, SgError *err)
{
    int rc = reader_fill(r, TFR_HEADER_BYTES, err);
    if (rc < 0)
        return rc;
    uint64_t offset = r->buf_offset + r->pos;
    size_t have = r->end - r->pos;
    if (have == 0)
        return 0;
    if (have < TFR_HEADER_BYTES)
        return truncated_header(offset, have, err);
    uint64_t length;
    if ((rc = header_check(r->buf + r->pos, offset, r->verify_crc, &length, err)) < 0)
        return rc;
    uint64_t total = TFR_HEADER_BYTES + length + TFR_FOOTER_BYTES;
    if (r->comp == TFR_NONE) {
        /* Plain source: everything left is known, so check before allocating. */
        uint64_t left = have + r->raw_left - TFR_HEADER_BYTES;
        if (r->fd < 0)
            left = have - TFR_HEADER_BYTES;
        if (r->size_known && total - TFR_HEADER_BYTES > left)
            return truncated_data(offset, length, left, err);
    }
    if ((rc = reader_fill(r, (size_t)total, err)) < 0)
        return rc;
    have = r->end - r->pos;
    if (have < total)
        return truncated_data(offset, length, have - TFR_HEADER_BYTES, err);
    const uint8_t *d = r->buf + r->pos + TFR_HEADER_BYTES;
    if (r->verify_crc && !r->defer_data_crc &&
        (rc = tfr_check_data_crc(d, (size_t)length, offset, err)) < 0)
        return rc;
    r->pos += (size_t)total;
    r->last_offset = offset;
    /* Records are read in order, and the hardware prefetcher stops at page
     * boundaries: ask for the bytes TFR_AHEAD further on, as many as this
     * record has, while it is checked and parsed. (With the data CRC
     * deferred, another thread reads the data: it prefetches instead.) */
    if (!r->defer_data_crc && r->end - r->pos > TFR_AHEAD + total)
        for (uint64_t k = 0; k < total; k += 64)
            __builtin_prefetch(r->buf + r->pos + TFR_AHEAD + k);
    *data = d;
    *len = (size_t)length;
    return 1;
}

int tfr_reader_next(TfrReader *r, const uint8_t **data, size_t *len, SgError *err)
{
    int rc = reader_next(r, data, len, err);
    if (rc < 0)
        sg_context(err, "'%s': ", r->name);
    return rc;
}

int tfr_reader_use_inflate(TfrReader *r, int backend, SgError *err)
{
    if (r->comp == TFR_NONE)
        return 0;
    if (r->z_consumed > 0 || r->buf_offset + r->end > 0)
        return sg_fail(err, SG_EINVAL, "'%s': the decoder is chosen before the first read",
                       r->name);
    if (backend == SG_INFLATE_ISAL && !sg_inflate_have_isal())
        return sg_fail(err, SG_EINVAL, "this build of sparkgrad has no ISA-L");
    sg_inflate_end(&r->inf);
    r->z_ready = 0;
    if (sg_inflate_init(&r->inf, r->comp == TFR_GZIP, (SgInflateBackend)backend) < 0) {
        sg_inflate_end(&r->inf);
        return sg_fail(err, SG_ENOMEM, "out of memory starting the decoder for '%s'", r->name);
    }
    r->z_ready = 1;
    return 0;
}

uint64_t tfr_reader_offset(const TfrReader *r)
{
    return r->last_offset;
}

int tfr_reader_stable(const TfrReader *r)
{
    return r->comp == TFR_NONE && (r->map != NULL || (r->fd < 0 && r->mem != NULL));
}

void tfr_reader_defer_data_crc(TfrReader *r, int defer)
{
    r->defer_data_crc = defer;
}

uint64_t tfr_reader_position(const TfrReader *r)
{
    return r->buf_offset + r->pos;
}

const char *tfr_reader_name(const TfrReader *r)
{
    return r->name;
}

void tfr_reader_close(TfrReader *r)
{
    if (r == NULL)
        return;
    if (r->fd >= 0)
        close(r->fd);
    if (r->z_ready)
        sg_inflate_end(&r->inf);
    if (r->own_buf)
        free(r->buf);
    if (r->map)
        munmap(r->map, r->map_len);
    free(r->zin);
    free(r->name);
    free(r);
}

/* ======================================================================
 * Writer
 * ====================================================================== */

struct TfrWriter {
    char *name;
    int fd;
    TfrCompression comp;
    z_stream zs;
    int z_ready;
    uint8_t *buf; /* pending output bytes (already compressed if comp) */
    size_t len, cap;
};

static int write_all(TfrWriter *w, const uint8_t *p, size_t n, SgError *err)
{
    while (n > 0) {
        ssize_t k = write(w->fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return sg_fail_errno(err, SG_EIO, errno, "writing '%s'", w->name);
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int writer_drain(TfrWriter *w, SgError *err)
{
    int rc = write_all(w, w->buf, w->len, err);
    w->len = 0;
    return rc;
}

/* Feeds n bytes to the compressor (or the buffer), draining when full. */
static int writer_put(TfrWriter *w, const uint8_t *p, size_t n, int flush, SgError *err)
{
    if (w->comp == TFR_NONE) {
        if (w->len + n > w->cap) {
            int rc = writer_drain(w, err);
            if (rc < 0)
                return rc;
            if (n >= w->cap)
                return write_all(w, p, n, err);
        }
        memcpy(w->buf + w->len, p, n);
        w->len += n;
        return 0;
    }
    w->zs.next_in = (Bytef *)p;
    w->zs.avail_in = (uInt)n;
    for (;;) {
        if (w->len == w->cap) {
            int rc = writer_drain(w, err);
            if (rc < 0)
                return rc;
        }
        w->zs.next_out = w->buf + w->len;
        w->zs.avail_out = (uInt)(w->cap - w->len);
        uInt before = w->zs.avail_out;
        int zrc = deflate(&w->zs, flush);
        w->len += before - w->zs.avail_out;
        if (zrc == Z_STREAM_ERROR)
            return sg_fail(err, SG_EIO, "deflate failed writing '%s'", w->name);
        if (flush == Z_FINISH) {
            if (zrc == Z_STREAM_END)
                return 0;
        } else if (w->zs.avail_in == 0 && w->zs.avail_out != 0) {
            return 0;
        }
    }
}

int tfr_writer_open(TfrWriter **out, const char *path, TfrCompression comp, SgError *err)
{
    char resolved[TFR_PATH_MAX];
    int rc = tfr_path_resolve(path, resolved, sizeof resolved, err);
    if (rc < 0)
        return rc;
    TfrWriter *w = calloc(1, sizeof *w);
    if (w == NULL || (w->name = strdup(resolved)) == NULL ||
        (w->buf = malloc(TFR_WRITE_BUF)) == NULL) {
        if (w)
            free(w->name);
        free(w);
        return sg_fail(err, SG_ENOMEM, "out of memory opening '%s'", resolved);
    }
    w->cap = TFR_WRITE_BUF;
    w->comp = comp;
    w->fd = -1;
    if (comp != TFR_NONE) {
        int bits = comp == TFR_GZIP ? 15 + 16 : 15;
        if (deflateInit2(&w->zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, bits, 8, Z_DEFAULT_STRATEGY) !=
            Z_OK) {
            tfr_writer_close(w, NULL);
            return sg_fail(err, SG_ENOMEM, "deflateInit2 failed for '%s'", resolved);
        }
        w->z_ready = 1;
    }
    do
        w->fd = open(resolved, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    while (w->fd < 0 && errno == EINTR);
    if (w->fd < 0) {
        int e = errno;
        tfr_writer_close(w, NULL);
        return sg_fail_errno(err, SG_EIO, e, "cannot create '%s'", resolved);
    }
    *out = w;
    return 0;
}

int tfr_writer_write(TfrWriter *w, const uint8_t *data, size_t len, SgError *err)
{
    uint8_t header[TFR_HEADER_BYTES], footer[TFR_FOOTER_BYTES];
    tfr_header_encode(header, len);
    tfr_footer_encode(footer, data, len);
    int rc = writer_put(w, header, sizeof header, Z_NO_FLUSH, err);
    if (rc == 0)
        rc = writer_put(w, data, len, Z_NO_FLUSH, err);
    if (rc == 0)
        rc = writer_put(w, footer, sizeof footer, Z_NO_FLUSH, err);
    return rc;
}

int tfr_writer_flush(TfrWriter *w, SgError *err)
{
    int rc = 0;
    if (w->comp != TFR_NONE)
        rc = writer_put(w, NULL, 0, Z_SYNC_FLUSH, err);
    if (rc == 0)
        rc = writer_drain(w, err);
    return rc;
}

int tfr_writer_close(TfrWriter *w, SgError *err)
{
    if (w == NULL)
        return 0;
    int rc = 0;
    if (w->fd >= 0) {
        if (w->comp != TFR_NONE)
            rc = writer_put(w, NULL, 0, Z_FINISH, err);
        if (rc == 0)
            rc = writer_drain(w, err);
        if (close(w->fd) != 0 && rc == 0)
            rc = sg_fail_errno(err, SG_EIO, errno, "closing '%s'", w->name);
    }
    if (w->z_ready)
        deflateEnd(&w->zs);
    free(w->buf);
    free(w->name);
    free(w);
    return rc;
}
