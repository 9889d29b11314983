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
#include <unistd.h>

#include "net/auth.h"
#include "net/json_msg.h"
#include "net/reader.h"

#define CTL_MAX_FRAME (16u << 20)

struct CtlClient {
    NetClient net; /* net.rd.err: code != 0 once the connection broke (under net.mu) */
    long executor_id;
    double heartbeat_interval;
    double driver_timeout; /* silence from the driver that counts as its loss */
    double last_recv;      /* sg_now() of the last frame from the driver (reader thread only) */
    double next_hb;        /* sg_now() of the next heartbeat (reader thread only) */
    /* under net.mu */
    int stopped;
    int interrupted; /* ctl_client_interrupt() since the last recv returned */
    int acked, registered, num_nodes;
    cJSON *spec;     /* the spec array, as received */
    char *spec_json; /* its text, printed on first ctl_client_spec() */
    /* ctl_client_exit_when_orphaned's guard thread and what it was given */
    int guarded;
    pthread_t guard;
    double guard_after;
    int guard_status;
    char *guard_message;
};

/* ---- the reader thread's callbacks ---------------------------------------- */

/* Handles one driver message; called with c->net.mu held. 1: for recv to return. */
static int handle_msg(CtlClient *c, cJSON *msg, const char *type, SgError *err)
{
    if (strcmp(type, "registered") == 0) {
        long k, n;
        int rc;
        if ((rc = net_json_int(msg, "registered", 0, 1L << 30, c->net.peer, &k, err)) < 0 ||
            (rc = net_json_int(msg, "num_nodes", 0, 1L << 30, c->net.peer, &n, err)) < 0)
            return rc;
        c->acked = 1, c->registered = (int)k, c->num_nodes = (int)n;
    } else if (strcmp(type, "spec") == 0) {
        cJSON *spec = cJSON_DetachItemFromObjectCaseSensitive(msg, "spec");
        if (!cJSON_IsArray(spec)) {
            cJSON_Delete(spec);
            return sg_fail(err, SG_EPROTO, "spec message from %s has no \"spec\" array",
                           c->net.peer);
        }
        cJSON_Delete(c->spec);
        c->spec = spec;
        free(c->spec_json);
        c->spec_json = NULL;
    } else if (strcmp(type, "reject") == 0) {
        const char *reason = "";
        net_json_string(msg, "reason", c->net.peer, &reason, err);
        return sg_fail(err, SG_ECLUSTER, "driver %s rejected executor %ld: %s", c->net.peer,
                       c->executor_id, reason);
    } else if (strcmp(type, "stop") == 0 && c->spec == NULL) {
        return sg_fail(err, SG_ECANCELLED, "driver %s stopped the cluster before it formed",
                       c->net.peer);
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
        rc = sg_fail(err, SG_EPROTO, "driver %s sent a %s frame on the control connection",
                     c->net.peer, net_frame_type_name(h->type));
    else if (h->type == NET_FRAME_JSON &&
             (rc = net_json_parse(payload, h->length, c->net.peer, &msg, &type, err)) == 0) {
        pthread_mutex_lock(&c->net.mu);
        rc = handle_msg(c, msg, type, err);
        if ((queued = rc == 1) &&
            (rc = net_msgq_push(&c->net.rd.q, h->flags, payload, h->length)) < 0)
            sg_fail(err, rc, "queueing a message from %s", c->net.peer); /* it freed payload */
        pthread_cond_broadcast(&c->net.cv);
        pthread_mutex_unlock(&c->net.mu);
        cJSON_Delete(msg);
    }
    if (!queued)
        free(payload);
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
            c->net.peer, sg_now() - c->last_recv);
    if (sg_now() >= c->next_hb) {
        /* A heartbeat that cannot leave within a few intervals means a dead link. */
        double deadline = sg_now() + 5 * c->heartbeat_interval + 1.0;
        int rc = net_client_send(&c->net, NET_FRAME_HEARTBEAT, 0, NULL, 0, deadline, err);
        if (rc < 0)
            return rc;
        c->next_hb = sg_now() + c->heartbeat_interval;
    }
    double silent_at = c->last_recv + c->driver_timeout;
    *wake_at = c->next_hb < silent_at ? c->next_hb : silent_at;
    return SG_OK;
}

/* ---- API ----------------------------------------------------------------- */

