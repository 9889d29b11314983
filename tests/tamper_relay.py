"""A loopback TCP relay that alters one byte of the traffic it forwards, for tests of protected frames.

    with TamperRelay(server_host, server_port, direction="c2s", flip_at=HANDSHAKE_C2S + 30) as relay:
        client connects to (relay.host, relay.port) ...

Every accepted connection is forwarded to the target; in ``direction``
("c2s": client to server, "s2c": server to client) the byte at stream offset
``flip_at`` of the first connection (or of every connection with
``every=True``) is XORed with 0x01; ``seen[direction]`` keeps every byte
forwarded (what a passive observer of the link reads). The handshake occupies the first
HANDSHAKE_C2S / HANDSHAKE_S2C bytes of each direction (frame.h, auth.h), so an
offset past it hits the protected frames that follow. Threads are daemons,
sockets have timeouts and the relay stops on exit: nothing outlives the test.
"""

from __future__ import annotations

import socket
import threading

HEADER = 12
HANDSHAKE_C2S = HEADER + 32 + 32  # AUTH_RESPONSE: client nonce + MAC
HANDSHAKE_S2C = 2 * (HEADER + 32)  # AUTH_CHALLENGE (nonce) + AUTH_OK (MAC)
SEQ = 8  # a protected frame: header | seq | payload | tag (16)


class TamperRelay:
    def __init__(self, host: str, port: int, direction: str = "c2s", flip_at: int | None = None, every: bool = False):
        if direction not in ("c2s", "s2c"):
            raise ValueError(direction)
        self.target = (host, port)
        self.direction = direction
        self.flip_at = flip_at
        self.every = every
        self.flipped = 0
        self.seen = {"c2s": bytearray(), "s2c": bytearray()}
        self._lis = socket.create_server(("127.0.0.1", 0))
        self._lis.settimeout(0.2)
        self.host, self.port = self._lis.getsockname()[:2]
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._conns = 0
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> TamperRelay:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        with self._lock:
            for s in self._socks:
                try:
                    s.close()
                except OSError:
                    pass
        self._lis.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                a, _ = self._lis.accept()
            except (TimeoutError, OSError):
                continue
            try:
                b = socket.create_connection(self.target, timeout=5)
            except OSError:
                a.close()
                continue
            with self._lock:
                self._socks += [a, b]
                first = self._conns == 0
                self._conns += 1
            tamper = self.flip_at is not None and (first or self.every)
            for src, dst, d in ((a, b, "c2s"), (b, a, "s2c")):
                flip = self.flip_at if tamper and d == self.direction else None
                threading.Thread(target=self._pump, args=(src, dst, flip, d), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, flip_at: int | None, direction: str) -> None:
        src.settimeout(0.2)
        offset = 0
        while not self._stop.is_set():
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                data = b""
            if not data:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            if flip_at is not None and offset <= flip_at < offset + len(data):
                buf = bytearray(data)
                buf[flip_at - offset] ^= 0x01
                data = bytes(buf)
                with self._lock:
                    self.flipped += 1
            offset += len(data)
            with self._lock:
                self.seen[direction] += data
            try:
                dst.sendall(data)
            except OSError:
                return
