/*
 * rest_http.h - one HTTPS request through libcurl: method, URL, headers, an
 * optional body, a per-request timeout and a cap on the response size. TLS
 * peer and host verification are always on; no redirects are followed. No
 * retries here (rest_client.h does them).
 */
#ifndef REST_HTTP_H
#define REST_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"

/* Asked every 100 ms during a transfer (and a backoff wait): non-zero stops
 * it with SG_ECANCELLED. */
typedef struct RestCancel {
    int (*cancelled)(void *ctx);
    void *ctx;
} RestCancel;

/* The connections, DNS answers and TLS sessions one client keeps between
 * requests (thread-safe). */
typedef struct RestPool RestPool;

int rest_pool_new(RestPool **out, SgError *err);
void rest_pool_free(RestPool *pool);

typedef struct RestRequest {
    const char *method;         /* GET, HEAD, POST, PUT, PATCH, DELETE */
    const char *url;            /* scheme://host[:port]/path?query */
    const char *const *headers; /* n_headers "Name: value" lines */
    size_t n_headers;
    const uint8_t *body; /* body_len bytes, or NULL for none */
    size_t body_len;
    long timeout_ms;          /* whole request, connect included */
    size_t max_response;      /* bytes of body kept at most; more fails the request */
    const RestCancel *cancel; /* NULL: not cancellable */
    RestPool *pool;           /* NULL: a fresh connection */
} RestRequest;

typedef struct RestResponse {
    long status;   /* HTTP status, 0 when no response came */
    int curl_code; /* CURLcode of the transfer, 0 when it completed */
    int sent;      /* 1 when the request may have reached the server */
    int transient; /* 1 when the failure may pass (connection, timeout), 0 if it
                    * will not (certificate, URL, response over the cap) */
    uint8_t *body; /* body_len bytes, NUL-terminated; malloc'd */
    size_t body_len;
    char *headers; /* the final response's "Name: value\r\n" lines; malloc'd */
    size_t headers_len;
} RestResponse;

/* Performs req. Returns 0 with a response (any HTTP status), or SG_EREST when
 * the transfer failed (resp->curl_code says how, resp->sent whether bytes may
 * have reached the server), SG_ECANCELLED or SG_ENOMEM. err never holds headers or bodies.
 * The caller frees resp with rest_response_free in every case. */
int rest_http_perform(const RestRequest *req, RestResponse *resp, SgError *err);

void rest_response_free(RestResponse *resp);

#endif /* REST_HTTP_H */
