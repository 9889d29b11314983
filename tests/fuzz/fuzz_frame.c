/* fuzz_frame.c - libFuzzer harness for the wire frame parser (frame.c) and the
 * JSON control-message reader (json_msg.c): the input is fed to the resumable
 * parser in chunks whose sizes come from the input itself; every complete JSON
 * frame is parsed as a control message. Run with `make fuzz`. */
#include <stdint.h>
#include <stdlib.h>

#include "net/frame.h"
#include "net/json_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t chunk = (size_t)data[0] % 17 + 1; /* 1..17-byte reads */
    data++, size--;
    NetFrameParser p;
    net_frame_parser_init(&p, 1u << 16);
    SgError err;
    size_t off = 0;
    while (off < size) {
        size_t n = size - off < chunk ? size - off : chunk, used = 0;
        int rc = net_frame_parser_feed(&p, data + off, n, &used, &err);
        if (rc < 0)
            break;
        if (used == 0 && rc == 0)
            abort(); /* no progress would be an infinite loop in the servers */
        off += used;
        if (rc == 1) {
            NetFrameHeader h;
            uint8_t *payload;
            net_frame_parser_take(&p, &h, &payload);
            if (h.type == NET_FRAME_JSON) {
                cJSON *msg = NULL;
                const char *type;
                long v;
                if (net_json_parse(payload, h.length, "fuzz", &msg, &type, &err) == 0) {
                    net_json_int(msg, "executor_id", -5, 5, "fuzz", &v, &err);
                    cJSON_Delete(msg);
                }
            }
            free(payload);
        }
    }
    net_frame_parser_free(&p);
    return 0;
}
