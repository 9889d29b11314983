/*
 * rendezvous_server.c - the driver's rendezvous server (rendezvous.h): one
 * background thread, one poll() loop over the listener, a wake-up pipe and
 * every node connection; non-blocking reads into a resumable frame parser
 * per connection; writes queued per connection and flushed on POLLOUT.
 *
 * Locking: s->mu guards everything below the thread handle; the loop holds it
 * except while in poll(). API calls queue bytes and wake the loop.
 * Not here: what the node side does (control_client.c).
 */
#include "net/rendezvous.h"

#include <errno.h>
#include <stdarg.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "net/auth.h"
#include "net/frame.h"
#include "net/json_msg.h"
#include "net/rendezvous_internal.h"
#include "net/sock.h"

#define RDV_CLOSE_LINGER 2.0   /* seconds to flush a reject before closing */
#define RDV_MAX_EVENTS   65536 /* queued events before log/metric are dropped */
#define RDV_ACCEPT_BATCH 64
#define RDV_DRIVER_BEAT  1.0 /* seconds between the driver's heartbeats to nodes */

/* ---- connections -------------------------------------------------------- */

/* Counts a rejected peer (counter may be NULL) and keeps the reason. */
static void note(RdvServer *s, long *counter, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void note(RdvServer *s, long *counter, const char *fmt, ...)
{
    if (counter != NULL)
        (*counter)++;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->stats.last_rejection, sizeof s->stats.last_rejection, fmt, ap);
    va_end(ap);
}

/* Queues one frame, protected by s (NULL: plain, for the handshake) if its mode says so:
 * header | seq | payload | tag, sealed straight into the output buffer. */
static int conn_queue_frame(RdvConn *c, NetSession *s, uint8_t type, uint16_t flags,
                            const void *payload, size_t len)
{
    int on = net_session_on(s);
    size_t extra = on ? NET_FRAME_SEC_OVERHEAD : 0;
    size_t need = c->out_len + NET_FRAME_HEADER_SIZE + extra + len;
    if (need > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 4096;
        while (cap < need)
            cap *= 2;
        uint8_t *p = realloc(c->out, cap);
        if (p == NULL)
            return SG_ENOMEM;
        c->out = p;
        c->out_cap = cap;
    }
    uint8_t *hdr = c->out + c->out_len;
    net_frame_header_encode(hdr, type, flags, (uint32_t)len);
    if (!on) {
        if (len > 0)
            memcpy(hdr + NET_FRAME_HEADER_SIZE, payload, len);
        c->out_len = need;
        return SG_OK;
    }
    SgError err;
    uint8_t *body = hdr + NET_FRAME_HEADER_SIZE + NET_SESSION_SEQ;
    if (net_session_seal_begin(s, hdr, NET_FRAME_HEADER_SIZE, hdr + NET_FRAME_HEADER_SIZE, &err) <
            0 ||
        net_session_seal_update(s, payload, body, len, &err) < 0 ||
        net_session_seal_end(s, body + len, &err) < 0)
        return SG_EIO; /* OpenSSL failed: the connection cannot go on */
    c->out_len = need;
    return SG_OK;
}

static int conn_queue(RdvConn *c, uint8_t type, const void *payload, size_t len)
{
    return conn_queue_frame(c, &c->session, type, 0, payload, len);
}

int rdv_conn_queue_text(RdvConn *c, const char *json)
{
    return conn_queue(c, NET_FRAME_JSON, json, strlen(json));
}

int rdv_conn_queue_json(RdvConn *c, const cJSON *msg)
{
    char *text = net_json_print(msg);
    if (text == NULL)
        return SG_ENOMEM;
    int rc = rdv_conn_queue_text(c, text);
    free(text);
    return rc;
}

