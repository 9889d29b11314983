/*
 * sock.h - TCP sockets for the cluster transport: resolve, listen, connect,
 * accept, and whole-buffer I/O bounded by a deadline.
 *
 * Every socket is CLOEXEC and non-blocking; blocking-style helpers wait with
 * poll() up to an absolute deadline on the monotonic clock (sg_now() of
 * common/sg_clock.h), so no call here can block without bound. Helpers
 * return 0 or a negative SgStatus and fill the caller's SgError naming the
 * peer ("host:port").
 */
#ifndef NET_SOCK_H
#define NET_SOCK_H

#include <pthread.h>
#include <stddef.h>
#include <sys/uio.h>

#include "common/sg_clock.h"
#include "common/sg_status.h"

#define NET_PEER_MAX        300  /* "host:port" of any resolvable name */
#define NET_RESOLVE_TIMEOUT 10.0 /* seconds net_listen waits for the name resolver */

/* Names are resolved with a deadline (getaddrinfo on a detached thread): net_connect's, and
 * NET_RESOLVE_TIMEOUT for net_listen; a resolver that does not answer in
 * time is SG_ETIMEOUT naming the host and the seconds waited. */

/* Binds host:port (port 0 = any free port) and listens. Sets SO_REUSEADDR,
 * CLOEXEC, O_NONBLOCK. *port_out is the port actually bound; bound_host (if
 * not NULL, bound_len bytes) gets the numeric bound address. A port in use is
 * SG_EIO naming host:port. */
int net_listen(const char *host, int port, int backlog, int *fd_out, int *port_out,
               char *bound_host, size_t bound_len, SgError *err);

/* Connects to host:port before deadline; the socket is non-blocking,
 * CLOEXEC, TCP_NODELAY. Fails with SG_EIO (refused, unreachable, unresolvable)
 * or SG_ETIMEOUT, naming host:port. */
int net_connect(const char *host, int port, double deadline, int *fd_out, SgError *err);

/* Accepts one pending connection from the non-blocking listener lfd.
 * Returns 1 and fills *fd_out / peer ("ip:port") when one was accepted,
 * 0 when none is pending, or a negative status with errno still set to the
 * accept error (EINTR and ECONNABORTED are retried here). Servers use the
 * gate of accept.h, which backs off instead of failing. */
int net_accept(int lfd, int *fd_out, char *peer, size_t peer_len, SgError *err);

/* Writes all iov bytes before deadline (partial writes resumed, EINTR
 * retried, no SIGPIPE). SG_EPEER if the peer reset the connection,
 * SG_ETIMEOUT naming peer and byte counts. iov is modified. */
int net_writev_all(int fd, struct iovec *iov, int iovcnt, double deadline, const char *peer,
                   const char *what, SgError *err);

/* Reads exactly len bytes before deadline. The peer closing first is
 * SG_EPEER ("after k of len bytes of <what>"). */
int net_read_exact(int fd, void *buf, size_t len, double deadline, const char *peer,
                   const char *what, SgError *err);

/* One non-blocking read: returns bytes read (> 0), 0 if nothing is available,
 * SG_EPEER if the peer closed, or SG_EIO. */
long net_read_some(int fd, void *buf, size_t cap, const char *peer, SgError *err);

/* One non-blocking write: returns bytes written (>= 0) or SG_EPEER/SG_EIO. */
long net_write_some(int fd, const void *buf, size_t len, const char *peer, SgError *err);

/* close() unless *fd < 0; sets *fd = -1. */
void net_close(int *fd);

/* A pipe for waking poll loops (both ends CLOEXEC and non-blocking). */
int net_wake_pipe(int fds[2], SgError *err);
void net_wake(int wfd);
void net_wake_drain(int rfd);

#endif /* NET_SOCK_H */
