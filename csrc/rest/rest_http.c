/*
 * rest_http.c - one request on a fresh libcurl easy handle (rest_http.h).
 *
 * The CA bundle is SSL_CERT_FILE or CURL_CA_BUNDLE when set, else the first
 * standard bundle that exists (a libcurl built elsewhere may look for one at
 * a path Ubuntu does not have: curl error 77), else libcurl's default.
 * The transfer runs on the multi interface in 100 ms steps so that a caller
 * can cancel it (Ctrl-C in Python); a RestPool keeps one client's connections
 * open between requests. Deliberately not here: proxies beyond what libcurl
 * reads from the environment, HTTP/2 tuning.
 */
#include "rest/rest_http.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rest/rest_curl.h"

#define REST_HEADERS_MAX (64u << 10)

/* ---- the pool: a libcurl share with one mutex per kind of data ------------------ */

struct RestPool {
    const RestCurl *lib;
    CURLSH *share;
    pthread_mutex_t locks[CURL_LOCK_DATA_LAST];
};

static void pool_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *user)
{
    (void)h, (void)access;
    pthread_mutex_lock(&((RestPool *)user)->locks[data]);
}

static void pool_unlock(CURL *h, curl_lock_data data, void *user)
{
    (void)h;
    pthread_mutex_unlock(&((RestPool *)user)->locks[data]);
}

int rest_pool_new(RestPool **out, SgError *err)
{
    const RestCurl *lib;
    int st = rest_curl_load(&lib, err);
    if (st < 0)
        return st;
    RestPool *p = calloc(1, sizeof *p);
    if (p == NULL || (p->share = lib->share_init()) == NULL) {
        free(p);
        return sg_fail(err, SG_ENOMEM, "curl_share_init failed");
    }
    p->lib = lib;
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_init(&p->locks[i], NULL);
    /* the connection cache needs libcurl 7.57; older ones refuse it, and the pool
     * then shares DNS and TLS sessions only */
    lib->share_setopt(p->share, CURLSHOPT_LOCKFUNC, pool_lock);
    lib->share_setopt(p->share, CURLSHOPT_UNLOCKFUNC, pool_unlock);
    lib->share_setopt(p->share, CURLSHOPT_USERDATA, p);
    lib->share_setopt(p->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    lib->share_setopt(p->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    lib->share_setopt(p->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
    *out = p;
    return SG_OK;
}

void rest_pool_free(RestPool *pool)
{
    if (pool == NULL)
        return;
    pool->lib->share_cleanup(pool->share);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_destroy(&pool->locks[i]);
    free(pool);
}

/* ---- one request ------------------------------------------------------------------ */

typedef struct Sink {
    uint8_t *buf;
    size_t len, cap, max;
    int overflow;
} Sink;

static int sink_append(Sink *s, const void *data, size_t n)
{
    if (n > s->max - s->len) {
        s->overflow = 1;
        return -1;
    }
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->len + n + 1)
            cap *= 2;
        uint8_t *p = realloc(s->buf, cap);
        if (p == NULL)
            return -1;
        s->buf = p, s->cap = cap;
    }
    memcpy(s->buf + s->len, data, n);
    s->len += n;
    s->buf[s->len] = '\0';
    return 0;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *user)
{
    return sink_append(user, data, size * nmemb) == 0 ? size * nmemb : 0;
}

/* Keeps the header lines of the last response only (after a 100 Continue or
 * an interim status line, a new "HTTP/" line starts over). */
static size_t on_header(char *data, size_t size, size_t nmemb, void *user)
{
    Sink *s = user;
    size_t n = size * nmemb;
    if (n >= 5 && memcmp(data, "HTTP/", 5) == 0) {
        s->len = 0;
        return n;
    }
    if (n <= 2) /* the blank line ending the block */
        return n;
    return sink_append(s, data, n) == 0 ? n : 0;
}

static const char *ca_bundle(void)
{
    static const char *const standard[] = {
        "/etc/ssl/certs/ca-certificates.crt", /* Debian, Ubuntu */
        "/etc/pki/tls/certs/ca-bundle.crt",   /* RHEL, Fedora */
        "/etc/ssl/ca-bundle.pem",             /* SUSE */
        "/etc/ssl/cert.pem",                  /* Alpine, macOS */
    };
    const char *env = getenv("SSL_CERT_FILE");
    if (env == NULL || *env == '\0')
        env = getenv("CURL_CA_BUNDLE");
    if (env != NULL && *env != '\0')
        return env;
    for (size_t i = 0; i < sizeof standard / sizeof *standard; i++)
        if (access(standard[i], R_OK) == 0)
            return standard[i];
    return NULL;
}

/* Whether a failed transfer may succeed when tried again. */
static int transient_failure(int code)
{
    switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR: /* a handshake cut short, not a refused certificate */
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
        return 1;
    default:
        return 0;
    }
}

/* Whether a failed transfer may have delivered (part of) the request. */
static int maybe_sent(int code)
{
    switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_URL_MALFORMAT:
        return 0;
    default:
        return 1;
    }
}

/* Runs the transfer of h in steps of at most 100 ms, asking cancel between
 * them; *rc is the transfer's result. Returns 0, SG_ECANCELLED or SG_EREST
 * (the multi interface itself failed). */