/* Sends {"type":"reject","reason":...} and closes once flushed. */
static void conn_reject(RdvServer *s, RdvConn *c, const char *reason)
{
    note(s, NULL, "%s", reason);
    cJSON *msg = cJSON_CreateObject();
    if (msg != NULL && cJSON_AddStringToObject(msg, "type", "reject") != NULL &&
        cJSON_AddStringToObject(msg, "reason", reason) != NULL)
        rdv_conn_queue_json(c, msg);
    cJSON_Delete(msg);
    c->state = CONN_CLOSING;
    c->deadline = sg_now() + RDV_CLOSE_LINGER;
}

/* Drops a connection: a registered node that had not finished is lost. */
void rdv_conn_drop(RdvServer *s, RdvConn *c, const char *reason)
{
    if (c->dead)
        return;
    c->dead = 1;
    if (c->executor_id >= 0)
        rdv_node_disconnected(s, c, reason);
}

static void conn_flush(RdvServer *s, RdvConn *c)
{
    SgError err;
    while (c->out_off < c->out_len && !c->dead) {
        long n = net_write_some(c->fd, c->out + c->out_off, c->out_len - c->out_off, c->peer, &err);
        if (n < 0) {
            rdv_conn_drop(s, c, err.msg);
            return;
        } else if (n == 0) {
            return; /* kernel buffer full: wait for POLLOUT */
        } else {
            c->out_off += (size_t)n;
        }
    }
    c->out_off = c->out_len = 0;
    if (c->state == CONN_CLOSING)
        c->dead = 1;
}

static void conn_free(RdvServer *s, RdvConn *c)
{
    if (c->gated)
        net_gate_release(&s->gate, c->peer);
    net_close(&c->fd);
    net_frame_parser_free(&c->parser);
    net_session_free(&c->session);
    free(c->out);
    free(c);
}

static void accept_new(RdvServer *s)
{
    for (int i = 0; i < RDV_ACCEPT_BATCH; i++) {
        SgError err;
        int fd = -1;
        char peer[NET_PEER_MAX];
        int rc = net_gate_accept(&s->gate, s->lfd, &fd, peer, sizeof peer);
        if (rc == 2)
            continue; /* over a cap: closed unanswered */
        if (rc == 0)
            return; /* none pending, or backing off after an accept error */
        RdvConn **grown =
            s->nconns == s->capconns
                ? realloc(s->conns, (s->capconns ? 2 * s->capconns : 16) * sizeof *grown)
                : s->conns;
        RdvConn *c = grown != NULL ? calloc(1, sizeof *c) : NULL;
        if (grown != NULL && s->nconns == s->capconns) {
            s->conns = grown;
            s->capconns = s->capconns ? 2 * s->capconns : 16;
        }
        if (c == NULL || net_auth_random(c->challenge, sizeof c->challenge, &err) < 0) {
            free(c);
            close(fd);
            net_gate_release(&s->gate, peer);
            continue;
        }
        c->gated = 1;
        c->fd = fd;
        snprintf(c->peer, sizeof c->peer, "%s", peer);
        c->state = CONN_AUTH;
        c->executor_id = -1;
        c->deadline = sg_now() + s->auth_timeout;
        net_frame_parser_init(&c->parser, NET_FRAME_MAX_UNAUTH);
        s->conns[s->nconns++] = c;
        s->stats.accepted++;
        /* The challenge's flags announce the server's security mode (auth.h). */
        if (conn_queue_frame(c, NULL, NET_FRAME_AUTH_CHALLENGE, (uint16_t)s->mode, c->challenge,
                             sizeof c->challenge) < 0)
            c->dead = 1;
        else
            conn_flush(s, c);
    }
}

/* ---- frames ----------------------------------------------------------- */

