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

#include "common/sg_le.h"
#include "net/sock.h"

void net_frame_header_encode(uint8_t out[NET_FRAME_HEADER_SIZE], uint8_t type, uint16_t flags,
                             uint32_t length)
{
    sg_put_le32(out, NET_FRAME_MAGIC);
    out[4] = NET_FRAME_VERSION;
    out[5] = type;
    sg_put_le16(out + 6, flags);
    sg_put_le32(out + 8, length);
}

int net_frame_header_decode(const uint8_t *buf, size_t len, uint32_t max_payload, NetFrameHeader *h,
                            SgError *err)
{
    if (len < NET_FRAME_HEADER_SIZE)
        return sg_fail(err, SG_EPROTO, "frame header needs %d bytes, got %zu",
                       NET_FRAME_HEADER_SIZE, len);
    uint32_t magic = sg_get_le32(buf);
    if (magic != NET_FRAME_MAGIC)
        return sg_fail(
            err, SG_EPROTO,
            "bad frame magic 0x%08x at byte 0 (expected 0x%08x): the peer does not speak "
            "the sparkgrad protocol",
            magic, NET_FRAME_MAGIC);
    if (buf[4] != NET_FRAME_VERSION)
        return sg_fail(
            err, SG_EPROTO,
            "unsupported frame version %u at byte 4 (this build speaks %d: the peer runs "
            "another sparkgrad release)",
            buf[4], NET_FRAME_VERSION);
    if (strcmp(net_frame_type_name(buf[5]), "unknown") == 0)
        return sg_fail(err, SG_EPROTO, "unknown frame type %u at byte 5", buf[5]);
    uint32_t length = sg_get_le32(buf + 8);
    if (length > max_payload)
        return sg_fail(err, SG_EFRAME,
                       "%s frame announces %u payload bytes, above the maximum of %u for this "
                       "connection",
                       net_frame_type_name(buf[5]), length, max_payload);
    h->type = buf[5];
    h->flags = sg_get_le16(buf + 6);
    h->length = length;
    return SG_OK;
}

void net_frame_parser_init(NetFrameParser *p, uint32_t max_payload)
{
    memset(p, 0, sizeof *p);
    p->max_payload = max_payload;
}

void net_frame_parser_protect(NetFrameParser *p, NetSession *s, uint32_t max_payload,
                              const char *peer)
{
    p->session = net_session_on(s) ? s : NULL;
    p->max_payload = max_payload;
    p->peer = peer;
}

static void parser_reset(NetFrameParser *p)
{
    p->hdr_have = p->payload_have = p->tag_have = 0;
    p->have_header = 0;
}

void net_frame_parser_free(NetFrameParser *p)
{
    free(p->payload);
    p->payload = NULL;
    parser_reset(p);
}

/* Copies up to want - *have bytes from buf[*used..len) into dst + *have. */
static void take_into(uint8_t *dst, size_t *have, size_t want, const uint8_t *buf, size_t len,
                      size_t *used)
{
    size_t n = want - *have;
    if (n > len - *used)
        n = len - *used;
    if (n > 0)
        memcpy(dst + *have, buf + *used, n);
    *have += n;
    *used += n;
}

/* A protected frame is whole: check seq, open the payload in place, check the tag. */
static int parser_open(NetFrameParser *p, SgError *err)
{
    NetSession *s = p->session;
    const char *peer = p->peer ? p->peer : "peer";
    int rc = net_session_open_begin(s, p->hdr, NET_FRAME_HEADER_SIZE,
                                    p->hdr + NET_FRAME_HEADER_SIZE, peer, p->header.type, err);
    if (rc == SG_OK)
        rc = net_session_open_update(s, p->payload, p->payload, p->header.length, err);
    if (rc == SG_OK)
        rc = net_session_open_end(s, p->tag, peer, p->header.type, err);
    return rc;
}

