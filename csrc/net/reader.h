/*
 * reader.h - a client connection (the control client, the feeder): its
 * socket, session and locks (NetClient), and its reader thread, which feeds
 * what arrives to a frame parser under the connection's session and hands
 * each whole frame to the owner's `frame` callback (which may queue it for
 * the owner's callers); an optional `tick` runs the owner's timers before
 * every poll. The first error is kept in `err`, under the owner's mutex,
 * and ends the thread.
 */
#ifndef NET_READER_H
#define NET_READER_H

#include <pthread.h>
#include <stdint.h>

#include "common/sg_status.h"
#include "net/frame.h"
#include "net/sock.h"

typedef struct NetMsg {
    uint16_t op;      /* the frame's flags */
    uint8_t *payload; /* NUL-terminated */
    uint32_t len;
    struct NetMsg *next;
} NetMsg;

/* A FIFO of messages (a reader's frames, the rendezvous' events). push takes
 * the payload (freed on failure: SG_ENOMEM); take removes the first message
 * of op (any op when op < 0), NULL when there is none; free drops them all. */
typedef struct NetMsgQueue {
    NetMsg *head, *tail;
    size_t len;
} NetMsgQueue;
int net_msgq_push(NetMsgQueue *q, uint16_t op, uint8_t *payload, uint32_t len);
NetMsg *net_msgq_take(NetMsgQueue *q, int op);
void net_msgq_free(NetMsgQueue *q);

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
    /* Before every poll (optional): sets *wake_at (sg_now() seconds); without
     * it the thread wakes every second. */
    int (*tick)(void *ctx, double *wake_at, SgError *err);

    /* the reader's */
    SgError err;                   /* code != 0 once the connection broke (under *mu) */
    NetMsgQueue q;                 /* frames the owner queued (under *mu) */
    char label[NET_PEER_MAX + 16]; /* "<who> <peer>": names the peer in session errors */
    int stopping, started;
    int wake[2]; /* while started */
    pthread_t thread;
} NetReader;

/* Starts the thread (r's owner fields set; the rest zeroed). */
int net_reader_start(NetReader *r, SgError *err);

/* A client connection and its reader. Senders hold send_mu (the session's
 * send half); the reader owns the receive half; mu and cv are the reader's
 * and the owner's state's. */
typedef struct NetClient {
    int fd;
    NetSession session; /* keyed by the handshake */
    char peer[NET_PEER_MAX];
    pthread_mutex_t mu, send_mu;
    pthread_cond_t cv;
    NetReader rd;
} NetClient;

/* Sets c up, connects to host:port and authenticates before deadline
 * (`context` prefixes errors of the connect, "feed: "), and readies c->rd
 * from `reader` (the owner's callbacks and names) for net_reader_start.
 * Whatever it returns, net_client_free(c) undoes it. */
int net_client_open(NetClient *c, const char *host, int port, const uint8_t *secret,
                    size_t secret_len, NetSecurity mode, double deadline, const char *context,
                    const NetReader *reader, SgError *err);
/* One frame to the peer, under send_mu; SG_ESTATE once closed. */
int net_client_send(NetClient *c, uint8_t type, uint16_t flags, const void *buf, size_t len,
                    double deadline, SgError *err);
/* Stops and joins the reader, then closes the socket and wipes the session
 * (idempotent). */
void net_client_close(NetClient *c);
/* Closes, drops the queue and destroys the locks. */
void net_client_free(NetClient *c);

#endif /* NET_READER_H */
