/*
 * reader.h - the reader thread of a client connection, shared by the
 * control client (control_client.c) and the feeder (feed_client.c).
 *
 * The thread polls the socket and a wake-up pipe, feeds what arrives to a
 * resumable frame parser protected by the connection's session, and hands
 * every whole frame (its tag checked) to the owner's `frame` callback; an
 * optional `tick` runs before every poll for the owner's timers
 * (heartbeats, the silence of the peer) and says when to wake next. The
 * first error (the peer closed, a frame failed its check, a callback's
 * status) is kept in `err` under the owner's mutex, the owner's condition
 * is broadcast and the thread ends. Not here: sending (the owner's, under
 * its own lock).
 */
#ifndef NET_READER_H
#define NET_READER_H

#include <pthread.h>
#include <stdint.h>

#include "common/sg_status.h"
#include "net/frame.h"
#include "net/sock.h"

typedef struct NetReader {
    /* set by the owner before net_reader_start */
    int fd;
    NetSession *session;
    const char *peer; /* "host:port" */
    const char *who;  /* names the peer in errors: "driver", "worker" */
    const char *what; /* names the connection: "control", "feed" */
    uint32_t max_frame;
    pthread_mutex_t *mu; /* the owner's: guards err and the stop flag */
    pthread_cond_t *cv;  /* the owner's: broadcast when err is set */
    void *ctx;
    /* A whole frame; payload (may be NULL) is the callback's to free. */
    int (*frame)(void *ctx, const NetFrameHeader *h, uint8_t *payload, SgError *err);
    /* Before every poll (optional): sets *wake_at (net_now() seconds); without
     * it the thread wakes every second. */
    int (*tick)(void *ctx, double *wake_at, SgError *err);

    /* the reader's */
    SgError err;                   /* code != 0 once the connection broke (under *mu) */
    char label[NET_PEER_MAX + 16]; /* "<who> <peer>": names the peer in session errors */
    int stopping, started, piped;
    int wake[2]; /* valid while piped */
    pthread_t thread;
} NetReader;

/* Starts the thread (r's owner fields set; the rest zeroed). */
int net_reader_start(NetReader *r, SgError *err);

/* Stops and joins the thread, closes its wake-up pipe; idempotent. */
void net_reader_stop(NetReader *r);

#endif /* NET_READER_H */
