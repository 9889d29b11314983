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
 */
#ifndef NET_FRAME_H
#define NET_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"

#define NET_FRAME_MAGIC       0x4E544753u
#define NET_FRAME_VERSION     1
#define NET_FRAME_HEADER_SIZE 12
#define NET_FRAME_MAX_DEFAULT (64u << 20)
#define NET_FRAME_MAX_UNAUTH  256u

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
    uint8_t hdr[NET_FRAME_HEADER_SIZE];
    size_t hdr_have;
    int have_header;
    NetFrameHeader header;
    uint8_t *payload; /* header.length bytes (+1 for a NUL), allocated after validation */
    size_t payload_have;
} NetFrameParser;

void net_frame_parser_init(NetFrameParser *p, uint32_t max_payload);
void net_frame_parser_free(NetFrameParser *p);

/* Consumes up to len bytes of buf, setting *consumed. Returns 1 when a whole
 * frame is ready (read it with net_frame_parser_take before feeding more),
 * 0 when more bytes are needed, or a negative status (the parser must then
 * be discarded). */
int net_frame_parser_feed(NetFrameParser *p, const uint8_t *buf, size_t len, size_t *consumed,
                          SgError *err);

/* Hands over the completed frame: *payload is malloc'd (NUL-terminated,
 * possibly NULL for length 0) and owned by the caller. Resets the parser. */
void net_frame_parser_take(NetFrameParser *p, NetFrameHeader *h, uint8_t **payload);

/* Blocking-with-deadline frame I/O on a non-blocking socket. */
int net_frame_send(int fd, uint8_t type, uint16_t flags, const void *payload, size_t len,
                   double deadline, const char *peer, SgError *err);

/* Receives one header (validated against max_payload); the caller then reads
 * h->length payload bytes itself (e.g. straight into a parameter array). */
int net_frame_recv_header(int fd, uint32_t max_payload, double deadline, const char *peer,
                          NetFrameHeader *h, SgError *err);

/* Receives one whole frame; *payload as for net_frame_parser_take. */
int net_frame_recv(int fd, uint32_t max_payload, double deadline, const char *peer,
                   NetFrameHeader *h, uint8_t **payload, SgError *err);

/* A human name for a frame type ("json", "unknown"). */
const char *net_frame_type_name(uint8_t type);

#endif /* NET_FRAME_H */
