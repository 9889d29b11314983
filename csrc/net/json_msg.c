/*
 * json_msg.c - parsing and sending JSON control messages (json_msg.h).
 */
#include "net/json_msg.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "net/frame.h"

static const char *msg_type(const cJSON *obj)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, "type");
    return cJSON_IsString(t) ? t->valuestring : "?";
}

int net_json_parse(const uint8_t *payload, size_t len, const char *peer, cJSON **out,
                   const char **type, SgError *err)
{
    cJSON *obj = cJSON_ParseWithLength((const char *)payload, len);
    if (obj == NULL) {
        const char *at = cJSON_GetErrorPtr();
        long off = at != NULL && at >= (const char *)payload && at <= (const char *)payload + len
                       ? (long)(at - (const char *)payload)
                       : -1;
        return sg_fail(err, SG_EPROTO,
                       "invalid JSON control message from %s (%zu bytes, error near byte %ld)",
                       peer, len, off);
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, "type");
    if (!cJSON_IsObject(obj) || !cJSON_IsString(t)) {
        cJSON_Delete(obj);
        return sg_fail(err, SG_EPROTO,
                       "control message from %s is not an object with a string \"type\"", peer);
    }
    *out = obj;
    *type = t->valuestring;
    return SG_OK;
}

int net_json_string(const cJSON *obj, const char *name, const char *peer, const char **out,
                    SgError *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!cJSON_IsString(v))
        return sg_fail(err, SG_EPROTO, "'%s' message from %s: member \"%s\" must be a string",
                       msg_type(obj), peer, name);
    *out = v->valuestring;
    return SG_OK;
}

int net_json_number(const cJSON *obj, const char *name, const char *peer, double *out, SgError *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!cJSON_IsNumber(v))
        return sg_fail(err, SG_EPROTO, "'%s' message from %s: member \"%s\" must be a number",
                       msg_type(obj), peer, name);
    *out = v->valuedouble;
    return SG_OK;
}

int net_json_int(const cJSON *obj, const char *name, long lo, long hi, const char *peer, long *out,
                 SgError *err)
{
    double d = 0;
    int rc = net_json_number(obj, name, peer, &d, err);
    if (rc < 0)
        return rc;
    if (d != floor(d) || d < (double)lo || d > (double)hi)
        return sg_fail(err, SG_EPROTO,
                       "'%s' message from %s: member \"%s\" = %g is not an integer in %ld..%ld",
                       msg_type(obj), peer, name, d, lo, hi);
    *out = (long)d;
    return SG_OK;
}

char *net_json_print(const cJSON *obj)
{
    return cJSON_PrintUnformatted(obj);
}

int net_json_send(int fd, NetSession *s, const cJSON *obj, double deadline, const char *peer,
                  SgError *err)
{
    char *text = cJSON_PrintUnformatted(obj);
    if (text == NULL)
        return sg_fail(err, SG_ENOMEM, "serializing a control message for %s", peer);
    int rc = net_frame_send(fd, s, NET_FRAME_JSON, 0, text, strlen(text), deadline, peer, err);
    free(text);
    return rc;
}
