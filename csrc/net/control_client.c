/*
 * control_client.c - the node side of the rendezvous (control_client.h).
 *
 * The connection's reader thread (reader.h) parses incoming frames into a
 * queue and, at each tick, sends a heartbeat frame whenever
 * heartbeat_interval has passed and watches the driver's silence. Writers
 * (the reader thread and API callers) serialize on send_mu; the queue and
 * connection state live under mu.
 */
#include "net/control_client.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/auth.h"
#include "net/json_msg.h"
#include "net/reader.h"

#define CTL_MAX_FRAME (16u << 20)

struct CtlClient {
    int fd;
    NetSession session; /* keyed by the handshake; send half under send_mu, recv half: reader */
    char peer[NET_PEER_MAX];
    long executor_id;
    double heartbeat_interval;
    double driver_timeout; /* silence from the driver that counts as its loss */
    double last_recv;      /* sg_now() of the last frame from the driver (reader thread only) */
    double next_hb;        /* sg_now() of the next heartbeat (reader thread only) */
    NetReader rd;          /* rd.err: code != 0 once the connection broke (under mu) */
    pthread_mutex_t send_mu;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stopped;
    int interrupted; /* ctl_client_interrupt() since the last recv returned */
    int acked, registered, num_nodes;
    cJSON *spec;     /* the spec array, as received */
    char *spec_json; /* its text, printed on first ctl_client_spec() */
};

/* ---- the reader thread's callbacks ---------------------------------------- */

/* Handles one driver message; called with c->mu held. 1: for recv to return. */
static int handle_msg(CtlClient *c, cJSON *msg, const char *type, SgError *err)
{
    if (strcmp(type, "registered") == 0) {
        long k, n;
        int rc;
        if ((rc = net_json_int(msg, "registered", 0, 1L << 30, c->peer, &k, err)) < 0 ||
            (rc = net_json_int(msg, "num_nodes", 0, 1L << 30, c->peer, &n, err)) < 0)
            return rc;
        c->acked = 1, c->registered = (int)k, c->num_nodes = (int)n;
    } else if (strcmp(type, "spec") == 0) {
        cJSON *spec = cJSON_DetachItemFromObjectCaseSensitive(msg, "spec");
        if (!cJSON_IsArray(spec)) {
            cJSON_Delete(spec);
            return sg_fail(err, SG_EPROTO, "spec message from %s has no \"spec\" array", c->peer);
        }
        cJSON_Delete(c->spec);
        c->spec = spec;
        free(c->spec_json);
        c->spec_json = NULL;
    } else if (strcmp(type, "reject") == 0) {
        const char *reason = "";
        net_json_string(msg, "reason", c->peer, &reason, err);
        return sg_fail(err, SG_ECLUSTER, "driver %s rejected executor %ld: %s", c->peer,
                       c->executor_id, reason);
    } else if (strcmp(type, "stop") == 0 && c->spec == NULL) {
        return sg_fail(err, SG_ECANCELLED, "driver %s stopped the cluster before it formed",
                       c->peer);
    } else {
        return 1;
    }
    return SG_OK;
}

static int handle_frame(void *ctx, const NetFrameHeader *h, uint8_t *payload, SgError *err)
{
    CtlClient *c = ctx;
    c->last_recv = sg_now();
    cJSON *msg = NULL;
    const char *type;
    int rc = SG_OK, queued = 0;
    if (h->type != NET_FRAME_HEARTBEAT && h->type != NET_FRAME_JSON)
        rc = sg_fail(err, SG_EPROTO, "driver %s sent a %s frame on the control connection", c->peer,
                     net_frame_type_name(h->type));
    else if (h->type == NET_FRAME_JSON &&
             (rc = net_json_parse(payload, h->length, c->peer, &msg, &type, err)) == 0) {
        pthread_mutex_lock(&c->mu);
        rc = handle_msg(c, msg, type, err);
        if ((queued = rc == 1) && (rc = net_reader_queue(&c->rd, h, payload)) < 0)
            sg_fail(err, rc, "queueing a message from %s", c->peer); /* it freed payload */
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        cJSON_Delete(msg);
    }
    if (!queued)
        free(payload);
    return rc;
}

static int send_frame(CtlClient *c, uint8_t type, const void *buf, size_t len, double deadline,
                      SgError *err)
{
    pthread_mutex_lock(&c->send_mu);
    int rc = c->fd < 0
                 ? sg_fail(err, SG_ESTATE, "control connection to %s is closed", c->peer)
                 : net_frame_send(c->fd, &c->session, type, 0, buf, len, deadline, c->peer, err);
    pthread_mutex_unlock(&c->send_mu);
    return rc;
}

