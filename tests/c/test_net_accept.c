/* test_net_accept.c - the accept gate of accept.h over real loopback
 * sockets: the per-peer and per-server caps on unauthenticated connections
 * (closed unanswered), their release, and the backoff on EMFILE (the
 * listener left out of the poll set, growing to 100 ms, reset by the next
 * accept; the server never fails). */
#include <errno.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "net/accept.h"
#include "net/sock.h"

/* A blocking connection from src to 127.0.0.1:port; -1 on failure. */
static int dial(const char *src, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, src, &a.sin_addr);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    a.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Accepts once the connection is pending (bounded wait). */
static int accept_one(NetGate *g, int lfd, int *fd, char *peer)
{
    for (int i = 0; i < 200; i++) {
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        (void)poll(&p, 1, 10);
        int rc = net_gate_accept(g, lfd, fd, peer, NET_PEER_MAX);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* The peer side sees EOF (a close without a byte) within a second. */
static int closed_unanswered(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 1000) != 1)
        return 0;
    char b;
    ssize_t n = recv(fd, &b, 1, 0);
    return n == 0 || (n < 0 && errno == ECONNRESET);
}

static void test_caps_per_peer_and_per_server(void)
{
    SgError err;
    int lfd = -1, port = 0;
    CHECK(net_listen("127.0.0.1", 0, 64, &lfd, &port, NULL, 0, &err) == 0);
    NetGate g;
    CHECK(net_gate_init(&g, 3, 2, &err) == 0);
    int cl[6], sv[6];
    char peers[6][NET_PEER_MAX];
    /* two from 127.0.0.2 are admitted, the third is over the per-peer cap */
    for (int i = 0; i < 3; i++)
        cl[i] = dial("127.0.0.2", port);
    CHECK(accept_one(&g, lfd, &sv[0], peers[0]) == 1);
    CHECK(accept_one(&g, lfd, &sv[1], peers[1]) == 1);
    CHECK(accept_one(&g, lfd, &sv[2], peers[2]) == 2);
    CHECK(closed_unanswered(cl[2]));
    CHECK(net_gate_unauth(&g) == 2);
    /* another address takes the last place of the server's three */
    cl[3] = dial("127.0.0.3", port);
    CHECK(accept_one(&g, lfd, &sv[3], peers[3]) == 1);
    cl[4] = dial("127.0.0.4", port);
    CHECK(accept_one(&g, lfd, &sv[4], peers[4]) == 2);
    CHECK(closed_unanswered(cl[4]));
    /* one authenticates, another ends: both leave the count, places free up */
    net_gate_authenticated(&g, peers[0]);
    net_gate_release(&g, peers[3]);
    CHECK(net_gate_unauth(&g) == 1);
    cl[5] = dial("127.0.0.2", port);
    CHECK(accept_one(&g, lfd, &sv[5], peers[5]) == 1);
    CHECK(strncmp(peers[5], "127.0.0.2:", 10) == 0);
    CHECK(net_gate_unauth(&g) == 2);
    CHECK(g.refused == 2);
    int keep[] = {0, 1, 3, 5};
    for (int i = 0; i < 4; i++)
        close(sv[keep[i]]);
    for (int i = 0; i < 6; i++)
        if (cl[i] >= 0)
            close(cl[i]);
    net_gate_free(&g);
    net_close(&lfd);
}

static void test_emfile_backs_off_and_recovers(void)
{
    SgError err;
    int lfd = -1, port = 0;
    CHECK(net_listen("127.0.0.1", 0, 64, &lfd, &port, NULL, 0, &err) == 0);
    NetGate g;
    CHECK(net_gate_init(&g, 0, 0, &err) == 0);
    int cl = dial("127.0.0.2", port);
    CHECK(cl >= 0);
    struct rlimit old;
    getrlimit(RLIMIT_NOFILE, &old);
    /* no descriptor left above the ones open now */
    int top = dup(0);
    struct rlimit low = {.rlim_cur = (rlim_t)top, .rlim_max = old.rlim_max};
    close(top);
    CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
    int fd = -1;
    char peer[NET_PEER_MAX];
    struct pollfd p = {.fd = lfd, .events = POLLIN};
    CHECK(poll(&p, 1, 1000) == 1);
    CHECK(net_gate_accept(&g, lfd, &fd, peer, sizeof peer) == 0); /* EMFILE: backing off */
    CHECK(g.last_errno == EMFILE && g.accept_errors == 1);
    int ms = 1000;
    CHECK(net_gate_poll_fd(&g, lfd, &ms) == -1 && ms <= 5);
    CHECK(net_gate_accept(&g, lfd, &fd, peer, sizeof peer) == 0); /* still backing off */
    CHECK(g.accept_errors == 1);
    /* the backoff grows at each failure, to at most 100 ms */
    for (int i = 0; i < 10; i++) {
        usleep((useconds_t)(g.backoff * 1e6) + 1000);
        CHECK(net_gate_accept(&g, lfd, &fd, peer, sizeof peer) == 0);
    }
    CHECK(g.accept_errors == 11 && g.backoff == NET_GATE_BACKOFF_MAX);
    ms = 1000;
    CHECK(net_gate_poll_fd(&g, lfd, &ms) == -1 && ms <= 100 && ms > 5);
    /* descriptors free again: the pending connection is accepted, the backoff reset */
    CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0);
    usleep(110 * 1000);
    CHECK(net_gate_accept(&g, lfd, &fd, peer, sizeof peer) == 1);
    CHECK(g.backoff == 0);
    ms = 1000;
    CHECK(net_gate_poll_fd(&g, lfd, &ms) == lfd && ms == 1000);
    net_gate_release(&g, peer);
    close(fd);
    close(cl);
    net_gate_free(&g);
    net_close(&lfd);
}

int main(void)
{
    test_caps_per_peer_and_per_server();
    test_emfile_backs_off_and_recovers();
    return check_report("test_net_accept");
}
