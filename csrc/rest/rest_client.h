/*
 * rest_client.h - calls to a Databricks workspace: host + Authorization, the
 * retry loop inside one time budget, the idempotency rules, and failures as
 * SG_EREST with the HTTP status, error_code, server message, method and path.
 *
 * Retries (rest_client.c has the reasons):
 *   429                          always (the server refused before doing anything)
 *   502, 503, 504, and transfer  only when call->idempotent (safe methods, or a
 *     errors after the request   POST the caller knows to be idempotent or
 *     was sent                   that carries an idempotency token)
 *   connection not established   always (nothing was sent)
 * Waits honour Retry-After, else back off linearly (rest_backoff_s); the last
 * attempt must end within budget_s of the first.
 */
#ifndef REST_CLIENT_H
#define REST_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"
#include "rest/rest_http.h"
#include "rest/rest_reply.h"

typedef struct RestClientConfig {
    const char *host;        /* "https://adb-1.2.azuredatabricks.net", no trailing '/' */
    double timeout_s;        /* per request (default 60) */
    double budget_s;         /* all attempts of one call (default 300) */
    double backoff_s;        /* backoff unit when no Retry-After (default 1) */
    size_t max_response;     /* bytes */
    int allow_http_loopback; /* tests: accept http:// to 127.0.0.1 / localhost / [::1] */
    const char *user_agent;
    RestPool *pool; /* connections kept between idempotent calls, or NULL */
} RestClientConfig;

typedef struct RestCall {
    const char *method;
    const char *path;          /* "/api/2.0/dbfs/put", query included */
    const char *authorization; /* the header value; a secret, never copied into errors */
    const char *content_type;  /* NULL: none */
    const uint8_t *body;       /* NULL: no body */
    size_t body_len;
    int idempotent;
    const RestCancel *cancel; /* NULL: not cancellable */
} RestCall;

typedef struct RestResult {
    long status;
    uint8_t *body; /* NUL-terminated, malloc'd */
    size_t body_len;
    char *headers; /* "Name: value\r\n" lines, malloc'd */
    size_t headers_len;
    int attempts;
    double elapsed_s;
} RestResult;

/* The attempts that were retried, oldest first (the first REST_TRACE_MAX). */
#define REST_TRACE_MAX 16
typedef struct RestTrace {
    int n;
    struct {
        long status;     /* HTTP status, 0 when the transfer failed */
        char reason[96]; /* "HTTP 429" or libcurl's reason; never a header or body */
        double wait_s;   /* the wait before the next attempt */
    } at[REST_TRACE_MAX];
} RestTrace;

/* Details of a failed call, beside err->msg (which says all of it in words). */
typedef struct RestFailure {
    long status; /* HTTP status of the last answer, 0 if none */
    char error_code[REST_ERROR_CODE_MAX];
    char message[REST_MESSAGE_MAX];
    int attempts;
} RestFailure;

/* Checks cfg (scheme https, or http to loopback when allowed; positive
 * timeouts). Returns 0 or SG_EINVAL. */
int rest_config_check(const RestClientConfig *cfg, SgError *err);

/* Performs call with retries. Returns 0 with a 2xx result, or SG_EREST (also
 * when the budget is spent) / SG_ECANCELLED / SG_EINVAL / SG_ENOMEM with fail
 * and err filled.
 * trace (may be NULL) receives the retried attempts either way. Frees nothing
 * of call; the caller frees the result with rest_result_free. */
int rest_client_call(const RestClientConfig *cfg, const RestCall *call, RestResult *res,
                     RestFailure *fail, RestTrace *trace, SgError *err);

void rest_result_free(RestResult *res);

#endif /* REST_CLIENT_H */
