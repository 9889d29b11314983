/*
 * rendezvous_registry.c - what the rendezvous server does with messages:
 * registration (re-registration replaces), the cluster spec, the event queue
 * and the thread-safe API waits of rendezvous.h.
 *
 * Functions named rdv_* without "server" run on the I/O thread with s->mu
 * held; rdv_server_* are the API and take s->mu themselves. Nothing here
 * touches a socket or calls into rendezvous_server.c: what goes out to the
 * nodes (the registration's ack, the spec) the server queues from the
 * result of rdv_handle_message.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/json_msg.h"
#include "net/rendezvous_internal.h"

/* ---- events --------------------------------------------------------------- */

#define RDV_MAX_EVENTS 65536 /* queued events before log/metric are dropped */

static void push_event(RdvServer *s, cJSON *ev, int droppable)
{
    char *text = ev != NULL ? net_json_print(ev) : NULL;
    cJSON_Delete(ev);
    if (text != NULL && droppable && s->events.len >= RDV_MAX_EVENTS)
        free(text), text = NULL;
    if (text == NULL ||
        net_msgq_push(&s->events, 0, (uint8_t *)text, (uint32_t)strlen(text)) < 0) /* frees it */
        s->stats.events_dropped++;
    pthread_cond_broadcast(&s->cv);
}

/* {"type", "executor_id", "role", "index"} of the node behind c. */
static cJSON *event_base(RdvServer *s, long executor_id, const char *type)
{
    const cJSON *info = s->nodes[executor_id].info;
    cJSON *ev = cJSON_CreateObject();
    if (ev == NULL)
        return NULL;
    cJSON_AddStringToObject(ev, "type", type);
    cJSON_AddNumberToObject(ev, "executor_id", (double)executor_id);
    cJSON_AddItemToObject(ev, "role", cJSON_Duplicate(cJSON_GetObjectItem(info, "role"), 1));
    cJSON_AddItemToObject(ev, "index", cJSON_Duplicate(cJSON_GetObjectItem(info, "index"), 1));
    return ev;
}

void rdv_node_disconnected(RdvServer *s, RdvConn *c, const char *reason)
{
    long eid = c->executor_id;
    c->executor_id = -1;
    RdvNode *node = &s->nodes[eid];
    if (node->conn != c)
        return; /* already replaced by a re-registration */
    node->conn = NULL;
    if (!c->finished) {
        cJSON *ev = event_base(s, eid, "lost");
        if (ev != NULL) {
            cJSON_AddItemToObject(ev, "host",
                                  cJSON_Duplicate(cJSON_GetObjectItem(node->info, "host"), 1));
            cJSON_AddStringToObject(ev, "reason", reason);
        }
        push_event(s, ev, 0);
    }
    if (s->spec_json == NULL) {
        /* Not yet part of a spec: forget it so a retried task can take its place. */
        cJSON_Delete(node->info);
        node->info = NULL;
        s->registered--;
    }
}

/* ---- registration and the spec ------------------------------------------- */

static int build_spec(RdvServer *s, SgError *err)
{
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; arr != NULL && i < s->num_nodes; i++)
        cJSON_AddItemToArray(arr, cJSON_Duplicate(s->nodes[i].info, 1));
    char *text = arr != NULL ? net_json_print(arr) : NULL;
    cJSON_Delete(arr);
    if (text == NULL)
        return sg_fail(err, SG_ENOMEM, "building the cluster spec");
    free(s->spec_json);
    s->spec_json = text;
    pthread_cond_broadcast(&s->cv);
    return SG_OK;
}

