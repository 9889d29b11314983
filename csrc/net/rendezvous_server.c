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

#include "common/sg_grow.h"
#include "net/auth.h"
#include "net/frame.h"
#include "net/json_msg.h"
#include "net/rendezvous_internal.h"
#include "net/sock.h"

#define RDV_CLOSE_LINGER 2.0 /* seconds to flush a reject before closing */
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
    if (sg_grow(&c->out, &c->out_cap, need, 1, 4096) < 0)
        return SG_ENOMEM;
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

static int conn_queue_text(RdvConn *c, const char *json)
{
    return conn_queue_frame(c, &c->session, NET_FRAME_JSON, 0, json, strlen(json));
}

static int conn_queue_json(RdvConn *c, const cJSON *msg)
{
    char *text = net_json_print(msg);
    if (text == NULL)
        return SG_ENOMEM;
    int rc = conn_queue_text(c, text);
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
        conn_queue_json(c, msg);
    cJSON_Delete(msg);
    c->state = CONN_CLOSING;
    c->deadline = sg_now() + RDV_CLOSE_LINGER;
}

/* Drops a connection: a registered node that had not finished is lost. */
static void conn_drop(RdvServer *s, RdvConn *c, const char *reason)
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
            conn_drop(s, c, err.msg);
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
        net_gate_release(&s->acc.gate, c->peer);
    net_close(&c->fd);
    net_frame_parser_free(&c->parser);
    net_session_free(&c->session);
    free(c->out);
    free(c);
}

/* The gate's add: a new connection, challenged at once. */
static void add_conn(void *ctx, int fd, const char *peer)
{
    RdvServer *s = ctx;
    SgError err;
    int grown = sg_grow(&s->conns, &s->capconns, s->nconns + 1, sizeof *s->conns, 16) == 0;
    RdvConn *c = grown ? calloc(1, sizeof *c) : NULL;
    if (c == NULL || net_auth_random(c->challenge, sizeof c->challenge, &err) < 0) {
        free(c);
        close(fd);
        net_gate_release(&s->acc.gate, peer);
        return;
    }
    c->fd = fd, c->state = CONN_AUTH, c->executor_id = -1, c->gated = 1;
    snprintf(c->peer, sizeof c->peer, "%s", peer);
    c->deadline = net_gate_auth_deadline(&s->acc.gate);
    c->last_seen = sg_now();
    net_frame_parser_init(&c->parser, NET_FRAME_MAX_UNAUTH);
    s->conns[s->nconns++] = c;
    s->stats.accepted++;
    /* The challenge's flags announce the server's security mode (auth.h). */
    if (conn_queue_frame(c, NULL, NET_FRAME_AUTH_CHALLENGE, (uint16_t)s->acc.mode, c->challenge,
                         sizeof c->challenge) < 0)
        c->dead = 1;
    else
        conn_flush(s, c);
}

/* ---- frames ----------------------------------------------------------- */

static void handle_auth(RdvServer *s, RdvConn *c, const NetFrameHeader *h, const uint8_t *payload)
{
    SgError err;
    uint8_t ok[NET_AUTH_MAC];
    int rc =
        h->type != NET_FRAME_AUTH_RESPONSE
            ? sg_fail(&err, SG_EAUTH, "client %s sent a %s frame before authenticating", c->peer,
                      net_frame_type_name(h->type))
            : net_auth_server_check(s->acc.secret, s->acc.secret_len, s->acc.mode, c->challenge,
                                    h->flags, payload, h->length, ok, c->peer, &c->session, &err);
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
    net_gate_authenticated(&s->acc.gate, c->peer);
    c->gated = 0;
    c->last_seen = sg_now();
    net_frame_parser_protect(&c->parser, &c->session, s->max_frame, c->peer);
}

/* Queues {"type":"spec","spec":[...]} to every connected node (or only one);
 * the text is built once, not per node. */
