/*
 * inflate.c - the zlib and ISA-L backends of inflate.h.
 */
#include "record/inflate.h"

#include <stdlib.h>
#include <string.h>

#ifdef HAVE_ISAL
#include <isa-l.h>
#include <isa-l/igzip_lib.h>
#endif

#define STEP_MAX (1u << 30)

int sg_inflate_have_isal(void)
{
#ifdef HAVE_ISAL
    return 1;
#else
    return 0;
#endif
}

const char *sg_inflate_backend_name(SgInflateBackend b)
{
    return b == SG_INFLATE_ISAL ? "isal" : "zlib";
}

const char *sg_inflate_isal_version(void)
{
#ifdef HAVE_ISAL
#define SG_STR2(x) #x
#define SG_STR(x)  SG_STR2(x)
    return SG_STR(ISAL_MAJOR_VERSION) "." SG_STR(ISAL_MINOR_VERSION) "." SG_STR(ISAL_PATCH_VERSION);
#else
    return NULL;
#endif
}

int sg_inflate_choose(SgInflateBackend *out, SgError *err)
{
    const char *env = getenv("SPARKGRAD_INFLATE");
    if (env == NULL || env[0] == '\0') {
        *out = sg_inflate_have_isal() ? SG_INFLATE_ISAL : SG_INFLATE_ZLIB;
        return 0;
    }
    if (strcmp(env, "zlib") == 0) {
        *out = SG_INFLATE_ZLIB;
        return 0;
    }
    if (strcmp(env, "isal") == 0) {
        if (!sg_inflate_have_isal())
            return sg_fail(err, SG_EINVAL,
                           "SPARKGRAD_INFLATE=isal but this build of sparkgrad has no ISA-L "
                           "(it was built without libisal-dev); unset it or use 'zlib'");
        *out = SG_INFLATE_ISAL;
        return 0;
    }
    return sg_fail(err, SG_EINVAL, "SPARKGRAD_INFLATE must be 'zlib' or 'isal', not '%.32s'", env);
}

int sg_inflate_init(SgInflate *z, int gzip, SgInflateBackend backend)
{
    memset(z, 0, sizeof *z);
    z->gzip = gzip;
    z->backend = backend;
#ifdef HAVE_ISAL
    if (backend == SG_INFLATE_ISAL) {
        if ((z->isal = malloc(sizeof *z->isal)) == NULL)
            return SG_ENOMEM;
        isal_inflate_init(z->isal);
        z->isal->crc_flag = gzip ? ISAL_GZIP : ISAL_ZLIB;
        return 0;
    }
#endif
    z->backend = SG_INFLATE_ZLIB;
    /* 15 = zlib header, 15 + 16 = gzip header (TF's window bits). */
    if (inflateInit2(&z->zs, gzip ? 15 + 16 : 15) != Z_OK)
        return SG_ENOMEM;
    z->z_ready = 1;
    return 0;
}

int sg_inflate_reset(SgInflate *z)
{
    z->member_in = z->member_out = 0;
    z->msg = NULL;
#ifdef HAVE_ISAL
    if (z->isal != NULL) {
        isal_inflate_reset(z->isal);
        z->isal->crc_flag = z->gzip ? ISAL_GZIP : ISAL_ZLIB;
        return 0;
    }
#endif
    return inflateReset(&z->zs) == Z_OK ? 0 : SG_ECORRUPT;
}

#ifdef HAVE_ISAL
static const char *isal_message(int rc)
{
    switch (rc) {
    case ISAL_INVALID_BLOCK:
        return "invalid block";
    case ISAL_INVALID_SYMBOL:
        return "invalid code";
    case ISAL_INVALID_LOOKBACK:
        return "invalid distance too far back";
    case ISAL_INVALID_WRAPPER:
        return "incorrect header check";
    case ISAL_UNSUPPORTED_METHOD:
        return "unknown compression method";
    case ISAL_INCORRECT_CHECKSUM:
        return "incorrect data check";
    case ISAL_NEED_DICT:
        return "needs a preset dictionary";
    default:
        return "inflate failed";
    }
}
#endif

