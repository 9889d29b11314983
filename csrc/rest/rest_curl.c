/*
 * rest_curl.c - opens libcurl.so.4 with dlopen on first use and resolves the
 * functions of RestCurl with dlsym, once per process.
 *
 * libcurl is not a link-time dependency of the extension: its dependency tree
 * (about 30 libraries: TLS, Kerberos, LDAP, SSH, IDN) took 8 ms of every
 * `import sparkgrad`, which each Spark task pays before its node registers,
 * and a wheel would have to vendor it (with a CA-bundle path that does not
 * exist on Ubuntu). Only the REST side calls into it. The handle stays open.
 */
#include "rest/rest_curl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static RestCurl curl_table;
static int curl_loaded;
static char curl_load_error[512];

#define REST_CURL_SYM(field, name)                                                                 \
    do {                                                                                           \
        *(void **)&curl_table.field = dlsym(lib, name);                                            \
        if (curl_table.field == NULL) {                                                            \
            snprintf(curl_load_error, sizeof curl_load_error,                                      \
                     REST_CURL_SONAME " has no symbol %s: it is older than libcurl 7.17", name);   \
            return;                                                                                \
        }                                                                                          \
    } while (0)

static void load_curl(void)
{
    /* SPARKGRAD_LIBCURL names another libcurl (a path or a soname) */
    const char *name = getenv("SPARKGRAD_LIBCURL");
    if (name == NULL || *name == '\0')
        name = REST_CURL_SONAME;
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *why = dlerror();
        snprintf(curl_load_error, sizeof curl_load_error,
                 "the Databricks REST client needs " REST_CURL_SONAME
                 ", which could not be loaded (%s); install it: apt-get install libcurl4 "
                 "(Debian, Ubuntu), dnf install libcurl (RHEL, Fedora), or point "
                 "SPARKGRAD_LIBCURL at a libcurl.so.4",
                 why != NULL ? why : "dlopen failed");
        return;
    }
    REST_CURL_SYM(global_init, "curl_global_init");
    REST_CURL_SYM(version_info, "curl_version_info");
    REST_CURL_SYM(easy_init, "curl_easy_init");
    REST_CURL_SYM(easy_setopt, "curl_easy_setopt");
    REST_CURL_SYM(easy_perform, "curl_easy_perform");
    REST_CURL_SYM(easy_getinfo, "curl_easy_getinfo");
    REST_CURL_SYM(easy_cleanup, "curl_easy_cleanup");
    REST_CURL_SYM(easy_strerror, "curl_easy_strerror");
    REST_CURL_SYM(slist_append, "curl_slist_append");
    REST_CURL_SYM(slist_free_all, "curl_slist_free_all");
    REST_CURL_SYM(multi_init, "curl_multi_init");
    REST_CURL_SYM(multi_add_handle, "curl_multi_add_handle");
    REST_CURL_SYM(multi_remove_handle, "curl_multi_remove_handle");
    REST_CURL_SYM(multi_perform, "curl_multi_perform");
    REST_CURL_SYM(multi_wait, "curl_multi_wait");
    REST_CURL_SYM(multi_info_read, "curl_multi_info_read");
    REST_CURL_SYM(multi_cleanup, "curl_multi_cleanup");
    REST_CURL_SYM(multi_strerror, "curl_multi_strerror");
    REST_CURL_SYM(share_init, "curl_share_init");
    REST_CURL_SYM(share_setopt, "curl_share_setopt");
    REST_CURL_SYM(share_cleanup, "curl_share_cleanup");
    CURLcode rc = curl_table.global_init(CURL_GLOBAL_DEFAULT);
    if (rc != CURLE_OK) {
        snprintf(curl_load_error, sizeof curl_load_error,
                 "curl_global_init(CURL_GLOBAL_DEFAULT) failed: %s (CURLcode %d)",
                 curl_table.easy_strerror(rc), (int)rc);
        return;
    }
    curl_loaded = 1;
}

int rest_curl_load(const RestCurl **out, SgError *err)
{
    pthread_once(&curl_once, load_curl);
    if (!curl_loaded)
        return sg_fail(err, SG_EREST, "%s", curl_load_error);
    *out = &curl_table;
    return SG_OK;
}

int rest_curl_fail(const RestCurl *lib, CURLcode code, const char *call, SgError *err)
{
    return sg_fail(err, SG_EREST, "%s failed: %s (CURLcode %d)", call, lib->easy_strerror(code),
                   (int)code);
}

int rest_curl_multi_fail(const RestCurl *lib, CURLMcode code, const char *call, SgError *err)
{
    return sg_fail(err, SG_EREST, "%s failed: %s (CURLMcode %d)", call, lib->multi_strerror(code),
                   (int)code);
}