static int handle_register(RdvServer *s, RdvConn *c, const cJSON *msg, SgError *err)
{
    const cJSON *node = cJSON_GetObjectItemCaseSensitive(msg, "node");
    const char *host, *role;
    long port, index, eid, pid;
    if (!cJSON_IsObject(node))
        return sg_fail(err, SG_EPROTO, "register message from %s has no \"node\" object", c->peer);
    int rc;
    if ((rc = net_json_string(node, "host", c->peer, &host, err)) < 0 ||
        (rc = net_json_string(node, "role", c->peer, &role, err)) < 0 ||
        (rc = net_json_int(node, "port", 0, 65535, c->peer, &port, err)) < 0 ||
        (rc = net_json_int(node, "index", 0, INT_MAX, c->peer, &index, err)) < 0 ||
        (rc = net_json_int(node, "pid", 0, INT_MAX, c->peer, &pid, err)) < 0 ||
        (rc = net_json_int(node, "executor_id", LONG_MIN, LONG_MAX, c->peer, &eid, err)) < 0)
        return rc;
    /* Optional: a second listening port (the allreduce communicator's), 0 or absent when none. */
    long comm_port = 0;
    if (cJSON_GetObjectItemCaseSensitive(node, "comm_port") != NULL &&
        (rc = net_json_int(node, "comm_port", 0, 65535, c->peer, &comm_port, err)) < 0)
        return rc;
    /* Optional: Spark's executor id and host of the task that runs the node, as Spark names them
     * ("2", "driver"; the executor's host), so failures can name what Spark's own log names. */
    const char *spark_fields[] = {"spark_executor", "spark_host"};
    const char *spark_values[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        if (cJSON_GetObjectItemCaseSensitive(node, spark_fields[i]) == NULL)
            continue;
        if ((rc = net_json_string(node, spark_fields[i], c->peer, &spark_values[i], err)) < 0)
            return rc;
        if (strlen(spark_values[i]) > RDV_SPARK_FIELD_MAX)
            return sg_fail(err, SG_EPROTO,
                           "register message from %s: \"%s\" is longer than %d bytes", c->peer,
                           spark_fields[i], RDV_SPARK_FIELD_MAX);
    }
    if (eid < 0 || eid >= s->num_nodes)
        return sg_fail(err, SG_ECLUSTER,
                       "executor_id %ld from %s is outside 0..%d (this cluster has %d nodes)", eid,
                       c->peer, s->num_nodes - 1, s->num_nodes);
    if (c->executor_id >= 0)
        return sg_fail(err, SG_EPROTO, "%s registered twice on one connection", c->peer);
    cJSON *info = cJSON_CreateObject();
    if (info == NULL)
        return sg_fail(err, SG_ENOMEM, "registering %s", c->peer);
    cJSON_AddStringToObject(info, "host", host);
    cJSON_AddNumberToObject(info, "port", (double)port);
    cJSON_AddStringToObject(info, "role", role);
    cJSON_AddNumberToObject(info, "index", (double)index);
    cJSON_AddNumberToObject(info, "executor_id", (double)eid);
    cJSON_AddNumberToObject(info, "pid", (double)pid);
    if (comm_port > 0)
        cJSON_AddNumberToObject(info, "comm_port", (double)comm_port);
    for (int i = 0; i < 2; i++)
        if (spark_values[i] != NULL)
            cJSON_AddStringToObject(info, spark_fields[i], spark_values[i]);
    RdvNode *n = &s->nodes[eid];
    if (n->conn != NULL && n->conn != c) {
        /* A retried task: the newer registration wins, the old link goes quietly (the loop
         * frees it). */
        n->conn->executor_id = -1;
        n->conn->dead = 1;
    }
    if (n->info == NULL)
        s->registered++;
    cJSON_Delete(n->info);
    n->info = info;
    n->conn = c;
    c->executor_id = eid;
    s->stats.registrations++;
    if (s->registered < s->num_nodes)
        return RDV_REGISTERED;
    int first = s->spec_json == NULL;
    if ((rc = build_spec(s, err)) < 0)
        return rc;
    return first ? RDV_SPEC_FIRST : RDV_REGISTERED;
}

int rdv_handle_message(RdvServer *s, RdvConn *c, const cJSON *msg, const char *type, SgError *err)
{
    if (strcmp(type, "register") == 0)
        return handle_register(s, c, msg, err);
    if (c->executor_id < 0)
        return sg_fail(err, SG_EPROTO, "%s sent a '%s' message before registering", c->peer, type);
    const char *a, *b;
    double v;
    long step;
    int rc;
    cJSON *ev = NULL;
    if (strcmp(type, "log") == 0) {
        if ((rc = net_json_string(msg, "line", c->peer, &a, err)) < 0)
            return rc;
        const cJSON *stream = cJSON_GetObjectItemCaseSensitive(msg, "stream");
        if ((ev = event_base(s, c->executor_id, type)) != NULL) {
            cJSON_AddStringToObject(ev, "line", a);
            if (cJSON_IsString(stream) && strlen(stream->valuestring) <= 16)
                cJSON_AddStringToObject(ev, "stream", stream->valuestring);
        }
        push_event(s, ev, 1);
    } else if (strcmp(type, "metric") == 0) {
        if ((rc = net_json_string(msg, "name", c->peer, &a, err)) < 0 ||
            (rc = net_json_number(msg, "value", c->peer, &v, err)) < 0 ||
            (rc = net_json_int(msg, "step", LONG_MIN, LONG_MAX, c->peer, &step, err)) < 0)
            return rc;
        if ((ev = event_base(s, c->executor_id, type)) != NULL) {
            cJSON_AddStringToObject(ev, "name", a);
            cJSON_AddNumberToObject(ev, "value", v);
            cJSON_AddNumberToObject(ev, "step", (double)step);
        }
        push_event(s, ev, 1);
    } else if (strcmp(type, "done") == 0) {
        if ((rc = net_json_string(msg, "result", c->peer, &a, err)) < 0)
            return rc;
        if ((ev = event_base(s, c->executor_id, type)) != NULL)
            cJSON_AddStringToObject(ev, "result", a);
        c->finished = 1;
        push_event(s, ev, 0);
    } else if (strcmp(type, "error") == 0) {
        if ((rc = net_json_string(msg, "message", c->peer, &a, err)) < 0 ||
            (rc = net_json_string(msg, "traceback", c->peer, &b, err)) < 0)
            return rc;
        const cJSON *host = cJSON_GetObjectItemCaseSensitive(msg, "host");
        if (!cJSON_IsString(host) || host->valuestring[0] == '\0')
            host = cJSON_GetObjectItem(s->nodes[c->executor_id].info, "host");
        if ((ev = event_base(s, c->executor_id, type)) != NULL) {
            cJSON_AddItemToObject(ev, "host", cJSON_Duplicate(host, 1));
            cJSON_AddStringToObject(ev, "message", a);
            cJSON_AddStringToObject(ev, "traceback", b);
        }
        c->finished = 1;
        push_event(s, ev, 0);
    } else {
        return sg_fail(err, SG_EPROTO, "%s sent an unknown control message type '%.64s'", c->peer,
                       type);
    }
    return SG_OK;
}