#ifdef HAVE_ISAL
/* The start of a member as every writer makes it, which ISA-L and zlib judge
 * alike: gzip without a header CRC or reserved flags; zlib with deflate, a
 * window of at most 32 KiB, no preset dictionary and a valid check. Anything
 * else (or fewer than 4 bytes in view) is left to zlib. */
static int plain_header(const uint8_t *p, size_t n, int gzip)
{
    if (n < 4)
        return 0;
    if (gzip)
        return p[0] == 0x1f && p[1] == 0x8b && p[2] == 8 && (p[3] & ~0x1Du) == 0;
    return (p[0] & 0x0f) == 8 && (p[0] >> 4) <= 7 && (p[1] & 0x20) == 0 &&
           ((unsigned)p[0] * 256u + p[1]) % 31u == 0;
}
#endif

int sg_inflate_step(SgInflate *z, const uint8_t **in, size_t *in_len, uint8_t **out,
                    size_t *out_len)
{
    uint32_t ain = (uint32_t)(*in_len > STEP_MAX ? STEP_MAX : *in_len);
    uint32_t aout = (uint32_t)(*out_len > STEP_MAX ? STEP_MAX : *out_len);
    int rc;
#ifdef HAVE_ISAL
    if (z->isal != NULL) {
        struct inflate_state *s = z->isal;
        if (z->member_in == 0 && !plain_header(*in, *in_len, z->gzip)) {
            z->msg = "header ISA-L does not check as zlib does";
            return SG_ECORRUPT;
        }
        s->next_in = (uint8_t *)*in;
        s->avail_in = ain;
        s->next_out = *out;
        s->avail_out = aout;
        /* Go as far as the buffers allow, as zlib's inflate does (ISA-L may
         * return after a stored block with both input and room left). */
        int irc;
        for (;;) {
            uint32_t in0 = s->avail_in, out0 = s->avail_out;
            irc = isal_inflate(s);
            if (irc != ISAL_DECOMP_OK || s->block_state == ISAL_BLOCK_FINISH || s->avail_in == 0 ||
                s->avail_out == 0 || (s->avail_in == in0 && s->avail_out == out0))
                break;
        }
        size_t used = ain - s->avail_in, made = aout - s->avail_out;
        *in += used;
        *in_len -= used;
        *out += made;
        *out_len -= made;
        z->member_in += used;
        z->member_out += made;
        if (irc < 0 || irc == ISAL_NEED_DICT) {
            z->msg = isal_message(irc);
            return SG_ECORRUPT;
        }
        if (s->block_state != ISAL_BLOCK_FINISH)
            return 0;
        /* After a zlib trailer ISA-L may hold the next bytes in its bit
         * buffer: give them back (from this call's input), as they start
         * whatever follows. */
        size_t ahead = (size_t)(s->read_in_length > 0 ? s->read_in_length / 8 : 0);
        if (ahead > used) {
            z->msg = "ISA-L read past the end of the stream";
            return SG_ECORRUPT;
        }
        *in -= ahead;
        *in_len += ahead;
        z->member_in -= ahead;
        s->read_in = 0;
        s->read_in_length = 0;
        return 1;
    }
#endif
    z->zs.next_in = (Bytef *)*in;
    z->zs.avail_in = ain;
    z->zs.next_out = *out;
    z->zs.avail_out = aout;
    rc = inflate(&z->zs, Z_NO_FLUSH);
    size_t used = ain - z->zs.avail_in, made = aout - z->zs.avail_out;
    *in += used;
    *in_len -= used;
    *out += made;
    *out_len -= made;
    z->member_in += used;
    z->member_out += made;
    if (rc == Z_STREAM_END)
        return 1;
    if (rc == Z_OK || rc == Z_BUF_ERROR)
        return 0;
    z->msg = z->zs.msg ? z->zs.msg : "inflate failed";
    return SG_ECORRUPT;
}

void sg_inflate_end(SgInflate *z)
{
    if (z->z_ready)
        inflateEnd(&z->zs);
    z->z_ready = 0;
    free(z->isal);
    z->isal = NULL;
}
