/*
 * inflate.h - one DEFLATE decoder interface over two backends: zlib's
 * inflate and ISA-L's igzip (isal_inflate), the latter only when the build
 * found <isa-l/igzip_lib.h> (HAVE_ISAL). Both parse the gzip or zlib wrapper
 * and verify its trailer (CRC32 and length for gzip, Adler-32 for zlib).
 *
 * The reader (tfrecord.c) decodes with ISA-L when it can and hands a stream
 * over to zlib at the first sign of trouble, so that what damaged input
 * reports is zlib's account of it whichever backend was chosen.
 */
#ifndef SG_INFLATE_H
#define SG_INFLATE_H

#include <stddef.h>
#include <stdint.h>
#include <zlib.h>

#include "common/sg_status.h"

typedef enum SgInflateBackend {
    SG_INFLATE_ZLIB = 1,
    SG_INFLATE_ISAL = 2,
} SgInflateBackend;

/* The backend a new reader uses: SPARKGRAD_INFLATE ("zlib" or "isal", read
 * at each call) when set and non-empty, else ISA-L when built in, else zlib.
 * SG_EINVAL for another value, or "isal" in a build without ISA-L. */
int sg_inflate_choose(SgInflateBackend *out, SgError *err);

/* 1 when this build has the ISA-L backend. */
int sg_inflate_have_isal(void);
const char *sg_inflate_backend_name(SgInflateBackend b);
/* ISA-L's version ("2.30.0"), or NULL without ISA-L. */
const char *sg_inflate_isal_version(void);

typedef struct SgInflate {
    SgInflateBackend backend;
    int gzip;
    z_stream zs;
    int z_ready;
    struct inflate_state *isal; /* HAVE_ISAL and backend == SG_INFLATE_ISAL */
    uint64_t member_in;         /* compressed bytes consumed since init / reset */
    uint64_t member_out;        /* decoded bytes since init / reset */
    const char *msg;            /* after an error: what the backend said */
} SgInflate;

/* gzip != 0: a gzip wrapper, else a zlib one. 0 or SG_ENOMEM. */
int sg_inflate_init(SgInflate *z, int gzip, SgInflateBackend backend);
/* Starts the next member (after sg_inflate_step returned 1). */
int sg_inflate_reset(SgInflate *z);
/* Decodes from (*in, *in_len) into (*out, *out_len), advancing both (each at
 * most 2^30 bytes per call). Returns 1 at the end of a member (trailer
 * checked), 0 when it needs more input or more output room, SG_ECORRUPT on
 * invalid data (z->msg says what). */
int sg_inflate_step(SgInflate *z, const uint8_t **in, size_t *in_len, uint8_t **out,
                    size_t *out_len);
void sg_inflate_end(SgInflate *z);

#endif /* SG_INFLATE_H */
