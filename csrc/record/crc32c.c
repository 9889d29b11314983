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
__attribute__((target("sse4.2"))) static uint32_t crc32c_extend_sse42(uint32_t crc,
                                                                       const uint8_t *p, size_t n)
{
    uint64_t c = (uint32_t)~crc;
    while (n > 0 && ((uintptr_t)p & 7)) {
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
        n--;
    }
    /* One dependent stream: 8 bytes per instruction, several GB/s. */
    while (n >= 32) {
        uint64_t w0, w1, w2, w3;
        memcpy(&w0, p, 8);
        memcpy(&w1, p + 8, 8);
        memcpy(&w2, p + 16, 8);
        memcpy(&w3, p + 24, 8);
        c = __builtin_ia32_crc32di(c, w0);
        c = __builtin_ia32_crc32di(c, w1);
        c = __builtin_ia32_crc32di(c, w2);
        c = __builtin_ia32_crc32di(c, w3);
        p += 32;
        n -= 32;
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
