/*
 * rest_client.c - the retry loop of rest_client.h around rest_http_perform.
 *
 * Why 429 is always retried and 503 only for idempotent calls: Databricks'
 * rate limiter answers 429 before the request reaches its handler, while a
 * 503 (or a connection dropped after the body left) may come after the
 * handler ran, and running jobs/create or runs/submit twice makes two jobs.
 * The caller says which calls are idempotent (rest_client.h).
 * Messages carry method and path, never the Authorization value, the body
 * or the query's values beyond the path (the path is ours, not a secret).
 */
#include "rest/rest_client.h"

#include "common/sg_clock.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* Sleeps s seconds in slices of 100 ms, asking cancel after each; returns 1
 * when cancelled. */
static int sleep_s(double s, const RestCancel *cancel)
{
    double end = sg_now() + s;
    for (double left = s; left > 0; left = end - sg_now()) {
        double slice = left < 0.1 ? left : 0.1;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)(slice * 1e9)};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
            ;
        if (cancel != NULL && cancel->cancelled(cancel->ctx))
            return 1;
    }
    return 0;
}

static int is_loopback_http(const char *host)
{
    static const char *const prefixes[] = {"http://127.0.0.1", "http://localhost", "http://[::1]"};
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++) {
        size_t n = strlen(prefixes[i]);
        if (strncasecmp(host, prefixes[i], n) == 0 && (host[n] == '\0' || host[n] == ':'))
            return 1;
    }
    return 0;
}

int rest_config_check(const RestClientConfig *cfg, SgError *err)
{
    const char *host = cfg->host;
    if (host == NULL || *host == '\0')
        return sg_fail(err, SG_EINVAL, "the Databricks host is empty");
    size_t n = strlen(host);
    if (host[n - 1] == '/')
        return sg_fail(err, SG_EINVAL, "the host '%s' must not end with '/'", host);
    if (strncasecmp(host, "http://", 7) == 0) {
        if (!cfg->allow_http_loopback || !is_loopback_http(host))
            return sg_fail(err, SG_EINVAL,
                           "refusing plain http:// for '%s': the token would travel unencrypted; "
                           "use https:// (http is accepted only for a loopback test server)",
                           host);
    } else if (strncasecmp(host, "https://", 8) != 0) {
        return sg_fail(err, SG_EINVAL, "the host '%s' must start with https://", host);
    }
    if (!(cfg->timeout_s > 0) || !(cfg->budget_s > 0) || !(cfg->backoff_s >= 0))
        return sg_fail(err, SG_EINVAL,
                       "timeout (%g s) and budget (%g s) must be > 0 and backoff (%g s) >= 0",
                       cfg->timeout_s, cfg->budget_s, cfg->backoff_s);
    return SG_OK;
}

/* What to do after one attempt: 0 done (2xx), 1 retry, -1 fail now. */
static int classify(const RestCall *call, int st, const RestResponse *r)
{
    if (st == SG_ENOMEM || st == SG_ECANCELLED)
        return -1;
    if (st < 0) /* transfer failed */
        return r->transient && (!r->sent || call->idempotent) ? 1 : -1;
    if (r->status >= 200 && r->status < 300)
        return 0;
    if (r->status == 429)
        return 1;
    if (r->status == 503 || r->status == 502 || r->status == 504)
        return call->idempotent ? 1 : -1;
    return -1;
}

/* The final failure message: "<METHOD> <path>: HTTP 404 RESOURCE_DOES_NOT_EXIST:
 * <message> (after n attempts)". 401/403 also say what was refused. */
static int http_failure(const RestCall *call, const RestResponse *r, RestFailure *fail,
                        SgError *err)
{
    rest_parse_error(r->body, r->body_len, fail->error_code, fail->message);
    const char *space = call->authorization ? strchr(call->authorization, ' ') : NULL;
    rest_redact(fail->message, call->authorization);
    rest_redact(fail->message, space != NULL ? space + 1 : NULL);
    const char *hint = r->status == 401 || r->status == 403
                           ? " (the workspace refused the credentials: check the token or the "
                             "OAuth client, and its permissions)"
                           : "";
    return sg_fail(err, SG_EREST, "%s %s: HTTP %ld%s%s: %s%s (after %d attempt%s)", call->method,
                   call->path, r->status, fail->error_code[0] ? " " : "", fail->error_code,
                   fail->message[0] ? fail->message : "(no message)", hint, fail->attempts,
                   fail->attempts == 1 ? "" : "s");
}

static void trace_attempt(RestTrace *trace, int st, const RestResponse *r, const SgError *err,
                          double wait)
{
    if (trace == NULL || trace->n >= REST_TRACE_MAX)
        return;
    int i = trace->n++;
    trace->at[i].status = r->status;
    trace->at[i].wait_s = wait;
    if (st == SG_OK)
        snprintf(trace->at[i].reason, sizeof trace->at[i].reason, "HTTP %ld", r->status);
    else
        snprintf(trace->at[i].reason, sizeof trace->at[i].reason, "%.95s", err->msg);
}

/* The URL and header lines of one call, built once for all its attempts. */
typedef struct CallLines {
    char url[4096], agent[128], auth[2048], ctype[256];
    const char *headers[3];
    size_t n_headers;
} CallLines;

