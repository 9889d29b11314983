/*
 * sock.c - TCP helpers of the cluster transport (see sock.h).
 *
 * anet.c habits: every helper returns a status and fills the caller's
 * SgError; EINTR is retried; read/write results are handled in three branches
 * (-1 error, 0 peer closed, > 0 progress); every error path closes what it
 * opened. No helper blocks without a deadline. Not here: frames (frame.c),
 * authentication (auth.c).
 */
#include "net/sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

void net_close(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

static void set_nodelay(int fd)
{
    int one = 1;
    /* Best effort: a socket without TCP_NODELAY still works, only slower. */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void format_addr(const struct sockaddr *sa, char *host, size_t hlen, int *port)
{
    char h[INET6_ADDRSTRLEN] = "?";
    int p = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in->sin_addr, h, sizeof h);
        p = ntohs(in->sin_port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, h, sizeof h);
        p = ntohs(in6->sin6_port);
    }
    if (host != NULL)
        snprintf(host, hlen, "%s", h);
    if (port != NULL)
        *port = p;
}

/* One lookup on a thread of its own, shared by the waiter and that thread:
 * whoever drops the last reference frees it, so a lookup the waiter gave up
 * on finishes (and frees its result) without it. */
typedef struct Lookup {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct addrinfo hints, *result;
    char node[NET_PEER_MAX];
    char service[16];
    int done, rc, refs;
} Lookup;

static void lookup_unref(Lookup *l)
{
    pthread_mutex_lock(&l->mu);
    int last = --l->refs == 0;
    pthread_mutex_unlock(&l->mu);
    if (last) {
        if (l->result != NULL)
            freeaddrinfo(l->result);
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv);
        free(l);
    }
}

static void *lookup_main(void *arg)
{
    Lookup *l = arg;
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(l->node, l->service, &l->hints, &res);
    pthread_mutex_lock(&l->mu);
    l->rc = rc, l->result = res, l->done = 1;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
    lookup_unref(l);
    return NULL;
}

/* getaddrinfo of a name on a detached thread, waited for until deadline: a
 * name resolver that does not answer cannot block the caller past it. */
static int resolve_name(const char *node, const char *service, const struct addrinfo *hints,
                        double deadline, struct addrinfo **res, int *gai_rc, SgError *err)
{
    Lookup *l = calloc(1, sizeof *l);
    if (l == NULL)
        return sg_fail(err, SG_ENOMEM, "resolving host '%s'", node);
    snprintf(l->node, sizeof l->node, "%s", node);
    snprintf(l->service, sizeof l->service, "%s", service);
    l->hints = *hints;
    l->refs = 2;
    pthread_mutex_init(&l->mu, NULL);
    sg_cond_init(&l->cv);
    pthread_attr_t ta;
    pthread_attr_init(&ta);
    pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
    pthread_t th;
    int started = pthread_create(&th, &ta, lookup_main, l) == 0;
    pthread_attr_destroy(&ta);
    if (!started) {
        l->refs = 1;
        lookup_unref(l);
        return sg_fail(err, SG_ENOMEM, "starting a thread to resolve host '%s'", node);
    }
    double t0 = sg_now();
    pthread_mutex_lock(&l->mu);
    while (!l->done && sg_cond_wait(&l->cv, &l->mu, deadline) != ETIMEDOUT)
        ;
    int done = l->done;
    if (done) {
        *gai_rc = l->rc;
        *res = l->result;
        l->result = NULL; /* the caller's now */
    }
    pthread_mutex_unlock(&l->mu);
    lookup_unref(l);
    if (!done)
        return sg_fail(err, SG_ETIMEOUT,
                       "timed out resolving host '%s' (port %s): no answer from the name "
                       "resolver within %.1f s",
                       node, service, sg_now() - t0);
    return SG_OK;
}

/* getaddrinfo bounded by deadline: numeric addresses directly, names on a
 * thread waited for until the deadline. */
