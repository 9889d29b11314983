/*
 * rest_version.c - runtime versions of libcurl and cJSON.
 *
 * libcurl is opened on first use instead of being a link-time dependency of
 * the extension: its dependency tree (about 30 libraries: TLS, Kerberos,
 * LDAP, SSH, IDN) took 8 ms of every `import sparkgrad`, which each Spark task
 * of a cluster pays before its node can register, while only the REST side
 * calls into it. The handle stays open: the version string lives in libcurl.
 */
#include "rest/rest_version.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <dlfcn.h>
#include <pthread.h>

typedef curl_version_info_data *(*curl_version_info_fn)(CURLversion);

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static const char *loaded_curl_version = "unavailable (" REST_CURL_SONAME " not loadable)";

static void load_curl_version(void)
{
    void *lib = dlopen(REST_CURL_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL)
        return;
    curl_version_info_fn info_fn;
    *(void **)&info_fn = dlsym(lib, "curl_version_info");
    if (info_fn == NULL)
        return;
    const curl_version_info_data *info = info_fn(CURLVERSION_NOW);
    if (info != NULL && info->version != NULL)
        loaded_curl_version = info->version;
}

const char *rest_curl_version(void)
{
    pthread_once(&curl_once, load_curl_version);
    return loaded_curl_version;
}

const char *rest_cjson_version(void)
{
    return cJSON_Version();
}
