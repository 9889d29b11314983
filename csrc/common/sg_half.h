/*
 * sg_half.h - the two 16-bit float formats from float32 and back, as the
 * collectives' compression and the parameter server's bf16 wire use them:
 * bfloat16 (round to nearest even; NaN stays a quiet NaN, overflow becomes
 * infinity; back is exact) inlined into the callers' loops, and IEEE half
 * (round to nearest even, subnormals kept, >= 65520 to infinity). Plain C
 * on the bits; no vector code here.
 */
#ifndef SG_HALF_H
#define SG_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint16_t sg_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static inline float sg_bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

uint16_t sg_f32_to_f16(float f);
float sg_f16_to_f32(uint16_t h);

#endif /* SG_HALF_H */