int net_frame_parser_feed(NetFrameParser *p, const uint8_t *buf, size_t len, size_t *consumed,
                          SgError *err)
{
    size_t used = 0;
    size_t seq = p->session ? NET_SESSION_SEQ : 0, tag = p->session ? NET_SESSION_TAG : 0;
    *consumed = 0;
    if (!p->have_header) {
        take_into(p->hdr, &p->hdr_have, NET_FRAME_HEADER_SIZE, buf, len, &used);
        *consumed = used;
        if (p->hdr_have < NET_FRAME_HEADER_SIZE)
            return 0;
        int rc =
            net_frame_header_decode(p->hdr, NET_FRAME_HEADER_SIZE, p->max_payload, &p->header, err);
        if (rc < 0)
            return rc;
        /* Length validated above: now allocation is bounded by max_payload. */
        p->payload = malloc((size_t)p->header.length + 1);
        if (p->payload == NULL)
            return sg_fail(err, SG_ENOMEM, "allocating a %u-byte frame payload", p->header.length);
        p->have_header = 1; /* payload_have and tag_have are 0 since the last reset */
    }
    take_into(p->hdr, &p->hdr_have, NET_FRAME_HEADER_SIZE + seq, buf, len, &used);
    if (p->hdr_have == NET_FRAME_HEADER_SIZE + seq)
        take_into(p->payload, &p->payload_have, p->header.length, buf, len, &used);
    if (p->payload_have == p->header.length)
        take_into(p->tag, &p->tag_have, tag, buf, len, &used);
    *consumed = used;
    if (p->hdr_have < NET_FRAME_HEADER_SIZE + seq || p->payload_have < p->header.length ||
        p->tag_have < tag)
        return 0;
    if (p->session) {
        int rc = parser_open(p, err);
        if (rc < 0)
            return rc;
    }
    return 1;
}

void net_frame_parser_take(NetFrameParser *p, NetFrameHeader *h, uint8_t **payload)
{
    *h = p->header;
    p->payload[p->header.length] = '\0';
    *payload = p->payload;
    p->payload = NULL;
    parser_reset(p);
}

#define SEALED_IOV 18 /* iovecs gathered before a write: header, pieces or blocks, tag */

/* Appends len bytes at p to the gathered iovecs, extending the last one when contiguous. */
static void gather(struct iovec *out, int *k, const uint8_t *p, size_t len)
{
    if (*k > 0 && (const uint8_t *)out[*k - 1].iov_base + out[*k - 1].iov_len == p)
        out[*k - 1].iov_len += len;
    else
        out[(*k)++] = (struct iovec){(void *)p, len};
}

/* A protected frame's payload, streamed: block by block (NET_SESSION_SCRATCH bytes) it is
 * sealed (authenticated where it lies, or encrypted into the session's scratch block) and
 * written before the next block is sealed, so the peer reads and opens one block while this
 * side seals the next, instead of hashing the whole payload before the first byte leaves.
 * The header and seq go out with the first block, the tag with the last: a frame of one
 * block is one writev. */
static int sendv_sealed(int fd, NetSession *s, const uint8_t *hdr, size_t hdr_len,
                        const struct iovec *pieces, int n, double deadline, const char *peer,
                        const char *what, SgError *err)
{
    uint8_t *scratch = NULL, tag[NET_SESSION_TAG];
    int enc = s->mode == NET_SEC_ENCRYPT, rc = SG_OK, k = 0;
    if (enc && (rc = net_session_scratch(s, &scratch, err)) < 0)
        return rc;
    struct iovec out[SEALED_IOV];
    size_t block = 0; /* payload bytes gathered since the last write */
    gather(out, &k, hdr, hdr_len);
    for (int i = 0; i < n; i++) {
        const uint8_t *src = pieces[i].iov_base;
        for (size_t off = 0; off < pieces[i].iov_len;) {
            size_t take = pieces[i].iov_len - off;
            if (take > NET_SESSION_SCRATCH - block)
                take = NET_SESSION_SCRATCH - block;
            uint8_t *dst = enc ? scratch + block : (uint8_t *)src + off;
            if ((rc = net_session_seal_update(s, src + off, dst, take, err)) < 0)
                return rc;
            gather(out, &k, dst, take);
            off += take, block += take;
            if (block == NET_SESSION_SCRATCH || k == SEALED_IOV - 1) {
                if ((rc = net_writev_all(fd, out, k, deadline, peer, what, err)) < 0)
                    return rc;
                k = 0, block = 0;
            }
        }
    }
    if ((rc = net_session_seal_end(s, tag, err)) < 0)
        return rc;
    gather(out, &k, tag, sizeof tag);
    return net_writev_all(fd, out, k, deadline, peer, what, err);
}