/* The reader's tick: the driver's silence, then this node's heartbeat. */
static int tick(void *ctx, double *wake_at, SgError *err)
{
    CtlClient *c = ctx;
    if (sg_now() - c->last_recv > c->driver_timeout)
        return sg_fail(
            err, SG_ETIMEOUT,
            "no message or heartbeat from driver %s for %.1f s (driver_timeout): the driver "
            "process or its host is gone",
            c->peer, sg_now() - c->last_recv);
    if (sg_now() >= c->next_hb) {
        /* A heartbeat that cannot leave within a few intervals means a dead link. */
        double deadline = sg_now() + 5 * c->heartbeat_interval + 1.0;
        int rc = send_frame(c, NET_FRAME_HEARTBEAT, NULL, 0, deadline, err);
        if (rc < 0)
            return rc;
        c->next_hb = sg_now() + c->heartbeat_interval;
    }
    double silent_at = c->last_recv + c->driver_timeout;
    *wake_at = c->next_hb < silent_at ? c->next_hb : silent_at;
    return SG_OK;
}

/* ---- API ----------------------------------------------------------------- */

/* Connect, authenticate, send the registration (no thread yet). */
static int connect_and_register(CtlClient *c, const char *host, int port, const uint8_t *secret,
                                size_t secret_len, NetSecurity mode, cJSON *node, double deadline,
                                SgError *err)
{
    int rc = net_connect_auth(host, port, secret, secret_len, mode, deadline, &c->fd, &c->session,
                              c->peer, "rendezvous: ", err);
    if (rc < 0)
        return rc;
    cJSON *msg = cJSON_CreateObject();
    if (msg == NULL)
        return sg_fail(err, SG_ENOMEM, "building the register message");
    cJSON_AddStringToObject(msg, "type", "register");
    cJSON_AddItemReferenceToObject(msg, "node", node);
    rc = net_json_send(c->fd, &c->session, msg, deadline, c->peer, err); /* no thread yet */
    cJSON_Delete(msg);
    return rc;
}

int ctl_client_register(const char *host, int port, const uint8_t *secret, size_t secret_len,
                        NetSecurity mode, const char *node_json, double timeout,
                        double heartbeat_interval, double driver_timeout, CtlClient **out,
                        SgError *err)
{
    double deadline;
    int rc;
    if ((rc = net_auth_check_secret(secret_len, err)) < 0 ||
        (rc = net_deadline(timeout, "ControlClient.register", &deadline, err)) < 0)
        return rc;
    if (!(heartbeat_interval > 0 && heartbeat_interval <= 3600))
        return sg_fail(err, SG_EINVAL, "heartbeat_interval must be in (0, 3600] seconds, got %g",
                       heartbeat_interval);
    if (!(driver_timeout >= 2.0 && driver_timeout <= 86400))
        return sg_fail(err, SG_EINVAL, "driver_timeout must be in [2, 86400] seconds, got %g",
                       driver_timeout);
    cJSON *node = cJSON_Parse(node_json);
    const cJSON *eid = cJSON_GetObjectItemCaseSensitive(node, "executor_id");
    if (!cJSON_IsObject(node) || !cJSON_IsNumber(eid)) {
        cJSON_Delete(node);
        return sg_fail(err, SG_EINVAL, "node must be an object with an integer executor_id");
    }
    CtlClient *c = calloc(1, sizeof *c);
    if (c == NULL) {
        cJSON_Delete(node);
        return sg_fail(err, SG_ENOMEM, "allocating a control client");
    }
    c->fd = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->send_mu, NULL);
    net_cond_init(&c->cv);
    snprintf(c->peer, sizeof c->peer, "%s:%d", host, port);
    c->executor_id = (long)eid->valuedouble;
    c->heartbeat_interval = heartbeat_interval;
    c->driver_timeout = driver_timeout;
    rc = connect_and_register(c, host, port, secret, secret_len, mode, node, deadline, err);
    cJSON_Delete(node);
    c->last_recv = sg_now();
    c->next_hb = c->last_recv + heartbeat_interval;
    c->rd = (NetReader){.fd = c->fd,
                        .session = &c->session,
                        .peer = c->peer,
                        .who = "driver",
                        .what = "control",
                        .max_frame = CTL_MAX_FRAME,
                        .mu = &c->mu,
                        .cv = &c->cv,
                        .ctx = c,
                        .frame = handle_frame,
                        .tick = tick};
    if (rc == 0)
        rc = net_reader_start(&c->rd, err);
    if (rc == 0) {
        pthread_mutex_lock(&c->mu);
        while (c->spec == NULL && c->rd.err.code == 0 &&
               net_cond_wait(&c->cv, &c->mu, deadline) != ETIMEDOUT)
            ;
        if (c->spec != NULL)
            rc = SG_OK;
        else if (c->rd.err.code != 0)
            rc = sg_fail(err, c->rd.err.code, "%s", c->rd.err.msg);
        else if (c->acked)
            rc = sg_fail(err, SG_ERDV_TIMEOUT,
                         "executor %ld got no cluster spec from driver %s within %.1f s: when it "
                         "registered, %d of %d nodes had registered (the others have not reached "
                         "the rendezvous: too few free task slots, or failed tasks)",
                         c->executor_id, c->peer, timeout, c->registered, c->num_nodes);
        else
            rc =
                sg_fail(err, SG_ERDV_TIMEOUT,
                        "executor %ld: driver %s never acknowledged the registration within %.1f s",
                        c->executor_id, c->peer, timeout);
        pthread_mutex_unlock(&c->mu);
    }
    if (rc < 0) {
        ctl_client_free(c);
        return rc;
    }
    *out = c;
    return SG_OK;
}

