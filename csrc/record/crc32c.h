/*
 * crc32c.h - CRC32C (Castagnoli, reflected polynomial 0x82F63B78) and the
 * TFRecord mask. The SSE4.2 crc32 instruction is used when the CPU has it
 * (checked once, at run time); otherwise a slicing-by-8 table.
 */
#ifndef SG_CRC32C_H
#define SG_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC32C of p[0..n) continuing from crc (0 for a fresh checksum). */
uint32_t crc32c_extend(uint32_t crc, const uint8_t *p, size_t n);

/* The same computed with the portable table (for tests and odd CPUs). */
uint32_t crc32c_extend_portable(uint32_t crc, const uint8_t *p, size_t n);

/* 1 if crc32c_extend uses the SSE4.2 instruction on this CPU. */
int crc32c_hardware(void);

static inline uint32_t crc32c(const uint8_t *p, size_t n)
{
    return crc32c_extend(0, p, n);
}

/* TFRecord's mask: rotate right by 15 and add a constant. */
static inline uint32_t crc32c_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static inline uint32_t crc32c_unmask(uint32_t masked)
{
    uint32_t rot = masked - 0xa282ead8u;
    return (rot >> 17) | (rot << 15);
}

#endif /* SG_CRC32C_H */
