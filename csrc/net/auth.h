/*
 * auth.h - mutual HMAC-SHA256 challenge-response on a per-cluster secret.
 *
 * Exchange (frames from frame.h), after the TCP connect:
 *   server -> client  AUTH_CHALLENGE  Ns (32 random bytes); flags: the server's security mode
 *   client -> server  AUTH_RESPONSE   Nc (32 random bytes) ||
 *                                     HMAC(K, "sparkgrad-auth-v1 client" || Ns || Nc);
 *                                     flags: the client's security mode
 *   server -> client  AUTH_OK         HMAC(K, "sparkgrad-auth-v1 server" || Nc || Ns),
 *                     or nothing: a client that failed is closed without a word.
 * The client checks the server's MAC too, so neither side talks to a peer
 * that does not hold K. MACs are compared in constant time. (A client still
 * reports an AUTH_FAIL reason from a server of an earlier release.)
 */
#ifndef NET_AUTH_H
#define NET_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"
#include "net/session.h"

#define NET_AUTH_NONCE NET_SESSION_NONCE /* the nonces key the session */
#define NET_AUTH_MAC   32
#define NET_SECRET_MIN 16
#define NET_SECRET_MAX 1024

/* SG_EINVAL unless NET_SECRET_MIN <= len <= NET_SECRET_MAX. */
int net_auth_check_secret(size_t len, SgError *err);

/* Fills out with len cryptographically random bytes (OpenSSL RAND_bytes). */
int net_auth_random(uint8_t *out, size_t len, SgError *err);

/* HMAC-SHA256(secret, label || a || b) with a, b of NET_AUTH_NONCE bytes. */
int net_auth_mac(const uint8_t *secret, size_t secret_len, const char *label, const uint8_t *a,
                 const uint8_t *b, uint8_t out[NET_AUTH_MAC], SgError *err);

/* Every handshake below takes the node's security mode (session.h), which
 * travels in the flags of AUTH_CHALLENGE (the server's) and AUTH_RESPONSE
 * (the client's): a peer with another mode is refused with SG_EAUTH naming
 * both. On success *session (which may be NULL only for NET_SEC_NONE) holds
 * the connection's keys; the caller frees it with net_session_free. */

/* Server side, no I/O: checks an AUTH_RESPONSE (its flags and payload)
 * against the challenge; on success fills the AUTH_OK payload and keys
 * *session. SG_EAUTH names the peer. */
int net_auth_server_check(const uint8_t *secret, size_t secret_len, NetSecurity mode,
                          const uint8_t challenge[NET_AUTH_NONCE], uint16_t resp_flags,
                          const uint8_t *resp, size_t resp_len, uint8_t ok_payload[NET_AUTH_MAC],
                          const char *peer, NetSession *session, SgError *err);

/* Blocking handshakes (bounded by deadline) for connection-per-thread
 * servers and for clients. */
int net_auth_server(int fd, const uint8_t *secret, size_t secret_len, NetSecurity mode,
                    double deadline, const char *peer, NetSession *session, SgError *err);
int net_auth_client(int fd, const uint8_t *secret, size_t secret_len, NetSecurity mode,
                    double deadline, const char *peer, NetSession *session, SgError *err);

/* Connects to host:port and authenticates before deadline (*fd_out open
 * only on success). A server at its cap of unauthenticated connections
 * (accept.h) closes a connection before sending the challenge: that is
 * retried (10 ms, doubling to 200 ms) until the deadline, so a burst of
 * clients from one address (a big executor host, a NAT) all get in.
 * connect_context prefixes errors of the connect itself ("feed: "). */
int net_connect_auth(const char *host, int port, const uint8_t *secret, size_t secret_len,
                     NetSecurity mode, double deadline, int *fd_out, NetSession *session,
                     const char *peer, const char *connect_context, SgError *err);

/* The labels that separate the two directions' MACs. */
#define NET_AUTH_LABEL_CLIENT "sparkgrad-auth-v1 client"
#define NET_AUTH_LABEL_SERVER "sparkgrad-auth-v1 server"

#endif /* NET_AUTH_H */
