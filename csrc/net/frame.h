/*
 * frame.h - the wire frame of every sparkgrad connection.
 *
 * Header, 12 bytes, little-endian:
 *   offset 0  u32 magic    0x4E544753 ("SGTN" on the wire)
 *   offset 4  u8  version  NET_FRAME_VERSION
 *   offset 5  u8  type     NetFrameType
 *   offset 6  u16 flags    meaning per type (0 unless stated)
 *   offset 8  u32 length   payload bytes that follow
 * The receiver checks magic, version, type and length against its cap before
 * it allocates anything. Before authentication the cap is
 * NET_FRAME_MAX_UNAUTH; afterwards the connection's configured maximum
 * (NET_FRAME_MAX_DEFAULT unless set).
 *
 * Protected frames (after the handshake, with a session of session.h in mode
 * "auth" or "encrypt"):
 *   header (12) | seq (u64 LE, 8) | payload (length bytes) | tag (16)
 * The header's length counts the payload only; seq and tag are implied by the
 * connection's mode, which both ends agreed on in the handshake. The header
 * and seq are authenticated; the payload is authenticated ("auth") or
 * encrypted too ("encrypt"). Every call below takes the connection's session:
 * NULL (or a session in mode "none") sends and reads plain frames.
 */
#ifndef NET_FRAME_H
#define NET_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include <sys/uio.h>

#include "common/sg_status.h"
#include "net/frame_type.h"
#include "net/session.h"

#define NET_FRAME_MAGIC 0x4E544753u
/* 2: the parameter server's embedding rows (ps.h PULL_ROWS, PUSH_PULL_ROWS
 * and the table layout in HELLO). */
#define NET_FRAME_VERSION     2
#define NET_FRAME_HEADER_SIZE 12
#define NET_FRAME_MAX_DEFAULT (64u << 20)
#define NET_FRAME_MAX_UNAUTH  256u
/* What a protected frame adds on the wire beyond header and payload. */
#define NET_FRAME_SEC_OVERHEAD (NET_SESSION_SEQ + NET_SESSION_TAG)

typedef struct NetFrameHeader {
    uint8_t type;
    uint16_t flags;
    uint32_t length;
} NetFrameHeader;

/* Writes the 12 header bytes for (type, flags, length) into out. */
void net_frame_header_encode(uint8_t out[NET_FRAME_HEADER_SIZE], uint8_t type, uint16_t flags,
                             uint32_t length);

/* Decodes a header from buf (len must be >= NET_FRAME_HEADER_SIZE) and
 * validates magic (SG_EPROTO), version (SG_EPROTO), type (SG_EPROTO) and
 * length <= max_payload (SG_EFRAME). */
int net_frame_header_decode(const uint8_t *buf, size_t len, uint32_t max_payload, NetFrameHeader *h,
                            SgError *err);

/* Resumable parser: feed bytes as they arrive, in any split. */
typedef struct NetFrameParser {
    uint32_t max_payload;
    NetSession *session; /* NULL until the connection is authenticated */
    const char *peer;    /* names the peer in session errors */
    uint8_t hdr[NET_FRAME_HEADER_SIZE + NET_SESSION_SEQ]; /* header, then seq if protected */
    size_t hdr_have;
    int have_header;
    NetFrameHeader header;
    uint8_t *payload; /* header.length bytes (+1 for a NUL), allocated after validation */
    size_t payload_have;
    uint8_t tag[NET_SESSION_TAG];
    size_t tag_have;
} NetFrameParser;

void net_frame_parser_init(NetFrameParser *p, uint32_t max_payload);
void net_frame_parser_free(NetFrameParser *p);

/* From the next frame on, frames are protected by s (kept by the caller, which
 * outlives the parser's use of it) and may carry up to max_payload bytes.
 * Call between frames, right after the handshake. peer names the connection
 * in errors. A frame that fails its checks makes feed return SG_EAUTH. */
void net_frame_parser_protect(NetFrameParser *p, NetSession *s, uint32_t max_payload,
                              const char *peer);

/* Consumes up to len bytes of buf, setting *consumed. Returns 1 when a whole
 * frame is ready (read it with net_frame_parser_take before feeding more),
 * 0 when more bytes are needed, or a negative status (the parser must then
 * be discarded). */
int net_frame_parser_feed(NetFrameParser *p, const uint8_t *buf, size_t len, size_t *consumed,
                          SgError *err);

/* Hands over the completed frame: *payload is malloc'd (NUL-terminated,
 * possibly NULL for length 0) and owned by the caller. Resets the parser. */
void net_frame_parser_take(NetFrameParser *p, NetFrameHeader *h, uint8_t **payload);

/* Blocking-with-deadline frame I/O on a non-blocking socket; s is the
 * connection's session (NULL: plain frames). */
int net_frame_send(int fd, NetSession *s, uint8_t type, uint16_t flags, const void *payload,
                   size_t len, double deadline, const char *peer, SgError *err);

/* One frame whose payload is the concatenation of n pieces (sent without
 * copying them, except that "encrypt" encrypts through s's scratch buffer).
 * what names the frame in I/O errors ("a ps reply"). */
int net_frame_sendv(int fd, NetSession *s, uint8_t type, uint16_t flags, const struct iovec *pieces,
                    int n, double deadline, const char *peer, const char *what, SgError *err);

/* Receiving a frame in parts, for payloads read straight into their place
 * (a parameter array): recv_header reads and validates the header (against
 * max_payload) and, when protected, its seq; recv_payload then reads the
 * payload's bytes in order, in as many calls as the caller likes (their
 * lengths summing to h->length), opening them in place; recv_end reads and
 * checks the tag. Bytes read by recv_payload are not to be trusted (applied,
 * returned to a user) until recv_end succeeds. Plain connections: recv_end
 * does nothing. */
int net_frame_recv_header(int fd, NetSession *s, uint32_t max_payload, double deadline,
                          const char *peer, NetFrameHeader *h, SgError *err);
int net_frame_recv_payload(int fd, NetSession *s, void *dst, size_t len, double deadline,
                           const char *peer, const char *what, SgError *err);
int net_frame_recv_end(int fd, NetSession *s, uint8_t type, double deadline, const char *peer,
                       SgError *err);

/* Receives one whole frame (header, payload, tag checked); *payload as for
 * net_frame_parser_take. */
int net_frame_recv(int fd, NetSession *s, uint32_t max_payload, double deadline, const char *peer,
                   NetFrameHeader *h, uint8_t **payload, SgError *err);

#endif /* NET_FRAME_H */
