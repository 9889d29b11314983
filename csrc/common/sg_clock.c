/*
 * sg_clock.c - the monotonic clock of sg_clock.h.
 */
#include "common/sg_clock.h"

#include <time.h>

double sg_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
