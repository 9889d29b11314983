/*
 * inflate_breakdown.c - where the CPU time of reading a GZIP TFRecord file
 * goes, for each inflate backend: the inflater alone, and the reader
 * (tfrecord.c) over the same file with and without its CRC checks, beside
 * the reader over the plain copy. `make bench-inflate` builds it and runs it
 * on bench_records.py's files (Fashion-MNIST train and its GZIP copy).
 *
 *   inflate_breakdown PLAIN.tfrecords GZIP.tfrecords [ROUNDS]
 *
 * Every figure is MB of the decoded stream per CPU-second of this thread
 * (CLOCK_THREAD_CPUTIME_ID, so that another process on the core does not
 * count), the passes interleaved round by round, the median of the rounds
 * kept. "inflate" decodes the whole compressed file from memory into a
 * 1 MiB buffer, reused (the reader's window size); "reader" is
 * tfr_reader_next over the file, as TFRecordDataset does before parsing.
 * The parse, batch and Python costs that bench_records.py adds are the
 * same for both backends (compare its plain row).
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

#include "record/inflate.h"
#include "record/tfrecord.h"

#define OUT_CHUNK  (1u << 20)
#define MAX_ROUNDS 50

enum { RAW_ZLIB, RAW_ISAL, RD_PLAIN, RD_ZLIB, RD_ISAL, RD_ZLIB_NOCRC, RD_ISAL_NOCRC, NPASS };

static const char *pass_name[NPASS] = {
    "inflate alone, zlib", "inflate alone, isal",       "reader, plain file",        "reader, zlib",
    "reader, isal",        "reader without CRCs, zlib", "reader without CRCs, isal",
};

static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int load_file(const char *path, uint8_t **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return -1;
    size_t cap = 1u << 20, n = 0;
    uint8_t *b = malloc(cap);
    while (b != NULL) {
        size_t k = fread(b + n, 1, cap - n, f);
        n += k;
        if (k == 0)
            break;
        if (n == cap) {
            uint8_t *nb = realloc(b, cap * 2);
            if (nb == NULL) {
                free(b);
                b = NULL;
                break;
            }
            b = nb;
            cap *= 2;
        }
    }
    fclose(f);
    *out = b;
    *len = n;
    return b == NULL ? -1 : 0;
}

/* Decodes every member of (in, n) with `backend` into one reused buffer;
 * the decoded size, or 0 on an error. */
static size_t inflate_alone(const uint8_t *in, size_t n, int gzip, SgInflateBackend backend,
                            uint8_t *buf)
{
    SgInflate z;
    if (sg_inflate_init(&z, gzip, backend) < 0) {
        sg_inflate_end(&z);
        return 0;
    }
    size_t total = 0;
    int done = 0;
    while (n > 0) {
        if (done) {
            if (sg_inflate_reset(&z) < 0)
                break;
            done = 0;
        }
        uint8_t *out = buf;
        size_t room = OUT_CHUNK;
        int rc = sg_inflate_step(&z, &in, &n, &out, &room);
        total += OUT_CHUNK - room;
        if (rc < 0) {
            total = 0;
            break;
        }
        done = rc == 1;
    }
    sg_inflate_end(&z);
    return done ? total : 0;
}