static void handle_auth(RdvServer *s, RdvConn *c, const NetFrameHeader *h, const uint8_t *payload)
{
    SgError err;
    uint8_t ok[NET_AUTH_MAC];
    int rc = h->type != NET_FRAME_AUTH_RESPONSE
                 ? sg_fail(&err, SG_EAUTH, "client %s sent a %s frame before authenticating",
                           c->peer, net_frame_type_name(h->type))
                 : net_auth_server_check(s->secret, s->secret_len, s->mode, c->challenge, h->flags,
                                         payload, h->length, ok, c->peer, &c->session, &err);
    if (rc < 0) { /* nothing but the close goes to a peer that did not authenticate */
        note(s, &s->stats.auth_failures, "%s", err.msg);
        c->dead = 1;
        return;
    }
    /* AUTH_OK is the last plain frame; every frame after it, both ways, goes through the
     * connection's session. */
    if (conn_queue_frame(c, NULL, NET_FRAME_AUTH_OK, 0, ok, sizeof ok) < 0) {
        c->dead = 1;
        return;
    }
    c->state = CONN_READY;
    net_gate_authenticated(&s->gate, c->peer);
    c->gated = 0;
    c->last_seen = sg_now();
    net_frame_parser_protect(&c->parser, &c->session, s->max_frame, c->peer);
}

static void handle_frame(RdvServer *s, RdvConn *c, const NetFrameHeader *h, const uint8_t *payload)
{
    if (c->state == CONN_AUTH) {
        handle_auth(s, c, h, payload);
        return;
    }
    if (c->state != CONN_READY)
        return; /* closing: ignore whatever else arrives */
    c->last_seen = sg_now();
    if (h->type == NET_FRAME_HEARTBEAT)
        return;
    SgError err;
    int rc;
    if (h->type != NET_FRAME_JSON) {
        rc = sg_fail(&err, SG_EPROTO, "%s sent a %s frame on the control connection", c->peer,
                     net_frame_type_name(h->type));
    } else {
        cJSON *msg = NULL;
        const char *type = NULL;
        rc = net_json_parse(payload, h->length, c->peer, &msg, &type, &err);
        if (rc == 0)
            rc = rdv_handle_message(s, c, msg, type, &err);
        cJSON_Delete(msg);
    }
    if (rc < 0) {
        s->stats.protocol_errors++;
        char reason[SG_ERROR_MAX + 32];
        snprintf(reason, sizeof reason, "protocol error: %.*s", SG_ERROR_MAX - 1, err.msg);
        if (c->executor_id >= 0)
            rdv_node_disconnected(s, c, reason);
        conn_reject(s, c, err.msg);
    }
}

static void conn_read(RdvServer *s, RdvConn *c)
{
    uint8_t buf[65536];
    SgError err;
    long n = net_read_some(c->fd, buf, sizeof buf, c->peer, &err);
    if (n < 0) {
        if (c->state == CONN_AUTH)
            note(s, &s->stats.auth_failures, "%s disconnected before authenticating", c->peer);
        rdv_conn_drop(s, c, err.msg);
        return;
    } else if (n == 0) {
        return;
    }
    size_t off = 0;
    while (off < (size_t)n && !c->dead && c->state != CONN_CLOSING) {
        size_t used = 0;
        int rc = net_frame_parser_feed(&c->parser, buf + off, (size_t)n - off, &used, &err);
        off += used;
        if (rc < 0) {
            net_frame_parser_free(&c->parser);
            if (c->state == CONN_AUTH) {
                note(s, &s->stats.auth_failures, "unauthenticated peer %s: %s", c->peer, err.msg);
                rdv_conn_drop(s, c, err.msg);
            } else if (rc == SG_EAUTH) {
                /* A frame that failed its seq or tag (the message names peer, frame type and
                 * seq): the connection goes; the node is told why through the session, whose
                 * server -> node direction is intact. Other connections are not affected. */
                note(s, &s->stats.integrity_failures, "%s", err.msg);
                if (c->executor_id >= 0)
                    rdv_node_disconnected(s, c, err.msg);
                conn_reject(s, c, err.msg);
            } else {
                note(s, &s->stats.protocol_errors, "protocol error from %s: %s", c->peer, err.msg);
                rdv_conn_drop(s, c, s->stats.last_rejection);
            }
            return;
        } else if (rc == 1) {
            NetFrameHeader h;
            uint8_t *payload = NULL;
            net_frame_parser_take(&c->parser, &h, &payload);
            handle_frame(s, c, &h, payload);
            free(payload);
        }
    }
}

