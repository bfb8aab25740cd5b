"""Looking at a raw socket from a test without waiting on it."""

from __future__ import annotations

import socket


def read_now(sock: socket.socket) -> bytes:
    """What a non-blocking socket can read at this moment; `<EOF>` appended once the peer
    has closed its side."""
    out = b""
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            return out
        if not chunk:
            return out + b"<EOF>"
        out += chunk
