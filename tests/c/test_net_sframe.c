/*
 * test_net_sframe.c - protected frames on a socket (frame.h with session.h):
 * the handshake keys both ends and agrees on the mode, sendv/recv in parts and
 * the resumable parser round-trip in "auth" and "encrypt", and a flipped,
 * replayed or truncated frame on the wire is refused with its reason.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "net/auth.h"
#include "net/frame.h"
#include "net/session.h"
#include "net/sock.h"

static const uint8_t SECRET[32] = "0123456789abcdef0123456789abcde";

typedef struct {
    int fd;
    NetSecurity mode;
    NetSession session;
    int rc;
    SgError err;
} Server;

static void *serve(void *arg)
{
    Server *s = arg;
    s->rc =
        net_auth_server(s->fd, SECRET, 32, s->mode, sg_now() + 5, "client", &s->session, &s->err);
    return NULL;
}

/* A socketpair whose ends authenticated with (server_mode, client_mode). */
static int pair(NetSecurity server_mode, NetSecurity client_mode, int sv[2], NetSession *srv,
                NetSession *cli, int *src, SgError *serr, SgError *cerr)
{
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
        return -1;
    Server s = {.fd = sv[0], .mode = server_mode};
    pthread_t t;
    pthread_create(&t, NULL, serve, &s);
    memset(cli, 0, sizeof *cli);
    int crc = net_auth_client(sv[1], SECRET, 32, client_mode, sg_now() + 5, "server", cli, cerr);
    if (crc < 0)
        shutdown(sv[1], SHUT_RDWR); /* as a failing client's close would */
    pthread_join(t, NULL);
    *srv = s.session;
    *src = s.rc;
    *serr = s.err;
    return crc;
}

static uint8_t *pattern(size_t n, unsigned seed)
{
    uint8_t *p = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 131u + seed);
    return p;
}

typedef struct {
    int fd;
    NetSession *s;
    const struct iovec *pieces;
    int n;
    int rc;
} Sender;

static void *send_main(void *arg)
{
    Sender *x = arg;
    SgError e;
    x->rc = net_frame_sendv(x->fd, x->s, NET_FRAME_PS, 7, x->pieces, x->n, sg_now() + 10, "reader",
                            "a test frame", &e);
    return NULL;
}

static void test_round_trip(NetSecurity mode)
{
    int sv[2], src;
    NetSession srv, cli;
    SgError se, ce;
    CHECK(pair(mode, mode, sv, &srv, &cli, &src, &se, &ce) == SG_OK && src == SG_OK);
    CHECK(srv.mode == mode && cli.mode == mode);
    /* Three pieces, the middle one larger than the encryption block. */
    size_t sizes[3] = {5, NET_SESSION_SCRATCH * 2 + 17, 1000};
    uint8_t *p[3];
    struct iovec iov[3];
    size_t total = 0;
    for (int i = 0; i < 3; i++) {
        p[i] = pattern(sizes[i], (unsigned)i);
        iov[i] = (struct iovec){p[i], sizes[i]};
        total += sizes[i];
    }
    for (int rep = 0; rep < 2; rep++) { /* the second frame checks the sequence moved on */
        Sender x = {.fd = sv[1], .s = &cli, .pieces = iov, .n = 3};
        pthread_t t;
        pthread_create(&t, NULL, send_main, &x);
        NetFrameHeader h;
        SgError e;
        uint8_t *got = malloc(total);
        CHECK(net_frame_recv_header(sv[0], &srv, (uint32_t)total, sg_now() + 10, "writer", &h,
                                    &e) == SG_OK);
        CHECK(h.type == NET_FRAME_PS && h.flags == 7 && h.length == total);
        CHECK(net_frame_recv_payload(sv[0], &srv, got, 3, sg_now() + 10, "writer", "part", &e) ==
              SG_OK);
        CHECK(net_frame_recv_payload(sv[0], &srv, got + 3, total - 3, sg_now() + 10, "writer",
                                     "part", &e) == SG_OK);
        CHECK(net_frame_recv_end(sv[0], &srv, h.type, sg_now() + 10, "writer", &e) == SG_OK);
        pthread_join(t, NULL);
        CHECK(x.rc == SG_OK);
        size_t off = 0;
        for (int i = 0; i < 3; i++) {
            CHECK(memcmp(got + off, p[i], sizes[i]) == 0);
            off += sizes[i];
        }
        free(got);
    }
    /* Server to client through the parser, fed one byte at a time. */
    SgError e;
    const char msg[] = "{\"type\":\"ok\"}";
    CHECK(net_frame_send(sv[0], &srv, NET_FRAME_JSON, 0, msg, sizeof msg - 1, sg_now() + 5,
                         "client", &e) == SG_OK);
    NetFrameParser parser;
    net_frame_parser_init(&parser, 16);
    net_frame_parser_protect(&parser, &cli, 1024, "server");
    int done = 0;
    for (int i = 0; i < 200 && !done; i++) {
        uint8_t b;
        size_t used;
        if (read(sv[1], &b, 1) != 1)
            break;
        done = net_frame_parser_feed(&parser, &b, 1, &used, &e);
        CHECK(done >= 0 && used == 1);
    }
    CHECK(done == 1);
    NetFrameHeader h;
    uint8_t *payload;
    net_frame_parser_take(&parser, &h, &payload);
    CHECK(h.type == NET_FRAME_JSON && h.length == sizeof msg - 1 &&
          memcmp(payload, msg, h.length) == 0);
    free(payload);
    net_frame_parser_free(&parser);
    for (int i = 0; i < 3; i++)
        free(p[i]);
    net_session_free(&srv);
    net_session_free(&cli);
    close(sv[0]);
    close(sv[1]);
}

