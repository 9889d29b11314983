/*
 * sg_half.c - IEEE half precision of sg_half.h.
 */
#include "common/sg_half.h"

#include <math.h>

uint16_t sg_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: keep it quiet and non-zero */
        return (uint16_t)(sign | 0x7e00u);
    if (ax >= 0x477ff000u) /* >= 65520 rounds to infinity (and infinity itself) */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: a half subnormal (or zero) */
        float a;
        memcpy(&a, &ax, sizeof a);
        /* a * 2^24 is exact; nearbyintf rounds to nearest even. 1024 is the
         * smallest normal's encoding, which is right. */
        return (uint16_t)(sign | (uint16_t)nearbyintf(a * 16777216.0f));
    }
    /* Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits
     * to nearest even; a carry moves into the exponent as it should. */
    ax += 0xfffu + ((ax >> 13) & 1u);
    return (uint16_t)(sign | ((ax - 0x38000000u) >> 13));
}

float sg_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, x;
    if (exp == 0) {
        float v = (float)mant * (1.0f / 16777216.0f); /* mant * 2^-24, exact */
        memcpy(&x, &v, sizeof x);
        x |= sign;
    } else if (exp == 31) {
        x = sign | 0x7f800000u | (mant << 13);
    } else {
        x = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}
