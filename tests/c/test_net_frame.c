/* test_net_frame.c - wire frame encode/decode, the resumable parser, the
 * HMAC of the auth handshake (against vectors from Python's hmac module) and
 * the handshake itself over a socketpair. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "net/auth.h"
#include "net/frame.h"
#include "net/sock.h"

static void test_header_layout_is_little_endian(void)
{
    uint8_t h[NET_FRAME_HEADER_SIZE];
    net_frame_header_encode(h, NET_FRAME_JSON, 0x0102, 0x0A0B0C0Du);
    static const uint8_t expect[NET_FRAME_HEADER_SIZE] = {'S',  'G',  'T',  'N',  2,    10,
                                                          0x02, 0x01, 0x0D, 0x0C, 0x0B, 0x0A};
    CHECK(memcmp(h, expect, sizeof expect) == 0);
    NetFrameHeader d;
    SgError err;
    CHECK(net_frame_header_decode(h, sizeof h, 0xFFFFFFFFu, &d, &err) == 0);
    CHECK(d.type == NET_FRAME_JSON && d.flags == 0x0102 && d.length == 0x0A0B0C0Du);
}

static void test_decode_rejects_bad_headers(void)
{
    uint8_t h[NET_FRAME_HEADER_SIZE];
    NetFrameHeader d;
    SgError err;
    net_frame_header_encode(h, NET_FRAME_JSON, 0, 101);
    CHECK(net_frame_header_decode(h, sizeof h, 100, &d, &err) == SG_EFRAME);
    CHECK(strstr(err.msg, "101 payload bytes, above the maximum of 100") != NULL);
    CHECK(net_frame_header_decode(h, sizeof h - 1, 1000, &d, &err) == SG_EPROTO);
    h[0] ^= 0xFF;
    CHECK(net_frame_header_decode(h, sizeof h, 1000, &d, &err) == SG_EPROTO);
    CHECK(strstr(err.msg, "bad frame magic") != NULL);
    net_frame_header_encode(h, 99, 0, 1);
    CHECK(net_frame_header_decode(h, sizeof h, 1000, &d, &err) == SG_EPROTO);
    net_frame_header_encode(h, NET_FRAME_JSON, 0, 1);
    h[4] = 1; /* a peer before embedding rows on the ps wire: both versions named */
    CHECK(net_frame_header_decode(h, sizeof h, 1000, &d, &err) == SG_EPROTO);
    CHECK(strstr(err.msg, "unsupported frame version 1 at byte 4 (this build speaks 2") != NULL);
}

static void test_parser_resumes_byte_by_byte(void)
{
    uint8_t buf[2 * NET_FRAME_HEADER_SIZE + 5];
    net_frame_header_encode(buf, NET_FRAME_JSON, 7, 5);
    memcpy(buf + NET_FRAME_HEADER_SIZE, "hello", 5);
    net_frame_header_encode(buf + NET_FRAME_HEADER_SIZE + 5, NET_FRAME_HEARTBEAT, 0, 0);
    NetFrameParser p;
    net_frame_parser_init(&p, 64);
    SgError err;
    int frames = 0;
    for (size_t i = 0; i < sizeof buf; i++) {
        size_t used = 0;
        int rc = net_frame_parser_feed(&p, buf + i, 1, &used, &err);
        CHECK(rc >= 0 && used == 1);
        if (rc == 1) {
            NetFrameHeader h;
            uint8_t *payload;
            net_frame_parser_take(&p, &h, &payload);
            if (frames == 0)
                CHECK(h.type == NET_FRAME_JSON && h.flags == 7 && h.length == 5 &&
                      strcmp((char *)payload, "hello") == 0);
            else
                CHECK(h.type == NET_FRAME_HEARTBEAT && h.length == 0);
            free(payload);
            frames++;
        }
    }
    CHECK(frames == 2);
    net_frame_parser_free(&p);
}

static void test_parser_refuses_oversize_before_payload(void)
{
    uint8_t h[NET_FRAME_HEADER_SIZE];
    net_frame_header_encode(h, NET_FRAME_PS, 0, 0xFFFFFFFFu);
    NetFrameParser p;
    net_frame_parser_init(&p, NET_FRAME_MAX_DEFAULT);
    SgError err;
    size_t used;
    CHECK(net_frame_parser_feed(&p, h, sizeof h, &used, &err) == SG_EFRAME);
    CHECK(p.payload == NULL);
    net_frame_parser_free(&p);
}

static void from_hex(const char *hex, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sscanf(hex + 2 * i, "%2hhx", &out[i]);
}

static void test_hmac_matches_reference_vectors(void)
{
    uint8_t secret[32], a[32], b[32], mac[32], expect[32];
    for (int i = 0; i < 32; i++)
        secret[i] = (uint8_t)i, a[i] = 1, b[i] = 2;
    SgError err;
    /* hmac.new(bytes(range(32)), b"sparkgrad-auth-v1 client" + a + b, sha256) */
    CHECK(net_auth_mac(secret, 32, NET_AUTH_LABEL_CLIENT, a, b, mac, &err) == 0);
    from_hex("e7e52e4d3eb1a368a7b90abf39b26626ccad9297ee5c620fb671fe1ae9adb204", expect, 32);
    CHECK(memcmp(mac, expect, 32) == 0);
    CHECK(net_auth_mac(secret, 32, NET_AUTH_LABEL_SERVER, b, a, mac, &err) == 0);
    from_hex("85ce0ae05d5b1c6f52ca7dec655504df22eead31ff3597fe479cccaf2d6fb5d7", expect, 32);
    CHECK(memcmp(mac, expect, 32) == 0);
}

typedef struct {
    int fd;
    const uint8_t *secret;
    int rc;
    SgError err;
} Side;

static void *server_side(void *arg)
{
    Side *s = arg;
    s->rc =
        net_auth_server(s->fd, s->secret, 32, NET_SEC_NONE, sg_now() + 5, "client", NULL, &s->err);
    if (s->rc < 0)
        shutdown(s->fd, SHUT_RDWR); /* as every server closes a peer that failed */
    return NULL;
}

static void handshake(const uint8_t *server_secret, const uint8_t *client_secret, int *src,
                      int *crc, SgError *cerr)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) {
        failures++;
        return;
    }
    Side s = {.fd = sv[0], .secret = server_secret};
    pthread_t t;
    pthread_create(&t, NULL, server_side, &s);
    *crc =
        net_auth_client(sv[1], client_secret, 32, NET_SEC_NONE, sg_now() + 5, "server", NULL, cerr);
    pthread_join(t, NULL);
    *src = s.rc;
    close(sv[0]);
    close(sv[1]);
}

static void test_handshake_is_mutual(void)
{
    uint8_t k1[32], k2[32];
    SgError err;
    CHECK(net_auth_random(k1, 32, &err) == 0 && net_auth_random(k2, 32, &err) == 0);
    CHECK(memcmp(k1, k2, 32) != 0);
    int src, crc;
    handshake(k1, k1, &src, &crc, &err);
    CHECK(src == 0 && crc == 0);
    handshake(k1, k2, &src, &crc, &err);
    CHECK(src == SG_EAUTH && crc == SG_EAUTH);
    CHECK(strstr(err.msg, "refused our credentials") != NULL);
    CHECK(net_auth_check_secret(8, &err) == SG_EINVAL);
}

int main(void)
{
    test_header_layout_is_little_endian();
    test_decode_rejects_bad_headers();
    test_parser_resumes_byte_by_byte();
    test_parser_refuses_oversize_before_payload();
    test_hmac_matches_reference_vectors();
    test_handshake_is_mutual();
    return check_report("test_net_frame");
}
