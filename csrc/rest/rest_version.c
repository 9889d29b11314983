/* rest_version.c - runtime versions of libcurl and cJSON. */
#include "rest/rest_version.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>

const char *rest_curl_version(void)
{
    const curl_version_info_data *info = curl_version_info(CURLVERSION_NOW);
    return info != NULL ? info->version : "unknown";
}

const char *rest_cjson_version(void)
{
    return cJSON_Version();
}
