/*
 * rest_version.h - versions of the HTTP and JSON libraries the REST client
 * runs on (libcurl, cJSON), for build reports. libcurl and cJSON stay
 * confined to csrc/rest/.
 */
#ifndef REST_VERSION_H
#define REST_VERSION_H

const char *rest_curl_version(void);
const char *rest_cjson_version(void);

#endif