static int call_lines(const RestClientConfig *cfg, const RestCall *call, CallLines *l, SgError *err)
{
    if ((size_t)snprintf(l->url, sizeof l->url, "%s%s", cfg->host, call->path) >= sizeof l->url)
        return sg_fail(err, SG_EINVAL, "%s %.200s...: URL longer than %zu bytes", call->method,
                       call->path, sizeof l->url);
    l->n_headers = 0;
    snprintf(l->agent, sizeof l->agent, "User-Agent: %s",
             cfg->user_agent ? cfg->user_agent : "sparkgrad");
    l->headers[l->n_headers++] = l->agent;
    if (call->authorization != NULL) {
        if ((size_t)snprintf(l->auth, sizeof l->auth, "Authorization: %s", call->authorization) >=
            sizeof l->auth)
            return sg_fail(err, SG_EINVAL, "%s %s: the Authorization value is too long",
                           call->method, call->path);
        l->headers[l->n_headers++] = l->auth;
    }
    if (call->content_type != NULL) {
        snprintf(l->ctype, sizeof l->ctype, "Content-Type: %s", call->content_type);
        l->headers[l->n_headers++] = l->ctype;
    }
    return SG_OK;
}

/* The final error of a call that will not be tried again; st is the last
 * attempt's status, spent whether the budget ran out. */
static int give_up(const RestClientConfig *cfg, const RestCall *call, const RestResponse *r, int st,
                   int spent, double elapsed, RestFailure *fail, SgError *err)
{
    if (st == SG_ENOMEM || st == SG_ECANCELLED)
        return st == SG_ECANCELLED ? sg_context(err, "%s %s: ", call->method, call->path) : st;
    if (st == SG_OK) {
        st = http_failure(call, r, fail, err);
    } else {
        sg_context(err, "%s %s: ", call->method, call->path);
        size_t used = strlen(err->msg);
        snprintf(err->msg + used, sizeof err->msg - used, " (after %d attempt%s)", fail->attempts,
                 fail->attempts == 1 ? "" : "s");
    }
    size_t used = strlen(err->msg);
    if (spent)
        snprintf(err->msg + used, sizeof err->msg - used,
                 "; gave up after %.1f s (retry budget %g s)", elapsed, cfg->budget_s);
    else if (r->transient && r->sent && !call->idempotent)
        snprintf(err->msg + used, sizeof err->msg - used,
                 "; not retried: the request may have reached the server and the call is not "
                 "idempotent");
    return st;
}

int rest_client_call(const RestClientConfig *cfg, const RestCall *call, RestResult *res,
                     RestFailure *fail, RestTrace *trace, SgError *err)
{
    memset(res, 0, sizeof *res);
    memset(fail, 0, sizeof *fail);
    if (trace != NULL)
        trace->n = 0;
    CallLines lines;
    int st = rest_config_check(cfg, err);
    if (st < 0 || (st = call_lines(cfg, call, &lines, err)) < 0)
        return st;
    double start = sg_now(), deadline = start + cfg->budget_s;
    unsigned seed = (unsigned)(start * 1e6);
    for (;;) {
        double left = deadline - sg_now();
        long timeout_ms = (long)(1000 * (left < cfg->timeout_s ? left : cfg->timeout_s));
        RestRequest req = {.method = call->method,
                           .url = lines.url,
                           .headers = lines.headers,
                           .n_headers = lines.n_headers,
                           .body = call->body,
                           .body_len = call->body_len,
                           .timeout_ms = timeout_ms > 1 ? timeout_ms : 1,
                           .max_response = cfg->max_response,
                           .cancel = call->cancel,
                           /* libcurl silently resends a request whose reused
                            * connection died: only for calls safe to repeat */
                           .pool = call->idempotent ? cfg->pool : NULL};
        RestResponse r;
        st = rest_http_perform(&req, &r, err);
        fail->attempts++;
        fail->status = r.status;
        int next = classify(call, st, &r);
        if (next == 0) {
            *res = (RestResult){.status = r.status,
                                .body = r.body,
                                .body_len = r.body_len,
                                .headers = r.headers,
                                .headers_len = r.headers_len,
                                .attempts = fail->attempts,
                                .elapsed_s = sg_now() - start};
            return SG_OK;
        }
        size_t ra_len = 0;
        const char *ra =
            r.headers ? rest_header_value(r.headers, r.headers_len, "Retry-After", &ra_len) : NULL;
        double wait =
            rest_backoff_s(fail->attempts, cfg->backoff_s, rest_parse_retry_after(ra, ra_len),
                           (double)rand_r(&seed) / ((double)RAND_MAX + 1));
        int spent = next == 1 && sg_now() + wait >= deadline;
        if (next < 0 || spent) {
            st = give_up(cfg, call, &r, st, spent, sg_now() - start, fail, err);
            rest_response_free(&r);
            return st;
        }
        trace_attempt(trace, st, &r, err, wait);
        rest_response_free(&r);
        if (sleep_s(wait, call->cancel))
            return sg_fail(err, SG_ECANCELLED, "%s %s: cancelled while waiting to retry",
                           call->method, call->path);
    }
}

void rest_result_free(RestResult *res)
{
    free(res->body);
    free(res->headers);
    res->body = NULL;
    res->headers = NULL;
}
