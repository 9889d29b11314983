/*
 * rest_reply.h - the pure parts of the REST client: reading what a server
 * sent back (error bodies, Retry-After, response headers), the retry backoff
 * and the redaction of secrets from messages. No libcurl here, no I/O: each
 * parser takes (buf, len) of untrusted bytes (tests/fuzz/fuzz_rest_reply.c).
 */
#ifndef REST_REPLY_H
#define REST_REPLY_H

#include <stddef.h>
#include <stdint.h>

#define REST_ERROR_CODE_MAX 64
#define REST_MESSAGE_MAX    512

/* Reads a Databricks error body {"error_code": "...", "message": "..."} (also
 * the OAuth form {"error": "...", "error_description": "..."}) into code and
 * message, both always NUL-terminated, non-printable bytes replaced by '?'.
 * A body that is not such JSON gives code "" and its first printable bytes as
 * the message. Returns 1 when the body was an error object, else 0. */
int rest_parse_error(const uint8_t *buf, size_t len, char code[REST_ERROR_CODE_MAX],
                     char message[REST_MESSAGE_MAX]);

/* Retry-After as delta-seconds ("0", "7", " 2 "), capped at one hour; -1 for
 * a missing, negative, HTTP-date or malformed value (the caller backs off). */
double rest_parse_retry_after(const char *value, size_t len);

/* The value of header `name` (case-insensitive) in a block of "Name: value\r\n"
 * lines, trimmed, as (pointer into headers, length); NULL when absent. */
const char *rest_header_value(const char *headers, size_t len, const char *name, size_t *value_len);

/* Seconds to wait before attempt `attempt` + 1 (attempt >= 1 failed so far):
 * the server's Retry-After when it sent one (>= 0), else a linear backoff
 * base_s * min(attempt, 10) plus jitter01 (in [0, 1)) * base_s / 2. */
double rest_backoff_s(int attempt, double base_s, double retry_after_s, double jitter01);

/* Replaces every occurrence of secret (when at least 4 bytes long) in the
 * NUL-terminated s by "***", in place. Returns the number replaced. */
int rest_redact(char *s, const char *secret);

#endif /* REST_REPLY_H */