/* Reads whatever one frame put on the socket (up to cap bytes). */
static size_t drain(int fd, uint8_t *buf, size_t cap)
{
    size_t have = 0;
    for (int i = 0; i < 100; i++) {
        ssize_t n = read(fd, buf + have, cap - have);
        if (n > 0)
            have += (size_t)n;
        else if (have > 0)
            break;
        else
            usleep(1000);
    }
    return have;
}

/* Sends one frame from cli, lets mutate change its wire bytes, delivers them
 * to srv and returns what net_frame_recv said. */
static int deliver(NetSession *srv, NetSession *cli, int sv[2], int replay,
                   size_t (*mutate)(uint8_t *, size_t), SgError *e)
{
    uint8_t wire[256], payload[40];
    memset(payload, 0x5a, sizeof payload);
    SgError se;
    CHECK(net_frame_send(sv[1], cli, NET_FRAME_PS, 0, payload, sizeof payload, sg_now() + 5,
                         "server", &se) == SG_OK);
    size_t n = drain(sv[0], wire, sizeof wire);
    static uint8_t last[256];
    static size_t last_n;
    if (replay) {
        memcpy(wire, last, last_n);
        n = last_n;
    } else {
        memcpy(last, wire, n);
        last_n = n;
    }
    if (mutate)
        n = mutate(wire, n);
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0)
        return -1;
    CHECK(write(fds[1], wire, n) == (ssize_t)n);
    close(fds[1]);
    NetFrameHeader h;
    uint8_t *out = NULL;
    int rc = net_frame_recv(fds[0], srv, 1024, sg_now() + 2, "10.1.2.3:4000", &h, &out, e);
    free(out);
    close(fds[0]);
    return rc;
}

static size_t flip_payload(uint8_t *w, size_t n)
{
    w[NET_FRAME_HEADER_SIZE + NET_SESSION_SEQ + 3] ^= 1;
    return n;
}

static size_t flip_flags(uint8_t *w, size_t n)
{
    w[6] ^= 1;
    return n;
}

static size_t truncate_tag(uint8_t *w, size_t n)
{
    (void)w;
    return n - 4;
}

static void test_tampering(NetSecurity mode)
{
    int sv[2], src;
    NetSession srv, cli;
    SgError se, ce, e;
    CHECK(pair(mode, mode, sv, &srv, &cli, &src, &se, &ce) == SG_OK && src == SG_OK);
    CHECK(deliver(&srv, &cli, sv, 0, NULL, &e) == SG_OK);
    /* The same bytes again: the receiver expects the next sequence number. */
    CHECK(deliver(&srv, &cli, sv, 1, NULL, &e) == SG_EAUTH);
    CHECK(strstr(e.msg, "10.1.2.3:4000") && strstr(e.msg, "sequence number 0 where 1") &&
          strstr(e.msg, "replayed"));
    net_session_free(&srv);
    net_session_free(&cli);
    close(sv[0]);
    close(sv[1]);

    size_t (*mutations[])(uint8_t *, size_t) = {flip_payload, flip_flags};
    for (int i = 0; i < 2; i++) {
        CHECK(pair(mode, mode, sv, &srv, &cli, &src, &se, &ce) == SG_OK && src == SG_OK);
        CHECK(deliver(&srv, &cli, sv, 0, mutations[i], &e) == SG_EAUTH);
        CHECK(strstr(e.msg, "ps frame 0 failed its integrity check") != NULL);
        net_session_free(&srv);
        net_session_free(&cli);
        close(sv[0]);
        close(sv[1]);
    }
    CHECK(pair(mode, mode, sv, &srv, &cli, &src, &se, &ce) == SG_OK && src == SG_OK);
    CHECK(deliver(&srv, &cli, sv, 0, truncate_tag, &e) == SG_EPEER);
    CHECK(strstr(e.msg, "tag") != NULL);
    net_session_free(&srv);
    net_session_free(&cli);
    close(sv[0]);
    close(sv[1]);
}

static void test_modes_must_agree(void)
{
    int sv[2], src;
    NetSession srv, cli;
    SgError se, ce;
    int crc = pair(NET_SEC_AUTH, NET_SEC_ENCRYPT, sv, &srv, &cli, &src, &se, &ce);
    CHECK(crc == SG_EAUTH && src < 0);
    CHECK(strstr(ce.msg, "server server uses security='auth' and this node security='encrypt'"));
    close(sv[0]);
    close(sv[1]);
    /* A session is needed to keep keys; none needs none. */
    SgError e;
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
    Server s = {.fd = sv[0], .mode = NET_SEC_NONE};
    pthread_t t;
    pthread_create(&t, NULL, serve, &s);
    CHECK(net_auth_client(sv[1], SECRET, 32, NET_SEC_NONE, sg_now() + 5, "server", NULL, &e) ==
          SG_OK);
    pthread_join(t, NULL);
    CHECK(s.rc == SG_OK && s.session.mode == NET_SEC_NONE);
    close(sv[0]);
    close(sv[1]);
}

int main(void)
{
    test_round_trip(NET_SEC_AUTH);
    test_round_trip(NET_SEC_ENCRYPT);
    test_tampering(NET_SEC_AUTH);
    test_tampering(NET_SEC_ENCRYPT);
    test_modes_must_agree();
    return check_report("test_net_sframe");
}
