/*
 * crc32c.c - CRC32C with a run-time choice between the SSE4.2 instruction
 * and a slicing-by-8 table built once (thread-safe through pthread_once).
 */
#include "record/crc32c.h"

#include <pthread.h>
#include <string.h>

#define CRC32C_POLY 0x82F63B78u

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_build(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
}

uint32_t crc32c_extend_portable(uint32_t crc, const uint8_t *p, size_t n)
{
    pthread_once(&table_once, table_build);
    uint32_t c = ~crc;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8); /* little-endian hosts only (x86-64, aarch64) */
        uint32_t lo = (uint32_t)w ^ c, hi = (uint32_t)(w >> 32);
        c = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^
            table[4][lo >> 24] ^ table[3][hi & 0xff] ^ table[2][(hi >> 8) & 0xff] ^
            table[1][(hi >> 16) & 0xff] ^ table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
    return ~c;
}

#if defined(__x86_64__)
/* Three streams of the crc32 instruction run in parallel over three
 * adjacent blocks, hiding its 3-cycle latency; their results are merged by
 * "shifting" a CRC over a block of zeros, a linear map applied with tables
 * (the technique of Mark Adler's crc32c.c, derived here from GF(2) matrices). */
#define CRC_LONG  4096
#define CRC_SHORT 128

static uint32_t shift_long[4][256], shift_short[4][256];
static pthread_once_t shift_once = PTHREAD_ONCE_INIT;

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;
    while (vec) {
        if (vec & 1)
            sum ^= *mat;
        vec >>= 1;
        mat++;
    }
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat)
{
    for (int n = 0; n < 32; n++)
        square[n] = gf2_times(mat, mat[n]);
}

/* The operator that feeds len zero bytes (a power of two) into the register. */
static void zeros_op(uint32_t *even, size_t len)
{
    uint32_t odd[32], row = 1;
    odd[0] = CRC32C_POLY;
    for (int n = 1; n < 32; n++) {
        odd[n] = row;
        row <<= 1;
    }
    gf2_square(even, odd); /* 2 zero bits */
    gf2_square(odd, even); /* 4 zero bits */
    for (;;) {
        gf2_square(even, odd); /* 8, 32, ... bits */
        len >>= 1;
        if (len == 0)
            return;
        gf2_square(odd, even); /* 16, 64, ... bits */
        len >>= 1;
        if (len == 0)
            break;
    }
    for (int n = 0; n < 32; n++)
        even[n] = odd[n];
}

static void shift_table(uint32_t table_out[4][256], size_t len)
{
    uint32_t op[32];
    zeros_op(op, len);
    for (uint32_t n = 0; n < 256; n++) {
        table_out[0][n] = gf2_times(op, n);
        table_out[1][n] = gf2_times(op, n << 8);
        table_out[2][n] = gf2_times(op, n << 16);
        table_out[3][n] = gf2_times(op, n << 24);
    }
}

static void shift_build(void)
{
    shift_table(shift_long, CRC_LONG);
    shift_table(shift_short, CRC_SHORT);
}

static inline uint32_t crc_shift(uint32_t t[4][256], uint32_t crc)
{
    return t[0][crc & 0xff] ^ t[1][(crc >> 8) & 0xff] ^ t[2][(crc >> 16) & 0xff] ^ t[3][crc >> 24];
}

__attribute__((target("sse4.2"))) static uint64_t
crc_blocks(uint64_t c0, const uint8_t **pp, size_t *np, size_t block, uint32_t t[4][256])
{
    const uint8_t *p = *pp;
    size_t n = *np;
    while (n >= 3 * block) {
        uint64_t c1 = 0, c2 = 0;
        const uint8_t *end = p + block;
        do {
            uint64_t w0, w1, w2;
            memcpy(&w0, p, 8);
            memcpy(&w1, p + block, 8);
            memcpy(&w2, p + 2 * block, 8);
            c0 = __builtin_ia32_crc32di(c0, w0);
            c1 = __builtin_ia32_crc32di(c1, w1);
            c2 = __builtin_ia32_crc32di(c2, w2);
            p += 8;
        } while (p < end);
        c0 = crc_shift(t, (uint32_t)c0) ^ (uint32_t)c1;
        c0 = crc_shift(t, (uint32_t)c0) ^ (uint32_t)c2;
        p += 2 * block;
        n -= 3 * block;
    }
    *pp = p;
    *np = n;
    return c0;
}

__attribute__((target("sse4.2"))) static uint32_t crc32c_extend_sse42(uint32_t crc,
                                                                      const uint8_t *p, size_t n)
{
    uint64_t c = (uint32_t)~crc;
    while (n > 0 && ((uintptr_t)p & 7)) {
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
        n--;
    }
    if (n >= 3 * CRC_SHORT) {
        pthread_once(&shift_once, shift_build);
        c = crc_blocks(c, &p, &n, CRC_LONG, shift_long);
        c = crc_blocks(c, &p, &n, CRC_SHORT, shift_short);
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
        p += 8;
        n -= 8;
    }
    while (n--)
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
#endif

typedef uint32_t (*CrcFn)(uint32_t, const uint8_t *, size_t);

static CrcFn crc_impl;
static pthread_once_t impl_once = PTHREAD_ONCE_INIT;

static void impl_choose(void)
{
    crc_impl = crc32c_extend_portable;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2"))
        crc_impl = crc32c_extend_sse42;
#endif
}

uint32_t crc32c_extend(uint32_t crc, const uint8_t *p, size_t n)
{
    pthread_once(&impl_once, impl_choose);
    return crc_impl(crc, p, n);
}

int crc32c_hardware(void)
{
    pthread_once(&impl_once, impl_choose);
    return crc_impl != crc32c_extend_portable;
}