static int transfer(const RestCurl *lib, CURL *h, const RestCancel *cancel, CURLcode *rc,
                    SgError *err)
{
    CURLM *m = lib->multi_init();
    if (m == NULL)
        return sg_fail(err, SG_ENOMEM, "curl_multi_init failed");
    int st = REST_CURLM_CHECK(lib, lib->multi_add_handle(m, h), err);
    int running = st == 0;
    *rc = CURLE_OK;
    while (st == 0 && running) {
        if ((st = REST_CURLM_CHECK(lib, lib->multi_perform(m, &running), err)) < 0 || !running)
            break;
        if (cancel != NULL && cancel->cancelled(cancel->ctx)) {
            st = sg_fail(err, SG_ECANCELLED, "the request was cancelled");
            break;
        }
        st = REST_CURLM_CHECK(lib, lib->multi_wait(m, NULL, 0, 100, NULL), err);
    }
    CURLMsg *msg;
    int left;
    while (st == 0 && (msg = lib->multi_info_read(m, &left)) != NULL)
        if (msg->msg == CURLMSG_DONE && msg->easy_handle == h)
            *rc = msg->data.result;
    lib->multi_remove_handle(m, h);
    lib->multi_cleanup(m);
    return st;
}

#define SETOPT(opt, val)                                                                           \
    if ((st = REST_CURL_CHECK(lib, lib->easy_setopt(h, opt, val), err)) < 0)                       \
    goto cleanup

int rest_http_perform(const RestRequest *req, RestResponse *resp, SgError *err)
{
    memset(resp, 0, sizeof *resp);
    const RestCurl *lib;
    int st = rest_curl_load(&lib, err);
    if (st < 0)
        return st;
    Sink body = {.max = req->max_response}, hdrs = {.max = REST_HEADERS_MAX};
    struct curl_slist *list = NULL;
    CURL *h = lib->easy_init();
    if (h == NULL) {
        st = sg_fail(err, SG_ENOMEM, "curl_easy_init failed");
        goto cleanup;
    }
    /* "Expect:" turns off 100-continue; libcurl would otherwise wait for it. */
    list = lib->slist_append(NULL, "Expect:");
    for (size_t i = 0; list != NULL && i < req->n_headers; i++)
        list = lib->slist_append(list, req->headers[i]);
    if (list == NULL) {
        st = sg_fail(err, SG_ENOMEM, "curl_slist_append failed");
        goto cleanup;
    }
    const char *ca = ca_bundle();
    SETOPT(CURLOPT_URL, req->url);
    SETOPT(CURLOPT_CUSTOMREQUEST, req->method);
    SETOPT(CURLOPT_HTTPHEADER, list);
    SETOPT(CURLOPT_NOSIGNAL, 1L);
    SETOPT(CURLOPT_SSL_VERIFYPEER, 1L);
    SETOPT(CURLOPT_SSL_VERIFYHOST, 2L);
    SETOPT(CURLOPT_FOLLOWLOCATION, 0L);
    SETOPT(CURLOPT_TIMEOUT_MS, req->timeout_ms);
    SETOPT(CURLOPT_CONNECTTIMEOUT_MS, req->timeout_ms);
    SETOPT(CURLOPT_WRITEFUNCTION, on_body);
    SETOPT(CURLOPT_WRITEDATA, &body);
    SETOPT(CURLOPT_HEADERFUNCTION, on_header);
    SETOPT(CURLOPT_HEADERDATA, &hdrs);
    if (ca != NULL)
        SETOPT(CURLOPT_CAINFO, ca);
    if (req->pool != NULL)
        SETOPT(CURLOPT_SHARE, req->pool->share);
    if (strcmp(req->method, "HEAD") == 0)
        SETOPT(CURLOPT_NOBODY, 1L);
    if (req->body != NULL) {
        SETOPT(CURLOPT_POSTFIELDS, (const char *)req->body);
        SETOPT(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
    }
    CURLcode rc = CURLE_OK;
    if ((st = transfer(lib, h, req->cancel, &rc, err)) < 0) {
        resp->sent = 1;
        goto cleanup;
    }
    if (rc != CURLE_OK) {
        resp->curl_code = (int)rc;
        resp->sent = maybe_sent(rc);
        resp->transient = !body.overflow && transient_failure(rc);
        if (body.overflow)
            st = sg_fail(err, SG_EREST, "the response is larger than the %zu-byte cap",
                         req->max_response);
        else
            st = rest_curl_fail(lib, rc, "curl_easy_perform", err);
        goto cleanup;
    }
    if ((st = REST_CURL_CHECK(lib, lib->easy_getinfo(h, CURLINFO_RESPONSE_CODE, &resp->status),
                              err)) < 0)
        goto cleanup;
    resp->sent = 1;
    if (sink_append(&body, "", 0) < 0 || sink_append(&hdrs, "", 0) < 0) {
        st = sg_fail(err, SG_ENOMEM, "allocating the response");
        goto cleanup;
    }
    resp->body = body.buf, resp->body_len = body.len;
    resp->headers = (char *)hdrs.buf, resp->headers_len = hdrs.len;
    body.buf = hdrs.buf = NULL;
cleanup:
    free(body.buf);
    free(hdrs.buf);
    if (list != NULL)
        lib->slist_free_all(list);
    if (h != NULL)
        lib->easy_cleanup(h);
    return st;
}

void rest_response_free(RestResponse *resp)
{
    free(resp->body);
    free(resp->headers);
    resp->body = NULL;
    resp->headers = NULL;
}
