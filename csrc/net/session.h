/*
 * session.h - per-connection frame protection after the handshake of auth.h.
 *
 * The handshake proves that both ends hold the cluster secret K; this module
 * protects every frame that follows. From K and the two handshake nonces
 * (Ns, Nc) HKDF-SHA256 derives one 32-byte key per direction:
 *   salt = Ns || Nc, ikm = K, info = "sparkgrad-session-v1 " ("c2s" | "s2c") || mode
 * so the keys differ per connection, per direction and per mode. Each frame is
 * protected with an AEAD under its direction's key (ChaCha20-Poly1305 for
 * NET_SEC_AUTH, AES-256-GCM for NET_SEC_ENCRYPT), with the 96-bit nonce
 *   direction (u32 LE: 1 client->server, 2 server->client) || seq (u64 LE)
 * where seq counts the frames sent in that direction from 0. The associated
 * data is the caller's frame header followed by the seq; the payload is
 *   NET_SEC_AUTH     associated data too (integrity only: it travels in clear)
 *   NET_SEC_ENCRYPT  encrypted (confidentiality and integrity)
 * and a 16-byte tag follows it. The receiver checks the seq it reads against
 * the one it expects before anything else, so a replayed, reordered or dropped
 * frame is named as such; an altered or injected frame fails its tag.
 *
 * The calls are streaming (begin, update over the payload in any split, end)
 * so a large payload is protected as it is sent or received, with no copy.
 * Payload bytes opened by update must not be used before open_end succeeds.
 * What this module does not do: put bytes on a socket (frame.h) or agree on
 * the mode with the peer (the handshake's caller).
 */
#ifndef NET_SESSION_H
#define NET_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"

#define NET_SESSION_NONCE 32 /* each handshake nonce (auth.h) */
#define NET_SESSION_KEY   32
#define NET_SESSION_TAG   16
#define NET_SESSION_SEQ   8

typedef enum NetSecurity {
    NET_SEC_NONE = 0,    /* no protection after the handshake (explicit opt-out) */
    NET_SEC_AUTH = 1,    /* integrity: Poly1305 tag over header, seq and payload */
    NET_SEC_ENCRYPT = 2, /* AEAD: AES-256-GCM encryption of the payload as well */
} NetSecurity;

typedef struct NetSessionDir {
    uint8_t key[NET_SESSION_KEY];
    uint32_t direction;
    const char *aead; /* the AEAD's name, for errors */
    uint64_t seq;     /* next frame's sequence number */
    int active;       /* between begin and end */
    void *ctx;        /* EVP_CIPHER_CTX, keyed once */
} NetSessionDir;

typedef struct NetSession {
    NetSecurity mode;
    NetSessionDir send, recv;
    uint8_t *scratch; /* NET_SESSION_SCRATCH bytes for sealing "encrypt" frames, lazily */
} NetSession;

/* The block in which net_frame_sendv encrypts a payload before writing it. */
#define NET_SESSION_SCRATCH (64u << 10)

/* 1 when frames on this connection are protected (s not NULL, mode not none). */
static inline int net_session_on(const NetSession *s)
{
    return s != NULL && s->mode != NET_SEC_NONE;
}

/* s's scratch block (allocated on first use; freed by net_session_free). */
int net_session_scratch(NetSession *s, uint8_t **buf, SgError *err);

/* The mode of every server and client unless the caller names one; chosen by
 * bench/bench_security.py (its cost against "none": docs/guide/security.md). */
#define NET_SEC_DEFAULT NET_SEC_AUTH

/* "none", "auth", "encrypt" -> mode (SG_EINVAL naming the text otherwise). */
int net_security_parse(const char *text, NetSecurity *mode, SgError *err);
const char *net_security_name(NetSecurity mode);

/* Derives the two directions' keys. is_server selects which direction is
 * "send". NET_SEC_NONE leaves the session inert (every call a no-op). */
int net_session_init(NetSession *s, NetSecurity mode, const uint8_t *secret, size_t secret_len,
                     const uint8_t server_nonce[NET_SESSION_NONCE],
                     const uint8_t client_nonce[NET_SESSION_NONCE], int is_server, SgError *err);

/* Wipes the keys (OPENSSL_cleanse) and frees the cipher contexts; idempotent. */
void net_session_free(NetSession *s);

/* Sealing one outgoing frame: begin writes the frame's seq (to send after the
 * header, before the payload), update protects payload bytes in order (out
 * may equal in; with NET_SEC_AUTH out receives a copy of in), end writes the
 * tag (to send after the payload). */
int net_session_seal_begin(NetSession *s, const uint8_t *header, size_t header_len,
                           uint8_t seq_out[NET_SESSION_SEQ], SgError *err);
int net_session_seal_update(NetSession *s, const uint8_t *in, uint8_t *out, size_t len,
                            SgError *err);
int net_session_seal_end(NetSession *s, uint8_t tag[NET_SESSION_TAG], SgError *err);

/* Opening one incoming frame: begin checks the seq read after the header
 * (SG_EAUTH naming peer, frame type, expected and received seq), update
 * opens payload bytes in order, end checks the tag (SG_EAUTH naming peer,
 * frame type and seq). After any failure the session is unusable: the
 * caller closes the connection. */
int net_session_open_begin(NetSession *s, const uint8_t *header, size_t header_len,
                           const uint8_t seq_in[NET_SESSION_SEQ], const char *peer,
                           uint8_t frame_type, SgError *err);
int net_session_open_update(NetSession *s, const uint8_t *in, uint8_t *out, size_t len,
                            SgError *err);
int net_session_open_end(NetSession *s, const uint8_t tag[NET_SESSION_TAG], const char *peer,
                         uint8_t frame_type, SgError *err);

#endif /* NET_SESSION_H */