char *ctl_client_spec(CtlClient *c)
{
    pthread_mutex_lock(&c->mu);
    if (c->spec_json == NULL && c->spec != NULL)
        c->spec_json = net_json_print(c->spec);
    char *out = c->spec_json != NULL ? strdup(c->spec_json) : NULL;
    pthread_mutex_unlock(&c->mu);
    return out;
}

static int send_json(CtlClient *c, cJSON *msg, double timeout, SgError *err)
{
    double deadline;
    int rc = net_deadline(timeout, "a control message", &deadline, err);
    char *text = rc == 0 && msg != NULL ? net_json_print(msg) : NULL;
    cJSON_Delete(msg);
    if (rc < 0)
        return rc;
    if (text == NULL)
        return sg_fail(err, SG_ENOMEM, "building a control message");
    rc = send_frame(c, NET_FRAME_JSON, text, strlen(text), deadline, err);
    free(text);
    return rc;
}

static cJSON *new_msg(const char *type)
{
    cJSON *m = cJSON_CreateObject();
    if (m != NULL && cJSON_AddStringToObject(m, "type", type) == NULL) {
        cJSON_Delete(m);
        return NULL;
    }
    return m;
}

int ctl_client_log(CtlClient *c, const char *line, const char *stream, double timeout, SgError *err)
{
    cJSON *m = new_msg("log");
    cJSON_AddStringToObject(m, "line", line);
    if (stream != NULL)
        cJSON_AddStringToObject(m, "stream", stream);
    return send_json(c, m, timeout, err);
}

int ctl_client_metric(CtlClient *c, const char *name, double value, long step, double timeout,
                      SgError *err)
{
    cJSON *m = new_msg("metric");
    cJSON_AddStringToObject(m, "name", name);
    cJSON_AddNumberToObject(m, "value", value);
    cJSON_AddNumberToObject(m, "step", (double)step);
    return send_json(c, m, timeout, err);
}

int ctl_client_done(CtlClient *c, const char *result, double timeout, SgError *err)
{
    cJSON *m = new_msg("done");
    cJSON_AddStringToObject(m, "result", result);
    return send_json(c, m, timeout, err);
}

int ctl_client_error(CtlClient *c, const char *message, const char *traceback, const char *host,
                     double timeout, SgError *err)
{
    cJSON *m = new_msg("error");
    cJSON_AddStringToObject(m, "message", message);
    cJSON_AddStringToObject(m, "traceback", traceback);
    cJSON_AddStringToObject(m, "host", host);
    return send_json(c, m, timeout, err);
}

int ctl_client_recv(CtlClient *c, double timeout, char **json, SgError *err)
{
    double deadline;
    int rc = net_deadline(timeout, "ControlClient.recv", &deadline, err);
    if (rc < 0)
        return rc;
    *json = NULL;
    pthread_mutex_lock(&c->mu);
    while (c->rd.head == NULL && c->rd.err.code == 0 && !c->stopped && !c->interrupted &&
           net_cond_wait(&c->cv, &c->mu, deadline) != ETIMEDOUT)
        ;
    if (c->interrupted) {
        c->interrupted = 0; /* returns no message; a queued one stays for the next recv */
    } else if (c->rd.head != NULL) {
        NetMsg *m = net_reader_take(&c->rd, -1);
        *json = (char *)m->payload;
        free(m);
    } else if (c->rd.err.code != 0) {
        rc = sg_fail(err, c->rd.err.code, "%s", c->rd.err.msg);
    } else if (c->stopped) {
        rc = sg_fail(err, SG_ESTATE, "control client for %s is closed", c->peer);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void ctl_client_interrupt(CtlClient *c)
{
    pthread_mutex_lock(&c->mu);
    c->interrupted = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void ctl_client_stop(CtlClient *c)
{
    pthread_mutex_lock(&c->mu);
    int was = c->stopped;
    c->stopped = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (was)
        return;
    net_reader_stop(&c->rd);
    pthread_mutex_lock(&c->send_mu);
    net_close(&c->fd);
    net_session_free(&c->session);
    pthread_mutex_unlock(&c->send_mu);
}

void ctl_client_free(CtlClient *c)
{
    if (c == NULL)
        return;
    ctl_client_stop(c);
    net_reader_free(&c->rd);
    cJSON_Delete(c->spec);
    free(c->spec_json);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->send_mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}
