/*
 * auth.c - the HMAC-SHA256 handshake of auth.h on OpenSSL libcrypto.
 *
 * Each end announces its security mode in its handshake frame's flags and
 * refuses a peer with another; on success the caller's NetSession (session.h)
 * is keyed from the secret and both nonces. Not here: protecting the frames
 * that follow (frame.c with session.c).
 */
#include "net/auth.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

#include "net/frame.h"
#include "net/session.h"
#include "net/sock.h"

int net_auth_check_secret(size_t len, SgError *err)
{
    if (len < NET_SECRET_MIN || len > NET_SECRET_MAX)
        return sg_fail(err, SG_EINVAL,
                       "cluster secret must be %d..%d bytes (use os.urandom(32)), got %zu bytes",
                       NET_SECRET_MIN, NET_SECRET_MAX, len);
    return SG_OK;
}

int net_auth_random(uint8_t *out, size_t len, SgError *err)
{
    if (RAND_bytes(out, (int)len) != 1)
        return sg_fail(err, SG_EIO,
                       "OpenSSL RAND_bytes failed to produce %zu random bytes (error %lu)", len,
                       ERR_get_error());
    return SG_OK;
}

int net_auth_mac(const uint8_t *secret, size_t secret_len, const char *label, const uint8_t *a,
                 const uint8_t *b, uint8_t out[NET_AUTH_MAC], SgError *err)
{
    uint8_t msg[64 + 2 * NET_AUTH_NONCE];
    size_t ll = strlen(label);
    if (ll > 64)
        return sg_fail(err, SG_EINVAL, "auth label '%s' too long", label);
    memcpy(msg, label, ll);
    memcpy(msg + ll, a, NET_AUTH_NONCE);
    memcpy(msg + ll + NET_AUTH_NONCE, b, NET_AUTH_NONCE);
    unsigned int mlen = 0;
    if (HMAC(EVP_sha256(), secret, (int)secret_len, msg, ll + 2 * NET_AUTH_NONCE, out, &mlen) ==
            NULL ||
        mlen != NET_AUTH_MAC)
        return sg_fail(err, SG_EIO, "OpenSSL HMAC-SHA256 failed (error %lu)", ERR_get_error());
    return SG_OK;
}

/* The mode each end announces in its handshake frame's flags must be the other's. */
static int mode_check(uint16_t theirs, NetSecurity ours, const char *who, const char *peer,
                      SgError *err)
{
    if (theirs == (uint16_t)ours)
        return SG_OK;
    return sg_fail(err, SG_EAUTH,
                   "%s %s uses security='%s' and this node security='%s': every node of a "
                   "cluster must use the same security mode",
                   who, peer,
                   theirs <= NET_SEC_ENCRYPT ? net_security_name((NetSecurity)theirs) : "?",
                   net_security_name(ours));
}

static int start_session(NetSession *session, NetSecurity mode, const uint8_t *secret,
                         size_t secret_len, const uint8_t *server_nonce,
                         const uint8_t *client_nonce, int is_server, SgError *err)
{
    if (session == NULL)
        return mode == NET_SEC_NONE
                   ? SG_OK
                   : sg_fail(err, SG_EINVAL, "security='%s' needs a session to keep its keys",
                             net_security_name(mode));
    return net_session_init(session, mode, secret, secret_len, server_nonce, client_nonce,
                            is_server, err);
}

int net_auth_server_check(const uint8_t *secret, size_t secret_len, NetSecurity mode,
                          const uint8_t challenge[NET_AUTH_NONCE], uint16_t resp_flags,
                          const uint8_t *resp, size_t resp_len, uint8_t ok_payload[NET_AUTH_MAC],
                          const char *peer, NetSession *session, SgError *err)
{
    if (resp_len != NET_AUTH_NONCE + NET_AUTH_MAC)
        return sg_fail(err, SG_EAUTH, "auth response from %s has %zu bytes, expected %d", peer,
                       resp_len, NET_AUTH_NONCE + NET_AUTH_MAC);
    uint8_t expect[NET_AUTH_MAC];
    int rc = net_auth_mac(secret, secret_len, NET_AUTH_LABEL_CLIENT, challenge, resp, expect, err);
    if (rc < 0)
        return rc;
    if (CRYPTO_memcmp(expect, resp + NET_AUTH_NONCE, NET_AUTH_MAC) != 0)
        return sg_fail(
            err, SG_EAUTH,
            "client %s failed the HMAC challenge (it does not hold this cluster's secret)", peer);
    if ((rc = mode_check(resp_flags, mode, "client", peer, err)) < 0 ||
        (rc = net_auth_mac(secret, secret_len, NET_AUTH_LABEL_SERVER, resp, challenge, ok_payload,
                           err)) < 0)
        return rc;
    return start_session(session, mode, secret, secret_len, challenge, resp, 1, err);
}

int net_auth_server(int fd, const uint8_t *secret, size_t secret_len, NetSecurity mode,
                    double deadline, const char *peer, NetSession *session, SgError *err)
{
    uint8_t challenge[NET_AUTH_NONCE], ok[NET_AUTH_MAC];
    int rc = net_auth_random(challenge, sizeof challenge, err);
    if (rc < 0)
        return rc;
    rc = net_frame_send(fd, NULL, NET_FRAME_AUTH_CHALLENGE, (uint16_t)mode, challenge,
                        sizeof challenge, deadline, peer, err);
    if (rc < 0)
        return rc;
    NetFrameHeader h;
    uint8_t *resp = NULL;
    rc = net_frame_recv(fd, NULL, NET_FRAME_MAX_UNAUTH, deadline, peer, &h, &resp, err);
    if (rc < 0)
        return sg_context(err, "authenticating client: ");
    if (h.type != NET_FRAME_AUTH_RESPONSE)
        rc = sg_fail(err, SG_EAUTH, "client %s sent a %s frame instead of an auth response", peer,
                     net_frame_type_name(h.type));
    else
        rc = net_auth_server_check(secret, secret_len, mode, challenge, h.flags, resp, h.length, ok,
                                   peer, session, err);
    free(resp);
    if (rc < 0) /* nothing but the close goes to a peer that did not authenticate */
        return rc;
    rc = net_frame_send(fd, NULL, NET_FRAME_AUTH_OK, 0, ok, sizeof ok, deadline, peer, err);
    if (rc < 0 && session != NULL)
        net_session_free(session);
    return rc;
}