static int send_spec(RdvServer *s, RdvConn *only)
{
    static const char head[] = "{\"type\":\"spec\",\"spec\":";
    size_t n = strlen(s->spec_json);
    char *text = malloc(sizeof head + n + 1);
    if (text == NULL)
        return SG_ENOMEM;
    memcpy(text, head, sizeof head - 1);
    memcpy(text + sizeof head - 1, s->spec_json, n);
    memcpy(text + sizeof head - 1 + n, "}", 2);
    int rc = SG_OK;
    for (int i = 0; i < s->num_nodes && rc == 0; i++) {
        RdvConn *c = s->nodes[i].conn;
        if (c != NULL && (only == NULL || c == only))
            rc = conn_queue_text(c, text);
    }
    free(text);
    return rc;
}

/* After a registration: the ack, then the spec if there is one (to every
 * node when it just completed, else to this one). */
static int ack_registration(RdvServer *s, RdvConn *c, int spec_first, SgError *err)
{
    cJSON *ack = cJSON_CreateObject();
    if (ack == NULL)
        return sg_fail(err, SG_ENOMEM, "registering %s", c->peer);
    cJSON_AddStringToObject(ack, "type", "registered");
    cJSON_AddNumberToObject(ack, "registered", s->registered);
    cJSON_AddNumberToObject(ack, "num_nodes", s->num_nodes);
    int rc = conn_queue_json(c, ack);
    cJSON_Delete(ack);
    if (rc < 0)
        return sg_fail(err, SG_ENOMEM, "queueing the registration ack for %s", c->peer);
    if (s->spec_json != NULL && send_spec(s, spec_first ? NULL : c) < 0)
        return sg_fail(err, SG_ENOMEM, "queueing the cluster spec");
    return SG_OK;
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
        if (rc > 0)
            rc = ack_registration(s, c, rc == RDV_SPEC_FIRST, &err);
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
        conn_drop(s, c, err.msg);
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
                conn_drop(s, c, err.msg);
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
                conn_drop(s, c, s->stats.last_rejection);
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
                 now - c->last_seen);
            conn_drop(s, c, "authentication timeout");
        } else if (c->state == CONN_CLOSING && now > c->deadline) {
            conn_drop(s, c, "closed after rejection");
        } else if (c->state == CONN_READY && now - c->last_seen > s->heartbeat_timeout) {
            char reason[NET_PEER_MAX + 200];
            snprintf(reason, sizeof reason,
                     "no heartbeat from %s for %.1f s (heartbeat_timeout %.1f s): the process is "
                     "stuck, stopped, or its host is unreachable",
                     c->peer, now - c->last_seen, s->heartbeat_timeout);
            conn_drop(s, c, reason);
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
        if (sg_grow(&pfd, &pcap, s->nconns + 2, sizeof *pfd, 64) < 0) {
            sg_fail(&s->loop_err, SG_ENOMEM, "rendezvous server: out of memory for poll set");
            break;
        }
        pfd[0] = (struct pollfd){.fd = s->acc.wake[0], .events = POLLIN};
        int ms = (int)(s->heartbeat_timeout * 250.0);
        ms = ms < 10 ? 10 : ms > 100 ? 100 : ms;
        /* -1 (not polled) while the gate backs off after EMFILE & co: no spin */
        pfd[1] = (struct pollfd){.fd = net_gate_poll_fd(&s->acc.gate, s->acc.lfd, &ms),
                                 .events = POLLIN};
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
            net_wake_drain(s->acc.wake[0]);
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
        /* while backing off, the gate accepts once the backoff is over */
        net_gate_accept_ready(&s->acc.gate, s->acc.lfd, pfd[1].fd < 0 || (pfd[1].revents & POLLIN),
                              add_conn, s);
        double now = sg_now();
        check_timeouts(s, now);
        if (now - s->last_beat >= RDV_DRIVER_BEAT) {
            /* The driver's heartbeat: lets nodes notice a driver that vanished without a FIN. */
            s->last_beat = now;
            for (size_t i = 0; i < s->nconns; i++) {
                RdvConn *c = s->conns[i];
                if (!c->dead && c->state == CONN_READY && c->executor_id >= 0 &&
                    conn_queue_frame(c, &c->session, NET_FRAME_HEARTBEAT, 0, NULL, 0) == 0)
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
    if (num_nodes < 1 || num_nodes > 65536)
        return sg_fail(err, SG_EINVAL, "num_nodes must be 1..65536, got %d", num_nodes);
    RdvServer *s = calloc(1, sizeof *s);
    if (s == NULL || (s->nodes = calloc((size_t)num_nodes, sizeof *s->nodes)) == NULL) {
        free(s);
        return sg_fail(err, SG_ENOMEM, "allocating a rendezvous server for %d nodes", num_nodes);
    }
    s->num_nodes = num_nodes;
    s->heartbeat_timeout = 10.0;
    s->max_frame = 1u << 20;
    sg_cond_init(&s->cv);
    pthread_mutex_init(&s->mu, NULL);
    s->stopped = 1; /* until the thread runs: lets rdv_server_free clean up */
    int rc = net_acceptor_init(&s->acc, -1, secret, secret_len, mode, err);
    if (rc == 0)
        rc = net_listen(host, port, 1024, &s->acc.lfd, &s->port, s->host, sizeof s->host, err);
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

static int queue_user_text(RdvConn *c, const char *json, SgError *err)
{
    cJSON *msg = NULL;
    const char *type;
    int rc = net_json_parse((const uint8_t *)json, strlen(json), "the driver", &msg, &type, err);
    if (rc < 0)
        return sg_fail(err, SG_EINVAL,
                       "message to send must be a JSON object with a string \"type\"");
    rc = conn_queue_json(c, msg);
    cJSON_Delete(msg);
    return rc < 0 ? sg_fail(err, SG_ENOMEM, "queueing a message for %s", c->peer) : SG_OK;
}

int rdv_server_send(RdvServer *s, long executor_id, const char *json, SgError *err)
{
    int rc;
    pthread_mutex_lock(&s->mu);
    if (s->stopped) {
        rc = rdv_closed_error(s, err);
    } else if (executor_id < 0 || executor_id >= s->num_nodes) {
        rc = sg_fail(err, SG_EINVAL, "executor_id %ld is outside 0..%d", executor_id,
                     s->num_nodes - 1);
    } else if (s->nodes[executor_id].conn == NULL) {
        rc = sg_fail(err, SG_ECLUSTER, "executor %ld is not connected (%s)", executor_id,
                     s->nodes[executor_id].info == NULL ? "never registered"
                                                        : "its connection was lost");
    } else {
        rc = queue_user_text(s->nodes[executor_id].conn, json, err);
        if (rc == 0)
            net_wake(s->acc.wake[1]);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int rdv_server_broadcast(RdvServer *s, const char *json, int *sent, SgError *err)
{
    int rc = SG_OK;
    *sent = 0;
    pthread_mutex_lock(&s->mu);
    if (s->stopped)
        rc = rdv_closed_error(s, err);
    for (int i = 0; rc == 0 && i < s->num_nodes; i++) {
        if (s->nodes[i].conn == NULL)
            continue;
        rc = queue_user_text(s->nodes[i].conn, json, err);
        *sent += rc == 0;
    }
    if (*sent > 0)
        net_wake(s->acc.wake[1]);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void rdv_server_set_heartbeat_timeout(RdvServer *s, double seconds)
{
    pthread_mutex_lock(&s->mu);
    s->heartbeat_timeout = seconds;
    if (!s->stopped)
        net_wake(s->acc.wake[1]); /* the loop's poll period follows it */
    pthread_mutex_unlock(&s->mu);
}

double rdv_server_heartbeat_timeout(RdvServer *s)
{
    pthread_mutex_lock(&s->mu);
    double v = s->heartbeat_timeout;
    pthread_mutex_unlock(&s->mu);
    return v;
}

void rdv_server_set_auth_timeout(RdvServer *s, double seconds)
{
    net_gate_set_auth_timeout(&s->acc.gate, seconds);
}

void rdv_server_stop(RdvServer *s)
{
    pthread_mutex_lock(&s->mu);
    int was_stopped = s->stopped;
    s->stopping = 1;
    s->stopped = 1;
    pthread_mutex_unlock(&s->mu);
    if (!was_stopped) {
        net_wake(s->acc.wake[1]);
        pthread_join(s->thread, NULL);
    }
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nconns; i++)
        conn_free(s, s->conns[i]);
    s->nconns = 0;
    for (int i = 0; i < s->num_nodes; i++)
        s->nodes[i].conn = NULL;
    net_close(&s->acc.lfd);
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
    net_acceptor_free(&s->acc);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
