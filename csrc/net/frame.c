/*
 * frame.c - encoding, validating and incrementally parsing wire frames
 * (format in frame.h), plus deadline-bounded frame send/receive.
 *
 * Every length is checked against the receiver's cap before any allocation.
 * Not here: what payloads mean (auth.c, rendezvous_server.c, ps_*.c, feed.c).
 */
#include "net/frame.h"

#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "net/sock.h"

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

const char *net_frame_type_name(uint8_t type)
{
    switch (type) {
    case NET_FRAME_AUTH_CHALLENGE:
        return "auth-challenge";
    case NET_FRAME_AUTH_RESPONSE:
        return "auth-response";
    case NET_FRAME_AUTH_OK:
        return "auth-ok";
    case NET_FRAME_AUTH_FAIL:
        return "auth-fail";
    case NET_FRAME_JSON:
        return "json";
    case NET_FRAME_HEARTBEAT:
        return "heartbeat";
    case NET_FRAME_PS:
        return "ps";
    case NET_FRAME_FEED:
        return "feed";
    case NET_FRAME_COLL:
        return "coll";
    default:
        return "unknown";
    }
}

void net_frame_header_encode(uint8_t out[NET_FRAME_HEADER_SIZE], uint8_t type, uint16_t flags,
                             uint32_t length)
{
    put_u32(out, NET_FRAME_MAGIC);
    out[4] = NET_FRAME_VERSION;
    out[5] = type;
    put_u16(out + 6, flags);
    put_u32(out + 8, length);
}

int net_frame_header_decode(const uint8_t *buf, size_t len, uint32_t max_payload, NetFrameHeader *h,
                            SgError *err)
{
    if (len < NET_FRAME_HEADER_SIZE)
        return sg_fail(err, SG_EPROTO, "frame header needs %d bytes, got %zu",
                       NET_FRAME_HEADER_SIZE, len);
    uint32_t magic = get_u32(buf);
    if (magic != NET_FRAME_MAGIC)
        return sg_fail(
            err, SG_EPROTO,
            "bad frame magic 0x%08x at byte 0 (expected 0x%08x): the peer does not speak "
            "the sparkgrad protocol",
            magic, NET_FRAME_MAGIC);
    if (buf[4] != NET_FRAME_VERSION)
        return sg_fail(err, SG_EPROTO,
                       "unsupported frame version %u at byte 4 (this build speaks %d)", buf[4],
                       NET_FRAME_VERSION);
    if (strcmp(net_frame_type_name(buf[5]), "unknown") == 0)
        return sg_fail(err, SG_EPROTO, "unknown frame type %u at byte 5", buf[5]);
    uint32_t length = get_u32(buf + 8);
    if (length > max_payload)
        return sg_fail(err, SG_EFRAME,
                       "%s frame announces %u payload bytes, above the maximum of %u for this "
                       "connection",
                       net_frame_type_name(buf[5]), length, max_payload);
    h->type = buf[5];
    h->flags = get_u16(buf + 6);
    h->length = length;
    return SG_OK;
}

void net_frame_parser_init(NetFrameParser *p, uint32_t max_payload)
{
    memset(p, 0, sizeof *p);
    p->max_payload = max_payload;
}

void net_frame_parser_free(NetFrameParser *p)
{
    free(p->payload);
    p->payload = NULL;
    p->hdr_have = 0;
    p->have_header = 0;
    p->payload_have = 0;
}

int net_frame_parser_feed(NetFrameParser *p, const uint8_t *buf, size_t len, size_t *consumed,
                          SgError *err)
{
    size_t used = 0;
    *consumed = 0;
    if (!p->have_header) {
        size_t take = NET_FRAME_HEADER_SIZE - p->hdr_have;
        if (take > len)
            take = len;
        memcpy(p->hdr + p->hdr_have, buf, take);
        p->hdr_have += take;
        used += take;
        *consumed = used;
        if (p->hdr_have < NET_FRAME_HEADER_SIZE)
            return 0;
        int rc = net_frame_header_decode(p->hdr, sizeof p->hdr, p->max_payload, &p->header, err);
        if (rc < 0)
            return rc;
        /* Length validated above: now allocation is bounded by max_payload. */
        p->payload = malloc((size_t)p->header.length + 1);
        if (p->payload == NULL)
            return sg_fail(err, SG_ENOMEM, "allocating a %u-byte frame payload", p->header.length);
        p->payload_have = 0;
        p->have_header = 1;
    }
    size_t want = p->header.length - p->payload_have;
    size_t take = len - used < want ? len - used : want;
    if (take > 0)
        memcpy(p->payload + p->payload_have, buf + used, take);
    p->payload_have += take;
    used += take;
    *consumed = used;
    return p->payload_have == p->header.length ? 1 : 0;
}

void net_frame_parser_take(NetFrameParser *p, NetFrameHeader *h, uint8_t **payload)
{
    *h = p->header;
    p->payload[p->header.length] = '\0';
    *payload = p->payload;
    p->payload = NULL;
    p->hdr_have = 0;
    p->have_header = 0;
    p->payload_have = 0;
}

int net_frame_send(int fd, uint8_t type, uint16_t flags, const void *payload, size_t len,
                   double deadline, const char *peer, SgError *err)
{
    if (len > UINT32_MAX)
        return sg_fail(err, SG_EFRAME, "%s frame of %zu bytes exceeds the 4 GiB format limit",
                       net_frame_type_name(type), len);
    uint8_t hdr[NET_FRAME_HEADER_SIZE];
    net_frame_header_encode(hdr, type, flags, (uint32_t)len);
    struct iovec iov[2] = {{hdr, sizeof hdr}, {(void *)payload, len}};
    return net_writev_all(fd, iov, 2, deadline, peer, net_frame_type_name(type), err);
}

int net_frame_recv_header(int fd, uint32_t max_payload, double deadline, const char *peer,
                          NetFrameHeader *h, SgError *err)
{
    uint8_t hdr[NET_FRAME_HEADER_SIZE];
    int rc = net_read_exact(fd, hdr, sizeof hdr, deadline, peer, "a frame header", err);
    if (rc < 0)
        return rc;
    rc = net_frame_header_decode(hdr, sizeof hdr, max_payload, h, err);
    if (rc < 0)
        return sg_context(err, "from %s: ", peer);
    return SG_OK;
}

int net_frame_recv(int fd, uint32_t max_payload, double deadline, const char *peer,
                   NetFrameHeader *h, uint8_t **payload, SgError *err)
{
    *payload = NULL;
    int rc = net_frame_recv_header(fd, max_payload, deadline, peer, h, err);
    if (rc < 0)
        return rc;
    uint8_t *buf = malloc((size_t)h->length + 1);
    if (buf == NULL)
        return sg_fail(err, SG_ENOMEM, "allocating a %u-byte frame from %s", h->length, peer);
    rc = net_read_exact(fd, buf, h->length, deadline, peer, "a frame payload", err);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    buf[h->length] = '\0';
    *payload = buf;
    return SG_OK;
}
