/*
 * rest_version.c - runtime versions of libcurl and cJSON, for build reports.
 * libcurl comes from the table of rest_curl.c (opened on first use).
 */
#include "rest/rest_version.h"

#include <cjson/cJSON.h>

#include "rest/rest_curl.h"

const char *rest_curl_version(void)
{
    const RestCurl *lib;
    SgError err;
    if (rest_curl_load(&lib, &err) < 0)
        return "unavailable (" REST_CURL_SONAME " not loadable)";
    const curl_version_info_data *info = lib->version_info(CURLVERSION_NOW);
    return info != NULL && info->version != NULL ? info->version : "unknown";
}

const char *rest_cjson_version(void)
{
    return cJSON_Version();
}