/* tfr_reader_next over the file; the stream bytes read, or 0 on an error. */
static size_t read_all(const char *path, TfrCompression comp, int backend, int verify_crc)
{
    SgError err = {0};
    TfrReader *r = NULL;
    if (tfr_reader_open(&r, path, comp, verify_crc, &err) < 0 ||
        (comp != TFR_NONE && tfr_reader_use_inflate(r, backend, &err) < 0)) {
        fprintf(stderr, "inflate_breakdown: %s\n", err.msg);
        tfr_reader_close(r);
        return 0;
    }
    const uint8_t *d;
    size_t len, total = 0;
    int rc;
    while ((rc = tfr_reader_next(r, &d, &len, &err)) == 1)
        total += TFR_HEADER_BYTES + len + TFR_FOOTER_BYTES;
    if (rc < 0)
        fprintf(stderr, "inflate_breakdown: %s\n", err.msg);
    tfr_reader_close(r);
    return rc < 0 ? 0 : total;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s PLAIN.tfrecords GZIP.tfrecords [ROUNDS]\n", argv[0]);
        return 2;
    }
    int rounds = argc > 3 ? atoi(argv[3]) : 5;
    if (rounds < 1 || rounds > MAX_ROUNDS)
        rounds = 5;
    if (!sg_inflate_have_isal()) {
        fprintf(stderr, "inflate_breakdown: this build has no ISA-L\n");
        return 2;
    }
    cpu_set_t allowed, one;
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0) {
        CPU_ZERO(&one);
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &allowed)) {
                CPU_SET(c, &one);
                break;
            }
        (void)sched_setaffinity(0, sizeof one, &one); /* one core, as bench_records.py */
    }
    uint8_t *gz = NULL, *buf = malloc(OUT_CHUNK);
    size_t gz_len = 0;
    if (buf == NULL || load_file(argv[2], &gz, &gz_len) < 0) {
        fprintf(stderr, "inflate_breakdown: cannot read '%s'\n", argv[2]);
        return 1;
    }
    memset(buf, 0, OUT_CHUNK);
    static double mbs[NPASS][MAX_ROUNDS];
    printf("MB/cpu-s per round (%s, ISA-L %s, zlib %s):\n", argv[2], sg_inflate_isal_version(),
           zlibVersion());
    for (int i = 0; i < rounds; i++) {
        printf("round %d:", i + 1);
        for (int p = 0; p < NPASS; p++) {
            double t = cpu_now();
            size_t bytes;
            switch (p) {
            case RAW_ZLIB:
            case RAW_ISAL:
                bytes = inflate_alone(gz, gz_len, 1,
                                      p == RAW_ISAL ? SG_INFLATE_ISAL : SG_INFLATE_ZLIB, buf);
                break;
            case RD_PLAIN:
                bytes = read_all(argv[1], TFR_NONE, 0, 1);
                break;
            default:
                bytes =
                    read_all(argv[2], TFR_GZIP,
                             p == RD_ISAL || p == RD_ISAL_NOCRC ? SG_INFLATE_ISAL : SG_INFLATE_ZLIB,
                             p == RD_ZLIB || p == RD_ISAL);
            }
            t = cpu_now() - t;
            if (bytes == 0) {
                fprintf(stderr, "\ninflate_breakdown: %s failed\n", pass_name[p]);
                return 1;
            }
            mbs[p][i] = (double)bytes / t / 1e6;
            printf(" %.0f", mbs[p][i]);
        }
        printf("  isal/zlib: inflate %.2f reader %.2f\n", mbs[RAW_ISAL][i] / mbs[RAW_ZLIB][i],
               mbs[RD_ISAL][i] / mbs[RD_ZLIB][i]);
    }
    double med[NPASS];
    printf("\nmedian of %d rounds          MB/cpu-s   ms/MB\n", rounds);
    for (int p = 0; p < NPASS; p++) {
        med[p] = median(mbs[p], rounds);
        printf("%-28s %8.0f %7.3f\n", pass_name[p], med[p], 1e3 / med[p]);
    }
    printf("\nms per decoded MB        zlib   isal\n");
    printf("inflate                 %5.3f  %5.3f\n", 1e3 / med[RAW_ZLIB], 1e3 / med[RAW_ISAL]);
    printf("rest of the reader      %5.3f  %5.3f  (read, framing, CRC32C)\n",
           1e3 / med[RD_ZLIB] - 1e3 / med[RAW_ZLIB], 1e3 / med[RD_ISAL] - 1e3 / med[RAW_ISAL]);
    printf("  of which CRC32C       %5.3f  %5.3f\n", 1e3 / med[RD_ZLIB] - 1e3 / med[RD_ZLIB_NOCRC],
           1e3 / med[RD_ISAL] - 1e3 / med[RD_ISAL_NOCRC]);
    printf("(the plain file's reader, %.3f ms/MB, is framing and CRC32C alone)\n",
           1e3 / med[RD_PLAIN]);
    double ri[MAX_ROUNDS], rr[MAX_ROUNDS];
    for (int i = 0; i < rounds; i++) {
        ri[i] = mbs[RAW_ISAL][i] / mbs[RAW_ZLIB][i];
        rr[i] = mbs[RD_ISAL][i] / mbs[RD_ZLIB][i];
    }
    printf("isal/zlib, median of the rounds' ratios: inflate alone %.2fx, reader %.2fx\n",
           median(ri, rounds), median(rr, rounds));
    free(gz);
    free(buf);
    return 0;
}
