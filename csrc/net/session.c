/*
 * session.c - HKDF-SHA256 session keys and AEAD frame protection (session.h) on OpenSSL
 * libcrypto: ChaCha20-Poly1305 with everything as associated data for "auth", AES-256-GCM
 * for "encrypt".
 */
#include "net/session.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <stdlib.h>
#include <string.h>

#include "common/sg_le.h"
#include "net/frame_type.h"

#define DIR_C2S     1u
#define DIR_S2C     2u
#define INFO_PREFIX "sparkgrad-session-v1 "

/* "OpenSSL <what> <step> failed: <queued error>" (step may be NULL). */
static int ossl_fail(SgError *err, const char *what, const char *step)
{
    unsigned long e = ERR_get_error();
    char buf[160] = "no OpenSSL error queued";
    if (e)
        ERR_error_string_n(e, buf, sizeof buf);
    ERR_clear_error();
    return sg_fail(err, SG_EIO, "OpenSSL %s%s%s failed: %s", what, step ? " " : "",
                   step ? step : "", buf);
}

int net_security_parse(const char *text, NetSecurity *mode, SgError *err)
{
    static const char *const names[] = {"none", "auth", "encrypt"};
    for (int i = 0; i < 3; i++) {
        if (text && strcmp(text, names[i]) == 0) {
            *mode = (NetSecurity)i;
            return SG_OK;
        }
    }
    return sg_fail(err, SG_EINVAL, "security must be 'none', 'auth' or 'encrypt', not '%s'",
                   text ? text : "(null)");
}

const char *net_security_name(NetSecurity mode)
{
    switch (mode) {
    case NET_SEC_NONE:
        return "none";
    case NET_SEC_AUTH:
        return "auth";
    case NET_SEC_ENCRYPT:
        return "encrypt";
    }
    return "unknown";
}

static int hkdf(const uint8_t *secret, size_t secret_len, const uint8_t *salt, size_t salt_len,
                const char *info, uint8_t out[NET_SESSION_KEY], SgError *err)
{
    EVP_KDF *kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
    if (kdf == NULL)
        return ossl_fail(err, "EVP_KDF_fetch(HKDF)", NULL);
    EVP_KDF_CTX *kctx = EVP_KDF_CTX_new(kdf);
    EVP_KDF_free(kdf);
    if (kctx == NULL)
        return ossl_fail(err, "EVP_KDF_CTX_new", NULL);
    OSSL_PARAM params[5];
    params[0] = OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)"SHA256", 0);
    params[1] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)secret, secret_len);
    params[2] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, (void *)salt, salt_len);
    params[3] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, (void *)info, strlen(info));
    params[4] = OSSL_PARAM_construct_end();
    int ok = EVP_KDF_derive(kctx, out, NET_SESSION_KEY, params) == 1;
    EVP_KDF_CTX_free(kctx);
    return ok ? SG_OK : ossl_fail(err, "HKDF-SHA256 derive", NULL);
}

/* "auth" only needs a MAC over bytes that travel in clear. Poly1305 (ChaCha20-Poly1305 given
 * the whole frame as associated data: a one-time Poly1305 key per nonce, RFC 8439) hashes
 * about 1.5x faster than GCM's GHASH on the CPUs we measured (bench/bench_security.py,
 * docs/guide/security.md); "encrypt" keeps AES-256-GCM, whose AES-NI cipher outruns ChaCha20. */
static const EVP_CIPHER *mode_cipher(NetSecurity mode)
{
    return mode == NET_SEC_AUTH ? EVP_chacha20_poly1305() : EVP_aes_256_gcm();
}

static const char *mode_aead(NetSecurity mode)
{
    return mode == NET_SEC_AUTH ? "ChaCha20-Poly1305 (MAC only)" : "AES-256-GCM";
}

static int dir_init(NetSessionDir *d, uint32_t direction, uint32_t send_dir, const uint8_t *secret,
                    size_t secret_len, const uint8_t *salt, NetSecurity mode, SgError *err)
{
    char info[64];
    snprintf(info, sizeof info, INFO_PREFIX "%s %s", direction == DIR_C2S ? "c2s" : "s2c",
             net_security_name(mode));
    d->direction = direction;
    d->aead = mode_aead(mode);
    d->seq = 0;
    d->active = 0;
    int rc = hkdf(secret, secret_len, salt, 2 * NET_SESSION_NONCE, info, d->key, err);
    if (rc < 0)
        return rc;
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    if (ctx == NULL)
        return ossl_fail(err, "EVP_CIPHER_CTX_new", NULL);
    d->ctx = ctx;
    /* Keyed once: each frame only sets its nonce. The send side encrypts, the receive side
     * decrypts (in NET_SEC_AUTH both only authenticate associated data). */
    const EVP_CIPHER *cipher = mode_cipher(mode);
    int ok = direction == send_dir ? EVP_EncryptInit_ex(ctx, cipher, NULL, d->key, NULL)
                                   : EVP_DecryptInit_ex(ctx, cipher, NULL, d->key, NULL);
    return ok == 1 ? SG_OK : ossl_fail(err, d->aead, "key setup");
}