static int resolve(const char *host, int port, int passive, double deadline, struct addrinfo **res,
                   SgError *err)
{
    if (port < 0 || port > 65535)
        return sg_fail(err, SG_EINVAL, "port %d of %s is outside 0..65535", port, host);
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
    const char *node = host != NULL && host[0] != '\0' ? host : NULL;
    unsigned char probe[sizeof(struct in6_addr)];
    int rc = 0;
    if (node == NULL || inet_pton(AF_INET, node, probe) == 1 ||
        inet_pton(AF_INET6, node, probe) == 1) {
        hints.ai_flags |= node != NULL ? AI_NUMERICHOST : 0;
        rc = getaddrinfo(node, service, &hints, res);
    } else if (strlen(node) >= NET_PEER_MAX) {
        return sg_fail(err, SG_EINVAL, "host name of %zu characters is too long to resolve",
                       strlen(node));
    } else {
        int st = resolve_name(node, service, &hints, deadline, res, &rc, err);
        if (st < 0)
            return st;
    }
    if (rc != 0)
        return sg_fail(err, SG_EIO, "cannot resolve host '%s' (port %d): %s", host ? host : "",
                       port, gai_strerror(rc));
    return SG_OK;
}

int net_listen(const char *host, int port, int backlog, int *fd_out, int *port_out,
               char *bound_host, size_t bound_len, SgError *err)
{
    struct addrinfo *res = NULL;
    int rc = resolve(host, port, 1, sg_now() + NET_RESOLVE_TIMEOUT, &res, err);
    if (rc < 0)
        return rc;
    int fd = -1, last_errno = 0;
    const char *last_call = "socket";
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (fd < 0) {
            last_errno = errno, last_call = "socket";
            continue;
        }
        int one = 1;
        if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0) {
            last_errno = errno, last_call = "setsockopt(SO_REUSEADDR)";
        } else if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
            last_errno = errno, last_call = "bind";
        } else if (listen(fd, backlog > 0 ? backlog : SOMAXCONN) < 0) {
            last_errno = errno, last_call = "listen";
        } else {
            break;
        }
        net_close(&fd);
    }
    freeaddrinfo(res);
    if (fd < 0) {
        if (last_errno == EADDRINUSE)
            return sg_fail(err, SG_EIO,
                           "cannot listen on %s:%d: address already in use (another process holds "
                           "the port; pass port=0 to let the system choose a free one)",
                           host, port);
        return sg_fail_errno(err, SG_EIO, last_errno, "cannot listen on %s:%d (%s)", host, port,
                             last_call);
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
        int e = errno;
        net_close(&fd);
        return sg_fail_errno(err, SG_EIO, e, "getsockname on listener %s:%d", host, port);
    }
    format_addr((struct sockaddr *)&ss, bound_host, bound_len, port_out);
    *fd_out = fd;
    return SG_OK;
}

/* Waits for a non-blocking connect on fd to finish; 0, or errno value, or
 * ETIMEDOUT when the deadline passed. */
static int connect_wait(int fd, double deadline)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int n = poll(&p, 1, sg_poll_ms(deadline));
        if (n == -1) {
            if (errno == EINTR)
                continue;
            return errno;
        } else if (n == 0) {
            return ETIMEDOUT;
        } else {
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
                return errno;
            return soerr;
        }
    }
}

int net_connect(const char *host, int port, double deadline, int *fd_out, SgError *err)
{
    struct addrinfo *res = NULL;
    int rc = resolve(host, port, 0, deadline, &res, err);
    if (rc < 0)
        return rc;
    int fd = -1, last_errno = ECONNREFUSED;
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (fd < 0) {
            last_errno = errno;
            continue;
        }
        int c;
        do {
            c = connect(fd, ai->ai_addr, ai->ai_addrlen);
        } while (c < 0 && errno == EINTR);
        int e = c == 0 ? 0 : errno == EINPROGRESS ? connect_wait(fd, deadline) : errno;
        if (e == 0)
            break;
        last_errno = e;
        net_close(&fd);
        if (e == ETIMEDOUT)
            break;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        if (last_errno == ETIMEDOUT)
            return sg_fail(err, SG_ETIMEOUT, "timed out connecting to %s:%d", host, port);
        return sg_fail_errno(err, SG_EIO, last_errno, "cannot connect to %s:%d", host, port);
    }
    set_nodelay(fd);
    *fd_out = fd;
    return SG_OK;
}

int net_accept(int lfd, int *fd_out, char *peer, size_t peer_len, SgError *err)
{
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd == -1) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            int e = errno;
            sg_fail_errno(err, SG_EIO, e, "accept on listening socket");
            errno = e; /* for the caller's backoff (accept.c) */
            return SG_EIO;
        }
        set_nodelay(fd);
        char h[INET6_ADDRSTRLEN];
        int p = 0;
        format_addr((struct sockaddr *)&ss, h, sizeof h, &p);
        snprintf(peer, peer_len, "%s:%d", h, p);
        *fd_out = fd;
        return 1;
    }
}

