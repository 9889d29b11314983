/*
 * frame_type.h - the types of wire frames (frame.h) and their names, apart
 * so that the session (session.c), whose errors name them, does not depend
 * on frame.h: frame.c uses the session, not the other way round.
 */
#ifndef NET_FRAME_TYPE_H
#define NET_FRAME_TYPE_H

#include <stdint.h>

typedef enum NetFrameType {
    NET_FRAME_AUTH_CHALLENGE = 1, /* server nonce (32) */
    NET_FRAME_AUTH_RESPONSE = 2,  /* client nonce (32) + client MAC (32) */
    NET_FRAME_AUTH_OK = 3,        /* server MAC (32) */
    NET_FRAME_AUTH_FAIL = 4,      /* reason text */
    NET_FRAME_JSON = 10,          /* one JSON object with a "type" member */
    NET_FRAME_HEARTBEAT = 11,     /* empty */
    NET_FRAME_PS = 20,            /* parameter-server request/reply (ps_*.c) */
    NET_FRAME_FEED = 30,          /* feed batch or control (feed.c) */
    NET_FRAME_COLL = 40,          /* collectives: hello, per-collective header (coll.c) */
} NetFrameType;

/* A human name for a frame type ("json", "unknown"). */
static inline const char *net_frame_type_name(uint8_t type)
{
    static const char *const names[] = {[NET_FRAME_AUTH_CHALLENGE] = "auth-challenge",
                                        [NET_FRAME_AUTH_RESPONSE] = "auth-response",
                                        [NET_FRAME_AUTH_OK] = "auth-ok",
                                        [NET_FRAME_AUTH_FAIL] = "auth-fail",
                                        [NET_FRAME_JSON] = "json",
                                        [NET_FRAME_HEARTBEAT] = "heartbeat",
                                        [NET_FRAME_PS] = "ps",
                                        [NET_FRAME_FEED] = "feed",
                                        [NET_FRAME_COLL] = "coll"};
    const char *name = type < sizeof names / sizeof *names ? names[type] : NULL;
    return name != NULL ? name : "unknown";
}

#endif /* NET_FRAME_TYPE_H */
