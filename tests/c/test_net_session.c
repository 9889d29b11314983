/*
 * test_net_session.c - session keys and frame protection (net/session.h): round trips in
 * both modes and directions, in any split, and every tampering named.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "net/frame.h"
#include "net/session.h"

static const uint8_t SECRET[32] = "0123456789abcdef0123456789abcde";
static uint8_t NS[NET_SESSION_NONCE], NC[NET_SESSION_NONCE];

typedef struct Sealed {
    uint8_t hdr[NET_FRAME_HEADER_SIZE], seq[NET_SESSION_SEQ], tag[NET_SESSION_TAG];
    uint8_t *body;
    size_t len;
} Sealed;

static void seal(NetSession *s, const uint8_t *payload, size_t len, size_t piece, Sealed *f)
{
    SgError err;
    net_frame_header_encode(f->hdr, NET_FRAME_PS, 0, (uint32_t)len);
    f->body = malloc(len ? len : 1);
    f->len = len;
    CHECK(net_session_seal_begin(s, f->hdr, sizeof f->hdr, f->seq, &err) == SG_OK);
    for (size_t off = 0; off < len; off += piece) {
        size_t n = len - off < piece ? len - off : piece;
        CHECK(net_session_seal_update(s, payload + off, f->body + off, n, &err) == SG_OK);
    }
    CHECK(net_session_seal_end(s, f->tag, &err) == SG_OK);
}

/* Opens f in place; returns the status and leaves the message in err. */
static int open_frame(NetSession *s, Sealed *f, size_t piece, SgError *err)
{
    int rc = net_session_open_begin(s, f->hdr, sizeof f->hdr, f->seq, "10.0.0.2:7077", NET_FRAME_PS,
                                    err);
    if (rc < 0)
        return rc;
    for (size_t off = 0; off < f->len; off += piece) {
        size_t n = f->len - off < piece ? f->len - off : piece;
        if ((rc = net_session_open_update(s, f->body + off, f->body + off, n, err)) < 0)
            return rc;
    }
    return net_session_open_end(s, f->tag, "10.0.0.2:7077", NET_FRAME_PS, err);
}

static void pair(NetSecurity mode, NetSession *server, NetSession *client)
{
    SgError err;
    CHECK(net_session_init(server, mode, SECRET, sizeof SECRET, NS, NC, 1, &err) == SG_OK);
    CHECK(net_session_init(client, mode, SECRET, sizeof SECRET, NS, NC, 0, &err) == SG_OK);
}

static void test_round_trips(NetSecurity mode)
{
    NetSession srv, cli;
    pair(mode, &srv, &cli);
    size_t len = 100003;
    uint8_t *payload = malloc(len);
    for (size_t i = 0; i < len; i++)
        payload[i] = (uint8_t)(i * 131 + 7);
    for (int k = 0; k < 3; k++) { /* client -> server, split differently on each side */
        Sealed f;
        seal(&cli, payload, len, k == 0 ? len : 4093, &f);
        if (mode == NET_SEC_ENCRYPT)
            CHECK(memcmp(f.body, payload, len) != 0);
        else
            CHECK(memcmp(f.body, payload, len) == 0);
        SgError err;
        CHECK(open_frame(&srv, &f, k == 1 ? len : 1000, &err) == SG_OK);
        CHECK(memcmp(f.body, payload, len) == 0);
        free(f.body);
    }
    Sealed back; /* and server -> client, an empty frame */
    seal(&srv, payload, 0, 1, &back);
    SgError err;
    CHECK(open_frame(&cli, &back, 1, &err) == SG_OK);
    free(back.body);
    CHECK(srv.recv.seq == 3 && cli.send.seq == 3 && srv.send.seq == 1);
    free(payload);
    net_session_free(&srv);
    net_session_free(&cli);
    static const uint8_t zero[NET_SESSION_KEY];
    CHECK(memcmp(srv.send.key, zero, sizeof zero) == 0 && srv.send.ctx == NULL);
}