/* Deadlines: unauthenticated peers, lingering closes, silent nodes. */
static void check_timeouts(RdvServer *s, double now)
{
    for (size_t i = 0; i < s->nconns; i++) {
        RdvConn *c = s->conns[i];
        if (c->dead)
            continue;
        if (c->state == CONN_AUTH && now > c->deadline) {
            note(s, &s->stats.auth_failures, "%s did not authenticate within %.1f s", c->peer,
                 s->auth_timeout);
            rdv_conn_drop(s, c, "authentication timeout");
        } else if (c->state == CONN_CLOSING && now > c->deadline) {
            rdv_conn_drop(s, c, "closed after rejection");
        } else if (c->state == CONN_READY && now - c->last_seen > s->heartbeat_timeout) {
            char reason[NET_PEER_MAX + 200];
            snprintf(reason, sizeof reason,
                     "no heartbeat from %s for %.1f s (heartbeat_timeout %.1f s): the process is "
                     "stuck, stopped, or its host is unreachable",
                     c->peer, now - c->last_seen, s->heartbeat_timeout);
            rdv_conn_drop(s, c, reason);
        }
    }
}

static void sweep(RdvServer *s)
{
    size_t j = 0;
    for (size_t i = 0; i < s->nconns; i++) {
        if (s->conns[i]->dead)
            conn_free(s, s->conns[i]);
        else
            s->conns[j++] = s->conns[i];
    }
    s->nconns = j;
}

/* ---- the loop ----------------------------------------------------------- */

