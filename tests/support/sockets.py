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


class Blackhole:
    """A loopback TCP server that accepts every connection and never answers: the backend
    that hangs (a wedged process, a full accept queue behind a load balancer)."""

    def __init__(self) -> None:
        import threading

        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = self._listener.getsockname()[1]
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._held.append(conn)  # held open, never read, never answered

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def close(self) -> None:
        self._listener.close()
        for conn in self._held:
            conn.close()