static cJSON *new_msg(const char *type)
{
    cJSON *m = cJSON_CreateObject();
    if (m != NULL && cJSON_AddStringToObject(m, "type", type) == NULL) {
        cJSON_Delete(m);
        return NULL;
    }
    return m;
}

int ctl_client_register(const char *host, int port, const uint8_t *secret, size_t secret_len,
                        NetSecurity mode, const char *node_json, double timeout,
                        double heartbeat_interval, double driver_timeout, CtlClient **out,
                        SgError *err)
{
    double deadline;
    int rc;
    if ((rc = net_auth_check_secret(secret_len, err)) < 0 ||
        (rc = sg_deadline(timeout, "ControlClient.register", &deadline, err)) < 0)
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
    c->executor_id = (long)eid->valuedouble;
    c->heartbeat_interval = heartbeat_interval;
    c->driver_timeout = driver_timeout;
    const NetReader reader = {.who = "driver",
                              .what = "control",
                              .max_frame = CTL_MAX_FRAME,
                              .ctx = c,
                              .frame = handle_frame,
                              .tick = tick};
    rc = net_client_open(&c->net, host, port, secret, secret_len, mode, deadline,
                         "rendezvous: ", &reader, err);
    cJSON *msg = rc == 0 ? new_msg("register") : NULL;
    if (rc == 0 && msg == NULL)
        rc = sg_fail(err, SG_ENOMEM, "building the register message");
    if (msg != NULL) { /* sent before the reader starts: the registration comes first */
        cJSON_AddItemReferenceToObject(msg, "node", node);
        rc = net_json_send(c->net.fd, &c->net.session, msg, deadline, c->net.peer, err);
        cJSON_Delete(msg);
    }
    cJSON_Delete(node);
    c->last_recv = sg_now();
    c->next_hb = c->last_recv + heartbeat_interval;
    if (rc == 0)
        rc = net_reader_start(&c->net.rd, err);
    if (rc == 0) {
        pthread_mutex_lock(&c->net.mu);
        while (c->spec == NULL && c->net.rd.err.code == 0 &&
               sg_cond_wait(&c->net.cv, &c->net.mu, deadline) != ETIMEDOUT)
            ;
        if (c->spec != NULL)
            rc = SG_OK;
        else if (c->net.rd.err.code != 0)
            rc = sg_fail(err, c->net.rd.err.code, "%s", c->net.rd.err.msg);
        else if (c->acked)
            rc = sg_fail(err, SG_ERDV_TIMEOUT,
                         "executor %ld got no cluster spec from driver %s within %.1f s: when it "
                         "registered, %d of %d nodes had registered (the others have not reached "
                         "the rendezvous: too few free task slots, or failed tasks)",
                         c->executor_id, c->net.peer, timeout, c->registered, c->num_nodes);
        else
            rc =
                sg_fail(err, SG_ERDV_TIMEOUT,
                        "executor %ld: driver %s never acknowledged the registration within %.1f s",
                        c->executor_id, c->net.peer, timeout);
        pthread_mutex_unlock(&c->net.mu);
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
    pthread_mutex_lock(&c->net.mu);
    if (c->spec_json == NULL && c->spec != NULL)
        c->spec_json = net_json_print(c->spec);
    char *out = c->spec_json != NULL ? strdup(c->spec_json) : NULL;
    pthread_mutex_unlock(&c->net.mu);
    return out;
}

static int send_json(CtlClient *c, cJSON *msg, double timeout, SgError *err)
{
    double deadline;
    int rc = sg_deadline(timeout, "a control message", &deadline, err);
    char *text = rc == 0 && msg != NULL ? net_json_print(msg) : NULL;
    cJSON_Delete(msg);
    if (rc < 0)
        return rc;
    if (text == NULL)
        return sg_fail(err, SG_ENOMEM, "building a control message");
    rc = net_client_send(&c->net, NET_FRAME_JSON, 0, text, strlen(text), deadline, err);
    free(text);
    return rc;
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
    int rc = sg_deadline(timeout, "ControlClient.recv", &deadline, err);
    if (rc < 0)
        return rc;
    *json = NULL;
    pthread_mutex_lock(&c->net.mu);
    while (c->net.rd.q.head == NULL && c->net.rd.err.code == 0 && !c->stopped && !c->interrupted &&
           sg_cond_wait(&c->net.cv, &c->net.mu, deadline) != ETIMEDOUT)
        ;
    if (c->interrupted) {
        c->interrupted = 0; /* returns no message; a queued one stays for the next recv */
    } else if (c->net.rd.q.head != NULL) {
        NetMsg *m = net_msgq_take(&c->net.rd.q, -1);
        *json = (char *)m->payload;
        free(m);
    } else if (c->net.rd.err.code != 0) {
        rc = sg_fail(err, c->net.rd.err.code, "%s", c->net.rd.err.msg);
    } else if (c->stopped) {
        rc = sg_fail(err, SG_ESTATE, "control client for %s is closed", c->net.peer);
    }
    pthread_mutex_unlock(&c->net.mu);
    return rc;
}

/* The guard: sleeps until the connection breaks, then guard_after more; ends the process unless
 * the node stopped the client meanwhile. Needs nothing but the client's mutex, so it runs while
 * every other thread of the process is stuck (a thread holding the GIL in a native wait). */
static void *guard_main(void *arg)
{
    CtlClient *c = arg;
    pthread_mutex_lock(&c->net.mu);
    while (!c->stopped && c->net.rd.err.code == 0)
        pthread_cond_wait(&c->net.cv, &c->net.mu);
    double deadline = sg_now() + c->guard_after;
    while (!c->stopped && sg_cond_wait(&c->net.cv, &c->net.mu, deadline) != ETIMEDOUT)
        ;
    int end = !c->stopped;
    pthread_mutex_unlock(&c->net.mu);
    if (end) {
        /* no driver is left to forward it to: the process's own stderr */
        size_t left = strlen(c->guard_message);
        const char *p = c->guard_message;
        while (left > 0) {
            ssize_t n = write(STDERR_FILENO, p, left);
            if (n <= 0 && errno != EINTR)
                break;
            if (n > 0)
                p += n, left -= (size_t)n;
        }
        _exit(c->guard_status);
    }
    return NULL;
}

int ctl_client_exit_when_orphaned(CtlClient *c, double after, int status, const char *message,
                                  SgError *err)
{
    if (!(after > 0 && after <= 86400))
        return sg_fail(err, SG_EINVAL, "after must be in (0, 86400] seconds, got %g", after);
    if (status < 0 || status > 255)
        return sg_fail(err, SG_EINVAL, "exit status must be in [0, 255], got %d", status);
    pthread_mutex_lock(&c->net.mu);
    int rc = SG_OK;
    if (c->guarded)
        rc = sg_fail(err, SG_ESTATE, "control client for %s already has its orphan guard",
                     c->net.peer);
    else if ((c->guard_message = malloc(strlen(message) + 2)) == NULL)
        rc = sg_fail(err, SG_ENOMEM, "copying the orphan guard's message");
    if (rc == SG_OK) {
        sprintf(c->guard_message, "%s\n", message);
        c->guard_after = after;
        c->guard_status = status;
        int e = pthread_create(&c->guard, NULL, guard_main, c);
        if (e != 0) {
            free(c->guard_message);
            c->guard_message = NULL;
            rc = sg_fail(err, SG_EIO, "starting the orphan guard thread: %s", strerror(e));
        } else {
            c->guarded = 1;
        }
    }
    pthread_mutex_unlock(&c->net.mu);
    return rc;
}

void ctl_client_interrupt(CtlClient *c)
{
    pthread_mutex_lock(&c->net.mu);
    c->interrupted = 1;
    pthread_cond_broadcast(&c->net.cv);
    pthread_mutex_unlock(&c->net.mu);
}

void ctl_client_stop(CtlClient *c)
{
    pthread_mutex_lock(&c->net.mu);
    int was = c->stopped;
    c->stopped = 1;
    pthread_cond_broadcast(&c->net.cv);
    pthread_mutex_unlock(&c->net.mu);
    if (was)
        return;
    net_client_close(&c->net);
}

void ctl_client_free(CtlClient *c)
{
    if (c == NULL)
        return;
    ctl_client_stop(c);
    if (c->guarded) /* it returns on stop */
        pthread_join(c->guard, NULL);
    free(c->guard_message);
    net_client_free(&c->net);
    cJSON_Delete(c->spec);
    free(c->spec_json);
    free(c);
}
