/*
 * sg_clock.h - the monotonic clock of the C core, for deadlines and elapsed
 * times (the transport's waits in net/, the record reader's in record/, the
 * REST client's retries in rest/), and the waits bounded by it. Not
 * wall-clock time: it never jumps, and means nothing across processes.
 */
#ifndef SG_CLOCK_H
#define SG_CLOCK_H

#include <pthread.h>

#include "common/sg_status.h"

/* Seconds on CLOCK_MONOTONIC. */
double sg_now(void);

/* Converts a relative timeout (seconds, finite, >= 0) into a deadline;
 * fails with SG_EINVAL naming what the timeout was for. */
int sg_deadline(double timeout, const char *what, double *deadline, SgError *err);

/* Milliseconds from now until deadline for poll(): 0 if passed, rounded up. */
int sg_poll_ms(double deadline);

/* pthread_cond_init on CLOCK_MONOTONIC, so that waits take sg_now() deadlines. */
void sg_cond_init(pthread_cond_t *cv);

/* Waits on cv (mu held; cv from sg_cond_init) until woken or the deadline:
 * ETIMEDOUT, without waiting, once it has passed. */
int sg_cond_wait(pthread_cond_t *cv, pthread_mutex_t *mu, double deadline);

#endif /* SG_CLOCK_H */