int net_frame_sendv(int fd, NetSession *s, uint8_t type, uint16_t flags, const struct iovec *pieces,
                    int n, double deadline, const char *peer, const char *what, SgError *err)
{
    size_t len = 0;
    for (int i = 0; i < n; i++)
        len += pieces[i].iov_len;
    if (len > UINT32_MAX)
        return sg_fail(err, SG_EFRAME, "%s frame of %zu bytes exceeds the 4 GiB format limit",
                       net_frame_type_name(type), len);
    uint8_t hdr[NET_FRAME_HEADER_SIZE + NET_SESSION_SEQ];
    net_frame_header_encode(hdr, type, flags, (uint32_t)len);
    if (net_session_on(s)) {
        int rc =
            net_session_seal_begin(s, hdr, NET_FRAME_HEADER_SIZE, hdr + NET_FRAME_HEADER_SIZE, err);
        return rc < 0 ? rc
                      : sendv_sealed(fd, s, hdr, sizeof hdr, pieces, n, deadline, peer, what, err);
    }
    /* Plain: header and pieces in one writev. */
    struct iovec small[8], *iov = small;
    if (n + 1 > (int)(sizeof small / sizeof *small) &&
        (iov = malloc((size_t)(n + 1) * sizeof *iov)) == NULL)
        return sg_fail(err, SG_ENOMEM, "allocating %d iovecs for %s", n + 1, what);
    iov[0] = (struct iovec){hdr, NET_FRAME_HEADER_SIZE};
    for (int i = 0; i < n; i++)
        iov[i + 1] = pieces[i];
    int rc = net_writev_all(fd, iov, n + 1, deadline, peer, what, err);
    if (iov != small)
        free(iov);
    return rc;
}

int net_frame_send(int fd, NetSession *s, uint8_t type, uint16_t flags, const void *payload,
                   size_t len, double deadline, const char *peer, SgError *err)
{
    struct iovec one = {(void *)payload, len};
    return net_frame_sendv(fd, s, type, flags, &one, len > 0 ? 1 : 0, deadline, peer,
                           net_frame_type_name(type), err);
}

int net_frame_recv_header(int fd, NetSession *s, uint32_t max_payload, double deadline,
                          const char *peer, NetFrameHeader *h, SgError *err)
{
    uint8_t hdr[NET_FRAME_HEADER_SIZE + NET_SESSION_SEQ];
    int rc = net_read_exact(fd, hdr, NET_FRAME_HEADER_SIZE, deadline, peer, "a frame header", err);
    if (rc < 0)
        return rc;
    rc = net_frame_header_decode(hdr, NET_FRAME_HEADER_SIZE, max_payload, h, err);
    if (rc < 0)
        return sg_context(err, "from %s: ", peer);
    if (!net_session_on(s))
        return SG_OK;
    rc = net_read_exact(fd, hdr + NET_FRAME_HEADER_SIZE, NET_SESSION_SEQ, deadline, peer,
                        "a frame's sequence number", err);
    if (rc < 0)
        return rc;
    return net_session_open_begin(s, hdr, NET_FRAME_HEADER_SIZE, hdr + NET_FRAME_HEADER_SIZE, peer,
                                  h->type, err);
}

int net_frame_recv_payload(int fd, NetSession *s, void *dst, size_t len, double deadline,
                           const char *peer, const char *what, SgError *err)
{
    if (!net_session_on(s))
        return net_read_exact(fd, dst, len, deadline, peer, what, err);
    /* Block by block, so opening one block overlaps the arrival of the next. */
    uint8_t *p = dst;
    for (size_t off = 0; off < len;) {
        size_t n = len - off < NET_SESSION_SCRATCH ? len - off : NET_SESSION_SCRATCH;
        int rc = net_read_exact(fd, p + off, n, deadline, peer, what, err);
        if (rc == SG_OK)
            rc = net_session_open_update(s, p + off, p + off, n, err);
        if (rc < 0)
            return off > 0 ? sg_context(err, "(in the block at byte %zu of %zu) ", off, len) : rc;
        off += n;
    }
    return SG_OK;
}

int net_frame_recv_end(int fd, NetSession *s, uint8_t type, double deadline, const char *peer,
                       SgError *err)
{
    if (!net_session_on(s))
        return SG_OK;
    uint8_t tag[NET_SESSION_TAG];
    int rc = net_read_exact(fd, tag, sizeof tag, deadline, peer, "a frame's tag", err);
    if (rc < 0)
        return rc;
    return net_session_open_end(s, tag, peer, type, err);
}

int net_frame_recv(int fd, NetSession *s, uint32_t max_payload, double deadline, const char *peer,
                   NetFrameHeader *h, uint8_t **payload, SgError *err)
{
    *payload = NULL;
    int rc = net_frame_recv_header(fd, s, max_payload, deadline, peer, h, err);
    if (rc < 0)
        return rc;
    uint8_t *buf = malloc((size_t)h->length + 1);
    if (buf == NULL)
        return sg_fail(err, SG_ENOMEM, "allocating a %u-byte frame from %s", h->length, peer);
    if ((rc = net_frame_recv_payload(fd, s, buf, h->length, deadline, peer, "a frame payload",
                                     err)) < 0 ||
        (rc = net_frame_recv_end(fd, s, h->type, deadline, peer, err)) < 0) {
        free(buf);
        return rc;
    }
    buf[h->length] = '\0';
    *payload = buf;
    return SG_OK;
}
