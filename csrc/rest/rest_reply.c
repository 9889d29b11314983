/*
 * rest_reply.c - error bodies, Retry-After, header lookup, backoff and
 * redaction (rest_reply.h). Error bodies are parsed with cJSON from a length,
 * never trusting a terminating NUL; every copy is bounded by its buffer.
 */
#include "rest/rest_reply.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <string.h>
#include <strings.h>

/* Copies at most cap - 1 bytes of src[0, n) into dst, non-printable bytes
 * (control characters, DEL) as '?'; UTF-8 bytes >= 0x80 pass. */
static void copy_printable(char *dst, size_t cap, const char *src, size_t n)
{
    size_t k = n < cap - 1 ? n : cap - 1;
    for (size_t i = 0; i < k; i++) {
        unsigned char c = (unsigned char)src[i];
        dst[i] = (c < 0x20 && c != '\t') || c == 0x7f ? '?' : (char)c;
    }
    dst[k] = '\0';
}

static const char *json_string(const cJSON *obj, const char *a, const char *b)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, a);
    if (!cJSON_IsString(v) && b != NULL)
        v = cJSON_GetObjectItemCaseSensitive(obj, b);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

int rest_parse_error(const uint8_t *buf, size_t len, char code[REST_ERROR_CODE_MAX],
                     char message[REST_MESSAGE_MAX])
{
    code[0] = message[0] = '\0';
    if (buf == NULL || len == 0)
        return 0;
    cJSON *doc = cJSON_ParseWithLength((const char *)buf, len);
    const char *c = NULL, *m = NULL;
    if (cJSON_IsObject(doc)) {
        c = json_string(doc, "error_code", "error");
        m = json_string(doc, "message", "error_description");
    }
    int found = c != NULL || m != NULL;
    if (c != NULL)
        copy_printable(code, REST_ERROR_CODE_MAX, c, strlen(c));
    if (m != NULL)
        copy_printable(message, REST_MESSAGE_MAX, m, strlen(m));
    else if (!found) /* HTML from a proxy, plain text: its start */
        copy_printable(message, 200 < REST_MESSAGE_MAX ? 200 : REST_MESSAGE_MAX, (const char *)buf,
                       len);
    cJSON_Delete(doc);
    return found;
}

double rest_parse_retry_after(const char *value, size_t len)
{
    if (value == NULL)
        return -1;
    size_t i = 0;
    while (i < len && (value[i] == ' ' || value[i] == '\t'))
        i++;
    if (i == len)
        return -1;
    double secs = 0;
    for (; i < len && isdigit((unsigned char)value[i]); i++)
        if (secs < 3600)
            secs = secs * 10 + (value[i] - '0');
    while (i < len && (value[i] == ' ' || value[i] == '\t' || value[i] == '\r'))
        i++;
    if (i != len) /* an HTTP-date, a sign, a fraction: not delta-seconds */
        return -1;
    return secs > 3600 ? 3600 : secs;
}

const char *rest_header_value(const char *headers, size_t len, const char *name, size_t *value_len)
{
    size_t nlen = strlen(name), pos = 0;
    while (pos < len) {
        const char *line = headers + pos;
        const char *eol = memchr(line, '\n', len - pos);
        size_t llen = eol != NULL ? (size_t)(eol - line) : len - pos;
        pos += llen + 1;
        if (llen > nlen && line[nlen] == ':' && strncasecmp(line, name, nlen) == 0) {
            const char *v = line + nlen + 1, *end = line + llen;
            while (v < end && (*v == ' ' || *v == '\t'))
                v++;
            while (end > v && (end[-1] == '\r' || end[-1] == ' ' || end[-1] == '\t'))
                end--;
            *value_len = (size_t)(end - v);
            return v;
        }
    }
    return NULL;
}

double rest_backoff_s(int attempt, double base_s, double retry_after_s, double jitter01)
{
    if (retry_after_s >= 0)
        return retry_after_s;
    int steps = attempt < 1 ? 1 : attempt > 10 ? 10 : attempt;
    return base_s * steps + jitter01 * base_s / 2;
}

int rest_redact(char *s, const char *secret)
{
    size_t n = secret != NULL ? strlen(secret) : 0;
    if (n < 4)
        return 0;
    int count = 0;
    char *hit;
    while ((hit = strstr(s, secret)) != NULL) {
        memcpy(hit, "***", 3);
        memmove(hit + 3, hit + n, strlen(hit + n) + 1);
        count++;
    }
    return count;
}
