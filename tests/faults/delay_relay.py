"""A TCP relay that delays every byte by a fixed time in each direction (a delayed link where tc netem is
missing from the kernel): delay_relay.py <listen host> <listen port> <target host> <target port> <delay s>
<lifetime s>. Order is kept; each direction is a reader thread and a writer thread joined by a queue."""

from __future__ import annotations

import queue
import socket
import sys
import threading
import time


def pump(src: socket.socket, dst: socket.socket, delay: float) -> None:
    q: queue.Queue = queue.Queue()

    def reader() -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            q.put((time.monotonic() + delay, data))
            if not data:
                return

    def writer() -> None:
        while True:
            due, data = q.get()
            time.sleep(max(0.0, due - time.monotonic()))
            if not data:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            try:
                dst.sendall(data)
            except OSError:
                return

    threading.Thread(target=reader, daemon=True).start()
    threading.Thread(target=writer, daemon=True).start()


def main(host: str, port: int, thost: str, tport: int, delay: float, lifetime: float) -> None:
    lis = socket.create_server((host, port))
    lis.settimeout(0.5)
    end = time.monotonic() + lifetime
    print("relay: listening", flush=True)
    while time.monotonic() < end:
        try:
            a, _ = lis.accept()
        except TimeoutError:
            continue
        b = socket.create_connection((thost, tport), timeout=10)
        b.settimeout(None)
        for s in (a, b):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pump(a, b, delay)
        pump(b, a, delay)


if __name__ == "__main__":
    h, p, th, tp, d, life = sys.argv[1:7]
    main(h, int(p), th, int(tp), float(d), float(life))