int net_auth_client(int fd, const uint8_t *secret, size_t secret_len, NetSecurity mode,
                    double deadline, const char *peer, NetSession *session, SgError *err)
{
    NetFrameHeader h;
    uint8_t *buf = NULL;
    uint8_t challenge[NET_AUTH_NONCE], resp[NET_AUTH_NONCE + NET_AUTH_MAC], expect[NET_AUTH_MAC];
    int rc = net_frame_recv(fd, NULL, NET_FRAME_MAX_UNAUTH, deadline, peer, &h, &buf, err);
    if (rc < 0)
        return sg_context(err, "waiting for the auth challenge: ");
    if (h.type != NET_FRAME_AUTH_CHALLENGE || h.length != NET_AUTH_NONCE) {
        rc = sg_fail(err, SG_EPROTO, "%s sent a %u-byte %s frame instead of an auth challenge",
                     peer, h.length, net_frame_type_name(h.type));
        goto cleanup;
    }
    if ((rc = mode_check(h.flags, mode, "server", peer, err)) < 0)
        goto cleanup;
    memcpy(challenge, buf, NET_AUTH_NONCE);
    if ((rc = net_auth_random(resp, NET_AUTH_NONCE, err)) < 0 ||
        (rc = net_auth_mac(secret, secret_len, NET_AUTH_LABEL_CLIENT, challenge, resp,
                           resp + NET_AUTH_NONCE, err)) < 0 ||
        (rc = net_frame_send(fd, NULL, NET_FRAME_AUTH_RESPONSE, (uint16_t)mode, resp, sizeof resp,
                             deadline, peer, err)) < 0)
        goto cleanup;
    free(buf);
    buf = NULL;
    rc = net_frame_recv(fd, NULL, NET_FRAME_MAX_UNAUTH, deadline, peer, &h, &buf, err);
    if (rc == SG_EPEER) {
        rc = sg_fail(err, SG_EAUTH,
                     "%s closed the connection during authentication: it refused our credentials "
                     "(a wrong cluster secret, or a secret of an earlier start of the cluster)",
                     peer);
        goto cleanup;
    }
    if (rc < 0)
        goto cleanup;
    if (h.type == NET_FRAME_AUTH_FAIL) {
        rc = sg_fail(err, SG_EAUTH, "%s rejected our credentials: %.200s", peer, (char *)buf);
        goto cleanup;
    }
    if (h.type != NET_FRAME_AUTH_OK || h.length != NET_AUTH_MAC) {
        rc = sg_fail(err, SG_EPROTO, "%s sent a %u-byte %s frame instead of the auth result", peer,
                     h.length, net_frame_type_name(h.type));
        goto cleanup;
    }
    if ((rc = net_auth_mac(secret, secret_len, NET_AUTH_LABEL_SERVER, resp, challenge, expect,
                           err)) < 0)
        goto cleanup;
    if (CRYPTO_memcmp(expect, buf, NET_AUTH_MAC) != 0)
        rc = sg_fail(err, SG_EAUTH,
                     "server %s failed to prove it holds the cluster secret (wrong secret or "
                     "impostor)",
                     peer);
    else
        rc = start_session(session, mode, secret, secret_len, challenge, resp, 0, err);
cleanup:
    free(buf);
    return rc;
}

/* 1 when the server closed fd before sending a byte (waited for until
 * deadline), 0 otherwise (data, or nothing yet: the handshake reports it). */
static int closed_before_challenge(int fd, double deadline)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n;
    do {
        n = poll(&p, 1, sg_poll_ms(deadline));
    } while (n < 0 && errno == EINTR);
    if (n != 1)
        return 0;
    char b;
    ssize_t r;
    do {
        r = recv(fd, &b, 1, MSG_PEEK);
    } while (r < 0 && errno == EINTR);
    return r == 0 || (r < 0 && errno == ECONNRESET);
}

int net_connect_auth(const char *host, int port, const uint8_t *secret, size_t secret_len,
                     NetSecurity mode, double deadline, int *fd_out, NetSession *session,
                     const char *peer, const char *connect_context, SgError *err)
{
    double backoff = 0.01, first = sg_now();
    for (int attempt = 1;; attempt++) {
        int fd = -1;
        int rc = net_connect(host, port, deadline, &fd, err);
        if (rc < 0)
            return sg_context(err, "%s", connect_context);
        if (closed_before_challenge(fd, deadline)) {
            net_close(&fd);
            if (sg_now() + backoff >= deadline)
                return sg_fail(err, SG_EPEER,
                               "%s closed each of %d connections before its auth challenge over "
                               "%.1f s (a server at its cap of unauthenticated connections, "
                               "flooded, or not a sparkgrad server)",
                               peer, attempt, sg_now() - first);
            poll(NULL, 0, (int)(backoff * 1000.0));
            backoff = backoff * 2 > 0.2 ? 0.2 : backoff * 2;
            continue;
        }
        rc = net_auth_client(fd, secret, secret_len, mode, deadline, peer, session, err);
        if (rc < 0) {
            net_close(&fd);
            return rc;
        }
        *fd_out = fd;
        return SG_OK;
    }
}