static void test_tampering_is_named(NetSecurity mode)
{
    uint8_t payload[64];
    memset(payload, 0x5A, sizeof payload);
    SgError err;
    struct {
        const char *what;
        int field; /* 0 body, 1 header, 2 tag */
    } cases[] = {{"altered payload", 0}, {"altered header", 1}, {"altered tag", 2}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        NetSession srv, cli;
        pair(mode, &srv, &cli);
        Sealed f;
        seal(&cli, payload, sizeof payload, sizeof payload, &f);
        uint8_t *p = cases[c].field == 0 ? f.body : cases[c].field == 1 ? f.hdr + 6 : f.tag;
        p[0] ^= 0x01;
        CHECK(open_frame(&srv, &f, 16, &err) == SG_EAUTH);
        CHECK(strstr(err.msg, "10.0.0.2:7077: ps frame 0 failed its integrity check") != NULL);
        free(f.body);
        net_session_free(&srv);
        net_session_free(&cli);
    }
    /* replayed, then skipped ahead */
    NetSession srv, cli;
    pair(mode, &srv, &cli);
    Sealed a, b, c;
    seal(&cli, payload, sizeof payload, 64, &a);
    seal(&cli, payload, sizeof payload, 64, &b);
    seal(&cli, payload, sizeof payload, 64, &c);
    Sealed replay = a;
    replay.body = malloc(a.len);
    memcpy(replay.body, a.body, a.len);
    CHECK(open_frame(&srv, &a, 64, &err) == SG_OK);
    CHECK(open_frame(&srv, &replay, 64, &err) == SG_EAUTH);
    CHECK(strstr(err.msg, "sequence number 0 where 1 was due (replayed or reordered)") != NULL);
    CHECK(open_frame(&srv, &c, 64, &err) == SG_EAUTH);
    CHECK(strstr(err.msg, "sequence number 2 where 1 was due (frames dropped or injected)") !=
          NULL);
    /* a frame whose seq field was rewritten to the due number still fails its tag */
    memcpy(c.seq, b.seq, NET_SESSION_SEQ);
    CHECK(open_frame(&srv, &c, 64, &err) == SG_EAUTH);
    CHECK(strstr(err.msg, "failed its integrity check") != NULL);
    free(a.body), free(b.body), free(c.body), free(replay.body);
    net_session_free(&srv);
    net_session_free(&cli);
}

static void test_keys_differ_by_secret_nonce_and_mode(void)
{
    uint8_t payload[32] = {1, 2, 3};
    SgError err;
    NetSession srv, cli, other;
    pair(NET_SEC_AUTH, &srv, &cli);
    CHECK(memcmp(srv.send.key, cli.recv.key, NET_SESSION_KEY) == 0);
    CHECK(memcmp(srv.send.key, srv.recv.key, NET_SESSION_KEY) != 0);
    /* the client believes in "encrypt": the server in "auth" rejects its frames */
    CHECK(net_session_init(&other, NET_SEC_ENCRYPT, SECRET, sizeof SECRET, NS, NC, 0, &err) ==
          SG_OK);
    Sealed f;
    seal(&other, payload, sizeof payload, 32, &f);
    CHECK(open_frame(&srv, &f, 32, &err) == SG_EAUTH);
    free(f.body);
    net_session_free(&other);
    uint8_t nc2[NET_SESSION_NONCE];
    memcpy(nc2, NC, sizeof nc2);
    nc2[5] ^= 1;
    CHECK(net_session_init(&other, NET_SEC_AUTH, SECRET, sizeof SECRET, NS, nc2, 0, &err) == SG_OK);
    CHECK(memcmp(other.send.key, cli.send.key, NET_SESSION_KEY) != 0);
    net_session_free(&other);
    net_session_free(&srv);
    net_session_free(&cli);
    NetSecurity m;
    CHECK(net_security_parse("encrypt", &m, &err) == SG_OK && m == NET_SEC_ENCRYPT);
    CHECK(net_security_parse("tls", &m, &err) == SG_EINVAL && strstr(err.msg, "'tls'") != NULL);
}

/* A frame begun and never ended (a send that failed part-way) ends the connection's
 * usefulness: the next frame would reuse its sequence number (and GCM nonce). */
static void test_a_frame_cut_off_refuses_the_next(void)
{
    NetSession srv, cli;
    pair(NET_SEC_ENCRYPT, &srv, &cli);
    uint8_t hdr[NET_FRAME_HEADER_SIZE], seq[NET_SESSION_SEQ], buf[4] = {1, 2, 3, 4};
    SgError err;
    net_frame_header_encode(hdr, NET_FRAME_PS, 0, 4);
    CHECK(net_session_seal_begin(&cli, hdr, sizeof hdr, seq, &err) == SG_OK);
    CHECK(net_session_seal_update(&cli, buf, buf, 2, &err) == SG_OK);
    CHECK(net_session_seal_begin(&cli, hdr, sizeof hdr, seq, &err) == SG_ESTATE);
    CHECK(strstr(err.msg, "frame 0 on this connection was cut off part-way") != NULL);
    net_session_free(&srv);
    net_session_free(&cli);
}

static void test_none_is_inert(void)
{
    NetSession srv, cli;
    pair(NET_SEC_NONE, &srv, &cli);
    uint8_t payload[8] = {9, 8, 7};
    Sealed f;
    seal(&cli, payload, sizeof payload, 8, &f);
    SgError err;
    CHECK(memcmp(f.body, payload, 8) == 0 && open_frame(&srv, &f, 8, &err) == SG_OK);
    free(f.body);
    net_session_free(&srv);
    net_session_free(&cli);
}

int main(void)
{
    for (int i = 0; i < NET_SESSION_NONCE; i++)
        NS[i] = (uint8_t)i, NC[i] = (uint8_t)(200 - i);
    test_round_trips(NET_SEC_AUTH);
    test_round_trips(NET_SEC_ENCRYPT);
    test_tampering_is_named(NET_SEC_AUTH);
    test_tampering_is_named(NET_SEC_ENCRYPT);
    test_keys_differ_by_secret_nonce_and_mode();
    test_a_frame_cut_off_refuses_the_next();
    test_none_is_inert();
    return check_report("test_net_session");
}
