/* fuzz_rest_reply.c - libFuzzer harness for what the REST client reads from a
 * server (rest_reply.c): the error-body JSON parser, the header-block lookup
 * and the Retry-After parser. The first byte splits the input into a header
 * block and a body. Run with `make fuzz`. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rest/rest_reply.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t split = (size_t)data[0] * (size - 1) / 255; /* header bytes */
    const char *headers = (const char *)data + 1;
    const uint8_t *body = data + 1 + split;
    size_t body_len = size - 1 - split;

    char code[REST_ERROR_CODE_MAX], message[REST_MESSAGE_MAX];
    rest_parse_error(body, body_len, code, message);
    if (strlen(code) >= REST_ERROR_CODE_MAX || strlen(message) >= REST_MESSAGE_MAX)
        abort();

    size_t vlen = 0;
    const char *v = rest_header_value(headers, split, "Retry-After", &vlen);
    if (v != NULL) {
        if (v < headers || v + vlen > headers + split)
            abort(); /* the value must lie inside the block */
        double secs = rest_parse_retry_after(v, vlen);
        if (!(secs == -1 || (secs >= 0 && secs <= 3600)))
            abort();
    }

    /* redaction never grows the message and leaves no occurrence behind */
    if (body_len >= 4 && body_len < 32) {
        char secret[32];
        memcpy(secret, body, body_len);
        secret[body_len] = '\0';
        size_t before = strlen(message);
        if (strlen(secret) >= 4) {
            rest_redact(message, secret);
            if (strlen(message) > before || strstr(message, secret) != NULL)
                abort();
        }
    }
    return 0;
}
