/*
 * rest_curl.h - the libcurl functions the REST client calls, resolved once
 * with dlopen/dlsym (libcurl is not linked, see rest_curl.c), and the one
 * checking macro every libcurl result goes through.
 */
#ifndef REST_CURL_H
#define REST_CURL_H

#include <curl/curl.h>

#include "common/sg_status.h"

/* The libcurl ABI the headers describe. */
#define REST_CURL_SONAME "libcurl.so.4"

typedef struct RestCurl {
    CURLcode (*global_init)(long flags);
    curl_version_info_data *(*version_info)(CURLversion age);
    CURL *(*easy_init)(void);
    CURLcode (*easy_setopt)(CURL *h, CURLoption opt, ...);
    CURLcode (*easy_perform)(CURL *h);
    CURLcode (*easy_getinfo)(CURL *h, CURLINFO info, ...);
    void (*easy_cleanup)(CURL *h);
    const char *(*easy_strerror)(CURLcode code);
    struct curl_slist *(*slist_append)(struct curl_slist *list, const char *s);
    void (*slist_free_all)(struct curl_slist *list);
    /* the multi interface: a transfer in 100 ms steps, so that it can be cancelled */
    CURLM *(*multi_init)(void);
    CURLMcode (*multi_add_handle)(CURLM *m, CURL *h);
    CURLMcode (*multi_remove_handle)(CURLM *m, CURL *h);
    CURLMcode (*multi_perform)(CURLM *m, int *running);
    CURLMcode (*multi_wait)(CURLM *m, struct curl_waitfd *fds, unsigned n, int timeout_ms,
                            int *numfds);
    CURLMsg *(*multi_info_read)(CURLM *m, int *left);
    CURLMcode (*multi_cleanup)(CURLM *m);
    const char *(*multi_strerror)(CURLMcode code);
    /* a share: the connections (and TLS sessions) of one client, reused across calls */
    CURLSH *(*share_init)(void);
    CURLSHcode (*share_setopt)(CURLSH *sh, CURLSHoption opt, ...);
    CURLSHcode (*share_cleanup)(CURLSH *sh);
} RestCurl;

/* The table, loaded (and curl_global_init run) on the first call from any
 * thread. Fails with SG_EREST naming libcurl.so.4 and how to install it. */
int rest_curl_load(const RestCurl **out, SgError *err);

/* Records a failed libcurl call: "<call> failed: <curl's reason> (CURLcode n)". */
int rest_curl_fail(const RestCurl *lib, CURLcode code, const char *call, SgError *err);

/* REST_CURL_CHECK(lib, call, err): evaluates call once; 0 on CURLE_OK, else
 * SG_EREST with err naming the call's source text. */
/* As rest_curl_fail, for a failed curl_multi_* call. */
int rest_curl_multi_fail(const RestCurl *lib, CURLMcode code, const char *call, SgError *err);

#define REST_CURL_CHECK(lib, call, err) rest_curl_check_code((lib), (call), #call, (err))

static inline int rest_curl_check_code(const RestCurl *lib, CURLcode code, const char *call,
                                       SgError *err)
{
    return code == CURLE_OK ? 0 : rest_curl_fail(lib, code, call, err);
}

/* REST_CURLM_CHECK(lib, call, err): the same for curl_multi_* results. */
#define REST_CURLM_CHECK(lib, call, err) rest_curlm_check_code((lib), (call), #call, (err))

static inline int rest_curlm_check_code(const RestCurl *lib, CURLMcode code, const char *call,
                                        SgError *err)
{
    return code == CURLM_OK ? 0 : rest_curl_multi_fail(lib, code, call, err);
}

#endif /* REST_CURL_H */