int net_session_init(NetSession *s, NetSecurity mode, const uint8_t *secret, size_t secret_len,
                     const uint8_t server_nonce[NET_SESSION_NONCE],
                     const uint8_t client_nonce[NET_SESSION_NONCE], int is_server, SgError *err)
{
    memset(s, 0, sizeof *s);
    s->mode = mode;
    if (mode == NET_SEC_NONE)
        return SG_OK;
    if (mode != NET_SEC_AUTH && mode != NET_SEC_ENCRYPT)
        return sg_fail(err, SG_EINVAL, "unknown security mode %d", (int)mode);
    uint8_t salt[2 * NET_SESSION_NONCE];
    memcpy(salt, server_nonce, NET_SESSION_NONCE);
    memcpy(salt + NET_SESSION_NONCE, client_nonce, NET_SESSION_NONCE);
    uint32_t send_dir = is_server ? DIR_S2C : DIR_C2S, recv_dir = is_server ? DIR_C2S : DIR_S2C;
    int rc = dir_init(&s->send, send_dir, send_dir, secret, secret_len, salt, mode, err);
    if (rc == SG_OK)
        rc = dir_init(&s->recv, recv_dir, send_dir, secret, secret_len, salt, mode, err);
    OPENSSL_cleanse(salt, sizeof salt);
    if (rc < 0)
        net_session_free(s);
    return rc;
}

static void dir_free(NetSessionDir *d)
{
    if (d->ctx)
        EVP_CIPHER_CTX_free((EVP_CIPHER_CTX *)d->ctx);
    OPENSSL_cleanse(d, sizeof *d);
}

void net_session_free(NetSession *s)
{
    dir_free(&s->send);
    dir_free(&s->recv);
    if (s->scratch) {
        OPENSSL_cleanse(s->scratch, NET_SESSION_SCRATCH);
        free(s->scratch);
        s->scratch = NULL;
    }
    s->mode = NET_SEC_NONE;
}

int net_session_scratch(NetSession *s, uint8_t **buf, SgError *err)
{
    if (s->scratch == NULL && (s->scratch = malloc(NET_SESSION_SCRATCH)) == NULL)
        return sg_fail(err, SG_ENOMEM, "allocating a %u-byte encryption block",
                       NET_SESSION_SCRATCH);
    *buf = s->scratch;
    return SG_OK;
}

/* Starts the AEAD for the frame numbered d->seq: nonce, then header || seq as associated data. */
static int dir_begin(NetSessionDir *d, int encrypt, const uint8_t *header, size_t header_len,
                     SgError *err)
{
    EVP_CIPHER_CTX *ctx = (EVP_CIPHER_CTX *)d->ctx;
    uint8_t nonce[12], seq[NET_SESSION_SEQ];
    /* A frame begun and never ended (its I/O failed part-way) leaves the stream cut mid-frame;
     * another frame would also reuse its sequence number, and with it the AEAD's nonce. */
    if (d->active)
        return sg_fail(err, SG_ESTATE,
                       "frame %llu on this connection was cut off part-way; the connection cannot "
                       "carry another frame",
                       (unsigned long long)d->seq);
    sg_put_le32(nonce, d->direction);
    sg_put_le64(nonce + 4, d->seq);
    sg_put_le64(seq, d->seq);
    int outl = 0;
    int ok = encrypt ? EVP_EncryptInit_ex(ctx, NULL, NULL, NULL, nonce)
                     : EVP_DecryptInit_ex(ctx, NULL, NULL, NULL, nonce);
    if (ok != 1)
        return ossl_fail(err, d->aead, "init");
    if (header_len > 0 && EVP_CipherUpdate(ctx, NULL, &outl, header, (int)header_len) != 1)
        return ossl_fail(err, d->aead, "header");
    if (EVP_CipherUpdate(ctx, NULL, &outl, seq, NET_SESSION_SEQ) != 1)
        return ossl_fail(err, d->aead, "seq");
    d->active = 1;
    return SG_OK;
}

/* EVP's update takes an int length: feed large payloads in pieces. */
#define AEAD_PIECE ((size_t)1 << 30)

