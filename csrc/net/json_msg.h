/*
 * json_msg.h - JSON control messages (cJSON) carried in NET_FRAME_JSON frames.
 *
 * A control message is one JSON object whose "type" member is a string.
 * Helpers read typed members with errors that name the message, the member
 * and the peer.
 */
#ifndef NET_JSON_MSG_H
#define NET_JSON_MSG_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"
#include "net/session.h"

/* Parses payload into an object with a string "type"; SG_EPROTO otherwise.
 * *type points into *out. */
int net_json_parse(const uint8_t *payload, size_t len, const char *peer, cJSON **out,
                   const char **type, SgError *err);

/* Member accessors: SG_EPROTO naming member, message type and peer when
 * missing or of the wrong kind. Integers must be whole numbers in [lo, hi]. */
int net_json_string(const cJSON *obj, const char *name, const char *peer, const char **out,
                    SgError *err);
int net_json_int(const cJSON *obj, const char *name, long lo, long hi, const char *peer, long *out,
                 SgError *err);
int net_json_number(const cJSON *obj, const char *name, const char *peer, double *out,
                    SgError *err);

/* Serializes obj (unformatted) into a malloc'd string, or NULL on ENOMEM. */
char *net_json_print(const cJSON *obj);

/* Sends obj as one JSON frame before deadline, protected by s (the
 * connection's session; NULL: plain). */
int net_json_send(int fd, NetSession *s, const cJSON *obj, double deadline, const char *peer,
                  SgError *err);

#endif /* NET_JSON_MSG_H */
