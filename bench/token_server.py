"""A token endpoint for the credentials bench: every POST /token answers a fixed access token
valid for an hour (the gateway asks once and caches it; the bench measures the cached path).
stdlib only, so the harness can start it anywhere."""

from __future__ import annotations

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    grants = 0

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length") or 0))
        Handler.grants += 1
        self._json({"access_token": "bench-token-" + "x" * 600, "token_type": "Bearer", "expires_in": 3600})

    def do_GET(self) -> None:  # noqa: N802
        self._json({"grants": Handler.grants})  # /healthz and /stats

    def _json(self, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    ThreadingHTTPServer(("127.0.0.1", parser.parse_args().port), Handler).serve_forever()
