"""A reference implementation of the wire protocol in pure Python, for tests.

It speaks the frame format and the HMAC handshake exactly as
csrc/net/frame.h and csrc/net/auth.h document them, so a test can act as a
misbehaving peer (junk, oversized frames, wrong secret) at any byte.
The handshake announces a security mode in its flags (SEC_NONE unless told);
after it this module sends and reads plain frames only, so the sparkgrad end
of a raw conversation must use security="none".
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct

MAGIC = 0x4E544753
VERSION = 2  # csrc/net/frame.h NET_FRAME_VERSION
HEADER = struct.Struct("<IBBHI")
AUTH_CHALLENGE, AUTH_RESPONSE, AUTH_OK, AUTH_FAIL = 1, 2, 3, 4
JSON, HEARTBEAT = 10, 11
LABEL_CLIENT = b"sparkgrad-auth-v1 client"
LABEL_SERVER = b"sparkgrad-auth-v1 server"
SEC_NONE, SEC_AUTH, SEC_ENCRYPT = 0, 1, 2  # the flags of AUTH_CHALLENGE / AUTH_RESPONSE
SEC_FLAGS = {"none": SEC_NONE, "auth": SEC_AUTH, "encrypt": SEC_ENCRYPT}


def frame(ftype: int, payload: bytes = b"", flags: int = 0, length: int | None = None) -> bytes:
    n = len(payload) if length is None else length
    return HEADER.pack(MAGIC, VERSION, ftype, flags, n) + payload


def recv_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"peer closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def recv_frame_flags(sock: socket.socket) -> tuple[int, int, bytes]:
    magic, version, ftype, flags, n = HEADER.unpack(recv_exact(sock, HEADER.size))
    assert magic == MAGIC and version == VERSION
    return ftype, flags, recv_exact(sock, n)


def recv_frame(sock: socket.socket) -> tuple[int, bytes]:
    ftype, _flags, payload = recv_frame_flags(sock)
    return ftype, payload


def mac(secret: bytes, label: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(secret, label + a + b, hashlib.sha256).digest()


def client_auth(sock: socket.socket, secret: bytes, flags: int = SEC_NONE) -> int:
    """Client half of the handshake announcing mode ``flags``; raises AssertionError if refused.

    Returns the mode the server announced in its challenge."""
    ftype, server_mode, challenge = recv_frame_flags(sock)
    assert ftype == AUTH_CHALLENGE and len(challenge) == 32
    nonce = os.urandom(32)
    sock.sendall(frame(AUTH_RESPONSE, nonce + mac(secret, LABEL_CLIENT, challenge, nonce), flags))
    ftype, proof = recv_frame(sock)
    assert ftype == AUTH_OK, (ftype, proof)
    assert hmac.compare_digest(proof, mac(secret, LABEL_SERVER, nonce, challenge))
    return server_mode


def server_auth(sock: socket.socket, secret: bytes, flags: int = SEC_NONE) -> None:
    """Server half of the handshake, announcing mode ``flags``."""
    challenge = os.urandom(32)
    sock.sendall(frame(AUTH_CHALLENGE, challenge, flags))
    ftype, resp = recv_frame(sock)
    assert ftype == AUTH_RESPONSE and len(resp) == 64
    nonce, their = resp[:32], resp[32:]
    assert hmac.compare_digest(their, mac(secret, LABEL_CLIENT, challenge, nonce))
    sock.sendall(frame(AUTH_OK, mac(secret, LABEL_SERVER, nonce, challenge)))


def send_json(sock: socket.socket, msg: dict) -> None:
    sock.sendall(frame(JSON, json.dumps(msg).encode()))


def recv_json(sock: socket.socket) -> dict:
    ftype, payload = recv_frame(sock)
    assert ftype == JSON, ftype
    return json.loads(payload)


def connect(port: int, timeout: float = 5.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.settimeout(timeout)
    return sock


def node(executor_id: int, role: str = "worker", index: int | None = None, port: int = 0) -> dict:
    return {
        "host": "127.0.0.1",
        "port": port,
        "role": role,
        "index": executor_id if index is None else index,
        "executor_id": executor_id,
        "pid": os.getpid(),
    }
