/*
 * sg_clock.c - the monotonic clock of sg_clock.h and the waits bounded by it.
 */
#include "common/sg_clock.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <time.h>

double sg_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int sg_deadline(double timeout, const char *what, double *deadline, SgError *err)
{
    if (!isfinite(timeout) || timeout < 0)
        return sg_fail(err, SG_EINVAL,
                       "timeout for %s must be a finite number of seconds >= 0, got %g", what,
                       timeout);
    *deadline = sg_now() + timeout;
    return SG_OK;
}

int sg_poll_ms(double deadline)
{
    double left = deadline - sg_now();
    if (left <= 0)
        return 0;
    double ms = ceil(left * 1000.0);
    return ms > (double)INT_MAX ? INT_MAX : (int)ms;
}

void sg_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

int sg_cond_wait(pthread_cond_t *cv, pthread_mutex_t *mu, double deadline)
{
    double left = deadline - sg_now();
    if (left <= 0)
        return ETIMEDOUT;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double whole = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + left;
    ts.tv_sec = (time_t)whole;
    ts.tv_nsec = (long)((whole - (double)ts.tv_sec) * 1e9);
    return pthread_cond_timedwait(cv, mu, &ts);
}