/* Waits until fd is ready for events or the deadline passes; a timeout says
 * "timed out <doing> <what> <to_from> <peer>". */
static int wait_ready(int fd, short events, double deadline, const char *peer, const char *doing,
                      const char *what, const char *to_from, SgError *err)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, sg_poll_ms(deadline));
        if (n == -1) {
            if (errno == EINTR)
                continue;
            return sg_fail_errno(err, SG_EIO, errno, "poll on connection to %s", peer);
        } else if (n == 0) {
            return sg_fail(err, SG_ETIMEOUT, "timed out %s %s %s %s", doing, what, to_from, peer);
        } else {
            return SG_OK;
        }
    }
}

int net_writev_all(int fd, struct iovec *iov, int iovcnt, double deadline, const char *peer,
                   const char *what, SgError *err)
{
    while (iovcnt > 0) {
        if (iov->iov_len == 0) {
            iov++, iovcnt--;
            continue;
        }
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = iov;
        msg.msg_iovlen = (size_t)iovcnt;
        ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (n == -1) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                int rc = wait_ready(fd, POLLOUT, deadline, peer, "sending", what, "to", err);
                if (rc < 0)
                    return rc;
                continue;
            }
            if (errno == EPIPE || errno == ECONNRESET)
                return sg_fail_errno(err, SG_EPEER, errno,
                                     "%s closed the connection while we sent %s", peer, what);
            return sg_fail_errno(err, SG_EIO, errno, "sending %s to %s", what, peer);
        } else if (n == 0) {
            return sg_fail(err, SG_EPEER, "%s accepted no bytes of %s", peer, what);
        } else {
            size_t left = (size_t)n;
            while (left > 0 && iovcnt > 0) {
                size_t take = left < iov->iov_len ? left : iov->iov_len;
                iov->iov_base = (char *)iov->iov_base + take;
                iov->iov_len -= take;
                left -= take;
                if (iov->iov_len == 0)
                    iov++, iovcnt--;
            }
        }
    }
    return SG_OK;
}

int net_read_exact(int fd, void *buf, size_t len, double deadline, const char *peer,
                   const char *what, SgError *err)
{
    for (size_t have = 0; have < len;) {
        long n = net_read_some(fd, (char *)buf + have, len - have, peer, err);
        if (n == SG_EPEER)
            return sg_context(err, "after %zu of %zu bytes of %s: ", have, len, what);
        if (n < 0)
            return sg_context(err, "%s: ", what);
        if (n == 0) {
            int rc = wait_ready(fd, POLLIN, deadline, peer, "waiting for", what, "from", err);
            if (rc < 0)
                return rc;
        }
        have += (size_t)n;
    }
    return SG_OK;
}

long net_read_some(int fd, void *buf, size_t cap, const char *peer, SgError *err)
{
    for (;;) {
        ssize_t n = recv(fd, buf, cap, 0);
        if (n == -1) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            if (errno == ECONNRESET)
                return sg_fail(err, SG_EPEER, "%s reset the connection", peer);
            return sg_fail_errno(err, SG_EIO, errno, "reading from %s", peer);
        } else if (n == 0) {
            return sg_fail(err, SG_EPEER, "%s closed the connection", peer);
        } else {
            return (long)n;
        }
    }
}

long net_write_some(int fd, const void *buf, size_t len, const char *peer, SgError *err)
{
    for (;;) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        if (n == -1) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            if (errno == EPIPE || errno == ECONNRESET)
                return sg_fail(err, SG_EPEER, "%s closed the connection", peer);
            return sg_fail_errno(err, SG_EIO, errno, "writing to %s", peer);
        } else {
            return (long)n;
        }
    }
}

int net_wake_pipe(int fds[2], SgError *err)
{
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) < 0)
        return sg_fail_errno(err, SG_EIO, errno, "creating wake-up pipe");
    return SG_OK;
}

void net_wake(int wfd)
{
    char b = 1;
    ssize_t n;
    do {
        n = write(wfd, &b, 1);
    } while (n < 0 && errno == EINTR);
    /* EAGAIN: the pipe is full, so the loop is already due to wake. */
}

void net_wake_drain(int rfd)
{
    char buf[64];
    ssize_t n;
    do {
        n = read(rfd, buf, sizeof buf);
    } while (n > 0 || (n < 0 && errno == EINTR));
}