/* Mode "none": copies in to out (when they differ). */
static int dir_update(NetSessionDir *d, NetSecurity mode, const uint8_t *in, uint8_t *out,
                      size_t len, SgError *err)
{
    if (mode == NET_SEC_NONE) {
        if (out != in)
            memcpy(out, in, len);
        return SG_OK;
    }
    if (!d->active)
        return sg_fail(err, SG_ESTATE, "session update outside a frame");
    EVP_CIPHER_CTX *ctx = (EVP_CIPHER_CTX *)d->ctx;
    for (size_t off = 0; off < len;) {
        size_t n = len - off < AEAD_PIECE ? len - off : AEAD_PIECE;
        int outl = 0;
        if (mode == NET_SEC_AUTH) {
            if (EVP_CipherUpdate(ctx, NULL, &outl, in + off, (int)n) != 1)
                return ossl_fail(err, d->aead, "update");
            if (out != in)
                memcpy(out + off, in + off, n);
        } else if (EVP_CipherUpdate(ctx, out + off, &outl, in + off, (int)n) != 1 ||
                   (size_t)outl != n) {
            return ossl_fail(err, d->aead, "update");
        }
        off += n;
    }
    return SG_OK;
}

int net_session_seal_begin(NetSession *s, const uint8_t *header, size_t header_len,
                           uint8_t seq_out[NET_SESSION_SEQ], SgError *err)
{
    if (s->mode == NET_SEC_NONE)
        return SG_OK;
    sg_put_le64(seq_out, s->send.seq);
    return dir_begin(&s->send, 1, header, header_len, err);
}

int net_session_seal_update(NetSession *s, const uint8_t *in, uint8_t *out, size_t len,
                            SgError *err)
{
    return dir_update(&s->send, s->mode, in, out, len, err);
}

int net_session_seal_end(NetSession *s, uint8_t tag[NET_SESSION_TAG], SgError *err)
{
    if (s->mode == NET_SEC_NONE)
        return SG_OK;
    NetSessionDir *d = &s->send;
    EVP_CIPHER_CTX *ctx = (EVP_CIPHER_CTX *)d->ctx;
    int outl = 0;
    uint8_t none[16];
    if (!d->active)
        return sg_fail(err, SG_ESTATE, "session seal_end outside a frame");
    d->active = 0;
    if (EVP_EncryptFinal_ex(ctx, none, &outl) != 1 ||
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, NET_SESSION_TAG, tag) != 1)
        return ossl_fail(err, d->aead, "tag");
    d->seq++;
    return SG_OK;
}

int net_session_open_begin(NetSession *s, const uint8_t *header, size_t header_len,
                           const uint8_t seq_in[NET_SESSION_SEQ], const char *peer,
                           uint8_t frame_type, SgError *err)
{
    if (s->mode == NET_SEC_NONE)
        return SG_OK;
    NetSessionDir *d = &s->recv;
    uint64_t got = sg_get_le64(seq_in);
    if (got != d->seq)
        return sg_fail(
            err, SG_EAUTH, "%s: %s frame with sequence number %llu where %llu was due (%s)", peer,
            net_frame_type_name(frame_type), (unsigned long long)got, (unsigned long long)d->seq,
            got < d->seq ? "replayed or reordered" : "frames dropped or injected");
    return dir_begin(d, 0, header, header_len, err);
}

int net_session_open_update(NetSession *s, const uint8_t *in, uint8_t *out, size_t len,
                            SgError *err)
{
    return dir_update(&s->recv, s->mode, in, out, len, err);
}

int net_session_open_end(NetSession *s, const uint8_t tag[NET_SESSION_TAG], const char *peer,
                         uint8_t frame_type, SgError *err)
{
    if (s->mode == NET_SEC_NONE)
        return SG_OK;
    NetSessionDir *d = &s->recv;
    EVP_CIPHER_CTX *ctx = (EVP_CIPHER_CTX *)d->ctx;
    int outl = 0;
    uint8_t none[16];
    if (!d->active)
        return sg_fail(err, SG_ESTATE, "session open_end outside a frame");
    d->active = 0;
    if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, NET_SESSION_TAG, (void *)tag) != 1)
        return ossl_fail(err, d->aead, "set tag");
    if (EVP_DecryptFinal_ex(ctx, none, &outl) != 1) {
        ERR_clear_error();
        return sg_fail(err, SG_EAUTH,
                       "%s: %s frame %llu failed its integrity check (altered, injected or "
                       "truncated on the way, or the peer uses another security mode)",
                       peer, net_frame_type_name(frame_type), (unsigned long long)d->seq);
    }
    d->seq++;
    return SG_OK;
}
