/*
 * sg_rng.h - splitmix64, the small seedable generator shuffles use. Not for
 * anything that needs unpredictability.
 */
#ifndef SG_RNG_H
#define SG_RNG_H

#include <stddef.h>
#include <stdint.h>

static inline uint64_t sg_rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform enough in [0, n) for n far below 2^64; n > 0. */
static inline size_t sg_rng_below(uint64_t *state, size_t n)
{
    return (size_t)(sg_rng_next(state) % n);
}

#endif /* SG_RNG_H */