void rdv_registry_free(RdvServer *s)
{
    for (int i = 0; i < s->num_nodes; i++)
        cJSON_Delete(s->nodes[i].info);
    free(s->nodes);
    free(s->spec_json);
    net_msgq_free(&s->events);
}

/* ---- API ------------------------------------------------------------------ */

int rdv_closed_error(RdvServer *s, SgError *err)
{
    if (s->loop_err.code != 0)
        return sg_fail(err, s->loop_err.code, "%s", s->loop_err.msg);
    return sg_fail(err, SG_ESTATE, "rendezvous server on port %d is closed", s->port);
}

/* "0, 1, 5" (at most 64 ids, then "..."). */
static void format_ids(const RdvServer *s, int present, char *out, size_t len)
{
    size_t used = 0;
    int shown = 0;
    out[0] = '\0';
    for (int i = 0; i < s->num_nodes && used + 16 < len; i++) {
        if ((s->nodes[i].info != NULL) != present)
            continue;
        if (shown == 64) {
            used += (size_t)snprintf(out + used, len - used, ", ...");
            break;
        }
        used += (size_t)snprintf(out + used, len - used, "%s%d", shown ? ", " : "", i);
        shown++;
    }
}

int rdv_server_wait(RdvServer *s, double timeout, char **spec_json, SgError *err)
{
    double deadline;
    int rc = sg_deadline(timeout, "RendezvousServer.wait", &deadline, err);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&s->mu);
    while (s->spec_json == NULL && !s->stopped && !s->loop_done &&
           sg_cond_wait(&s->cv, &s->mu, deadline) != ETIMEDOUT)
        ;
    if (s->spec_json != NULL) {
        *spec_json = strdup(s->spec_json);
        rc = *spec_json != NULL ? SG_OK : sg_fail(err, SG_ENOMEM, "copying the cluster spec");
    } else if (s->stopped || s->loop_done) {
        rc = rdv_closed_error(s, err);
    } else {
        char have[400], missing[400];
        format_ids(s, 1, have, sizeof have);
        format_ids(s, 0, missing, sizeof missing);
        rc = sg_fail(err, SG_ERDV_TIMEOUT,
                     "rendezvous timed out after %.1f s on port %d: %d of %d nodes registered "
                     "(executor ids [%s]); missing executor ids [%s]. Usual causes: fewer free "
                     "Spark task slots than nodes (check executor cores and spark.task.cpus), "
                     "node tasks that failed before registering (see the executor logs), or "
                     "executors that cannot reach the driver's port",
                     timeout, s->port, s->registered, s->num_nodes, have, missing);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int rdv_server_next_event(RdvServer *s, double timeout, char **event_json, SgError *err)
{
    double deadline;
    int rc = sg_deadline(timeout, "RendezvousServer.next_event", &deadline, err);
    if (rc < 0)
        return rc;
    *event_json = NULL;
    pthread_mutex_lock(&s->mu);
    while (s->events.head == NULL && !s->stopped && !s->loop_done &&
           sg_cond_wait(&s->cv, &s->mu, deadline) != ETIMEDOUT)
        ;
    NetMsg *m = net_msgq_take(&s->events, -1);
    if (m != NULL) {
        *event_json = (char *)m->payload;
        free(m);
    } else if (s->stopped || s->loop_done) {
        rc = rdv_closed_error(s, err);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void rdv_server_stats(RdvServer *s, RdvStats *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    out->registered = s->registered;
    pthread_mutex_unlock(&s->mu);
}

int rdv_server_port(const RdvServer *s)
{
    return s->port;
}

const char *rdv_server_host(const RdvServer *s)
{
    return s->host;
}