static void *serve(void *arg)
{
    RdvServer *s = arg;
    struct pollfd *pfd = NULL;
    size_t pcap = 0;
    pthread_mutex_lock(&s->mu);
    while (!s->stopping) {
        size_t n = s->nconns + 2;
        if (n > pcap) {
            struct pollfd *p = realloc(pfd, n * 2 * sizeof *p);
            if (p == NULL) {
                sg_fail(&s->loop_err, SG_ENOMEM, "rendezvous server: out of memory for poll set");
                break;
            }
            pfd = p;
            pcap = n * 2;
        }
        pfd[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        int ms = (int)(s->heartbeat_timeout * 250.0);
        ms = ms < 10 ? 10 : ms > 100 ? 100 : ms;
        /* -1 (not polled) while the gate backs off after EMFILE & co: no spin */
        pfd[1] = (struct pollfd){.fd = net_gate_poll_fd(&s->gate, s->lfd, &ms), .events = POLLIN};
        size_t polled = s->nconns;
        for (size_t i = 0; i < polled; i++) {
            RdvConn *c = s->conns[i];
            pfd[i + 2] = (struct pollfd){
                .fd = c->fd, .events = (short)(POLLIN | (c->out_len > c->out_off ? POLLOUT : 0))};
        }
        pthread_mutex_unlock(&s->mu);
        int r = poll(pfd, polled + 2, ms);
        int poll_errno = errno;
        pthread_mutex_lock(&s->mu);
        if (r == -1) {
            if (poll_errno == EINTR)
                continue;
            sg_fail_errno(&s->loop_err, SG_EIO, poll_errno, "rendezvous server poll");
            break;
        }
        if (pfd[0].revents)
            net_wake_drain(s->wake[0]);
        /* Queued by the API since the poll set was built. */
        for (size_t i = 0; i < s->nconns; i++)
            if (s->conns[i]->out_len > s->conns[i]->out_off)
                conn_flush(s, s->conns[i]);
        for (size_t i = 0; i < polled; i++) {
            RdvConn *c = s->conns[i];
            if (!c->dead && (pfd[i + 2].revents & (POLLIN | POLLHUP | POLLERR)))
                conn_read(s, c);
            if (!c->dead && c->out_len > c->out_off)
                conn_flush(s, c);
        }
        if (pfd[1].fd < 0 || (pfd[1].revents & POLLIN))
            accept_new(s); /* while backing off, the gate accepts once the backoff is over */
        double now = sg_now();
        check_timeouts(s, now);
        if (now - s->last_beat >= RDV_DRIVER_BEAT) {
            /* The driver's heartbeat: lets nodes notice a driver that vanished without a FIN. */
            s->last_beat = now;
            for (size_t i = 0; i < s->nconns; i++) {
                RdvConn *c = s->conns[i];
                if (!c->dead && c->state == CONN_READY && c->executor_id >= 0 &&
                    conn_queue(c, NET_FRAME_HEARTBEAT, NULL, 0) == 0)
                    conn_flush(s, c);
            }
        }
        sweep(s);
    }
    s->loop_done = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    free(pfd);
    return NULL;
}

int rdv_server_start(const uint8_t *secret, size_t secret_len, NetSecurity mode, int num_nodes,
                     const char *host, int port, RdvServer **out, SgError *err)
{
    int rc = net_auth_check_secret(secret_len, err);
    if (rc < 0)
        return rc;
    if (num_nodes < 1 || num_nodes > 65536)
        return sg_fail(err, SG_EINVAL, "num_nodes must be 1..65536, got %d", num_nodes);
    RdvServer *s = calloc(1, sizeof *s);
    if (s == NULL || (s->secret = malloc(secret_len)) == NULL ||
        (s->nodes = calloc((size_t)num_nodes, sizeof *s->nodes)) == NULL) {
        if (s != NULL)
            free(s->secret);
        free(s);
        return sg_fail(err, SG_ENOMEM, "allocating a rendezvous server for %d nodes", num_nodes);
    }
    memcpy(s->secret, secret, secret_len);
    s->secret_len = secret_len;
    s->mode = mode;
    s->num_nodes = num_nodes;
    s->heartbeat_timeout = 10.0;
    s->auth_timeout = NET_AUTH_TIMEOUT_DEFAULT;
    s->max_frame = 1u << 20;
    s->lfd = s->wake[0] = s->wake[1] = -1;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&s->mu, NULL);
    s->stopped = 1; /* until the thread runs: lets rdv_server_free clean up */
    rc = net_gate_init(&s->gate, NET_GATE_MAX_UNAUTH, NET_GATE_MAX_PER_PEER, err);
    if (rc == 0)
        rc = net_listen(host, port, 1024, &s->lfd, &s->port, s->host, sizeof s->host, err);
    if (rc == 0)
        rc = net_wake_pipe(s->wake, err);
    if (rc == 0 && pthread_create(&s->thread, NULL, serve, s) != 0)
        rc = sg_fail(err, SG_EIO, "cannot start the rendezvous server thread");
    if (rc < 0) {
        rdv_server_free(s);
        return rc;
    }
    s->stopped = 0;
    *out = s;
    return SG_OK;
}

void rdv_server_set_auth_timeout(RdvServer *s, double seconds)
{
    pthread_mutex_lock(&s->mu);
    s->auth_timeout = seconds;
    pthread_mutex_unlock(&s->mu);
}

void rdv_server_stop(RdvServer *s)
{
    pthread_mutex_lock(&s->mu);
    int was_stopped = s->stopped;
    s->stopping = 1;
    s->stopped = 1;
    pthread_mutex_unlock(&s->mu);
    if (!was_stopped) {
        net_wake(s->wake[1]);
        pthread_join(s->thread, NULL);
    }
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nconns; i++)
        conn_free(s, s->conns[i]);
    s->nconns = 0;
    for (int i = 0; i < s->num_nodes; i++)
        s->nodes[i].conn = NULL;
    net_close(&s->lfd);
    net_close(&s->wake[0]);
    net_close(&s->wake[1]);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void rdv_server_free(RdvServer *s)
{
    if (s == NULL)
        return;
    rdv_server_stop(s);
    rdv_registry_free(s);
    free(s->conns);
    if (s->secret != NULL)
        OPENSSL_cleanse(s->secret, s->secret_len);
    free(s->secret);
    net_gate_free(&s->gate);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
