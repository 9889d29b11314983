/*
 * sg_clock.h - the monotonic clock of the C core, for deadlines and elapsed
 * times (the transport's waits in net/, the REST client's retries in rest/).
 * Not wall-clock time: it never jumps, and means nothing across processes.
 */
#ifndef SG_CLOCK_H
#define SG_CLOCK_H

/* Seconds on CLOCK_MONOTONIC. */
double sg_now(void);

#endif /* SG_CLOCK_H */
