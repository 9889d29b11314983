/* test_rest_reply.c - the pure parts of the REST client: error bodies,
 * Retry-After, header lookup, backoff, redaction, config checks. */
#include <string.h>

#include "check.h"
#include "rest/rest_client.h"
#include "rest/rest_reply.h"

#define BYTES(s) (const uint8_t *)(s), strlen(s)

static void test_error_body_gives_code_and_message(void)
{
    char code[REST_ERROR_CODE_MAX], msg[REST_MESSAGE_MAX];
    CHECK(rest_parse_error(BYTES("{\"error_code\":\"RESOURCE_DOES_NOT_EXIST\",\"message\":\"No "
                                 "file at /a\"}"),
                           code, msg) == 1);
    CHECK(strcmp(code, "RESOURCE_DOES_NOT_EXIST") == 0);
    CHECK(strcmp(msg, "No file at /a") == 0);
}

static void test_oauth_error_body_is_read_too(void)
{
    char code[REST_ERROR_CODE_MAX], msg[REST_MESSAGE_MAX];
    CHECK(rest_parse_error(BYTES("{\"error\":\"invalid_client\",\"error_description\":\"bad\"}"),
                           code, msg) == 1);
    CHECK(strcmp(code, "invalid_client") == 0 && strcmp(msg, "bad") == 0);
}

static void test_non_json_body_gives_its_printable_start(void)
{
    char code[REST_ERROR_CODE_MAX], msg[REST_MESSAGE_MAX];
    CHECK(rest_parse_error(BYTES("<html>\n502 Bad Gateway</html>"), code, msg) == 0);
    CHECK(code[0] == '\0');
    CHECK(strcmp(msg, "<html>?502 Bad Gateway</html>") == 0);
    CHECK(rest_parse_error(NULL, 0, code, msg) == 0 && msg[0] == '\0');
}

static void test_error_fields_are_bounded_and_not_trusting_nul(void)
{
    char code[REST_ERROR_CODE_MAX], msg[REST_MESSAGE_MAX], big[4096];
    int n = snprintf(big, sizeof big, "{\"error_code\":\"");
    memset(big + n, 'C', 200);
    n += 200;
    n += snprintf(big + n, sizeof big - (size_t)n, "\",\"message\":\"");
    memset(big + n, 'm', 2000);
    n += 2000;
    n += snprintf(big + n, sizeof big - (size_t)n, "\"}");
    CHECK(rest_parse_error((const uint8_t *)big, (size_t)n, code, msg) == 1);
    CHECK(strlen(code) == REST_ERROR_CODE_MAX - 1 && strlen(msg) == REST_MESSAGE_MAX - 1);
    /* a length that stops inside the document: not parsed past it */
    CHECK(rest_parse_error((const uint8_t *)"{\"error_code\":\"X\"}", 10, code, msg) == 0);
}

static void test_retry_after_reads_delta_seconds_only(void)
{
    CHECK(rest_parse_retry_after("7", 1) == 7);
    CHECK(rest_parse_retry_after(" 2 \r", 4) == 2);
    CHECK(rest_parse_retry_after("0", 1) == 0);
    CHECK(rest_parse_retry_after("99999999999", 11) == 3600);
    CHECK(rest_parse_retry_after("-1", 2) == -1);
    CHECK(rest_parse_retry_after("1.5", 3) == -1);
    CHECK(rest_parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 29) == -1);
    CHECK(rest_parse_retry_after("", 0) == -1);
    CHECK(rest_parse_retry_after(NULL, 0) == -1);
}

static void test_header_lookup_is_case_insensitive_and_trimmed(void)
{
    const char *h = "Content-Type: application/json\r\nretry-after:  3 \r\nX: y\r\n";
    size_t n = 0;
    const char *v = rest_header_value(h, strlen(h), "Retry-After", &n);
    CHECK(v != NULL && n == 1 && v[0] == '3');
    CHECK(rest_header_value(h, strlen(h), "Retry", &n) == NULL);
    CHECK(rest_header_value(h, strlen(h), "X", &n) != NULL && n == 1);
}

static void test_backoff_is_linear_capped_and_honours_retry_after(void)
{
    CHECK(rest_backoff_s(1, 1.0, -1, 0) == 1.0);
    CHECK(rest_backoff_s(3, 1.0, -1, 0) == 3.0);
    CHECK(rest_backoff_s(50, 1.0, -1, 0) == 10.0);
    CHECK(rest_backoff_s(2, 0.5, -1, 0.5) == 1.125);
    CHECK(rest_backoff_s(5, 1.0, 0, 0.9) == 0);
    CHECK(rest_backoff_s(1, 1.0, 4, 0.9) == 4);
}

static void test_redact_replaces_every_occurrence(void)
{
    char s[128] = "token dapi123456 refused; dapi123456 again";
    CHECK(rest_redact(s, "dapi123456") == 2);
    CHECK(strcmp(s, "token *** refused; *** again") == 0);
    CHECK(rest_redact(s, "abc") == 0); /* too short to redact safely */
    CHECK(rest_redact(s, NULL) == 0);
}

static void test_config_refuses_plain_http_except_allowed_loopback(void)
{
    SgError err;
    RestClientConfig cfg = {
        .host = "http://example.com", .timeout_s = 1, .budget_s = 1, .allow_http_loopback = 1};
    CHECK(rest_config_check(&cfg, &err) == SG_EINVAL && strstr(err.msg, "http://") != NULL);
    cfg.host = "http://127.0.0.1:8080";
    CHECK(rest_config_check(&cfg, &err) == SG_OK);
    cfg.host = "http://127.0.0.1.evil.com";
    CHECK(rest_config_check(&cfg, &err) == SG_EINVAL);
    cfg.host = "http://localhost:1";
    cfg.allow_http_loopback = 0;
    CHECK(rest_config_check(&cfg, &err) == SG_EINVAL);
    cfg.host = "https://adb-1.azuredatabricks.net/";
    CHECK(rest_config_check(&cfg, &err) == SG_EINVAL);
    cfg.host = "ftp://x";
    CHECK(rest_config_check(&cfg, &err) == SG_EINVAL);
    cfg.host = "https://adb-1.azuredatabricks.net";
    CHECK(rest_config_check(&cfg, &err) == SG_OK);
    cfg.timeout_s = 0;
    CHECK(rest_config_check(&cfg, &err) == SG_EINVAL);
}

int main(void)
{
    test_error_body_gives_code_and_message();
    test_oauth_error_body_is_read_too();
    test_non_json_body_gives_its_printable_start();
    test_error_fields_are_bounded_and_not_trusting_nul();
    test_retry_after_reads_delta_seconds_only();
    test_header_lookup_is_case_insensitive_and_trimmed();
    test_backoff_is_linear_capped_and_honours_retry_after();
    test_redact_replaces_every_occurrence();
    test_config_refuses_plain_http_except_allowed_loopback();
    return check_report("test_rest_reply");
}
