"""The bench backend answering on many URL paths: one process stands in for a fleet.

    python bench/fleet_backend.py --port 9001 [--tools 50] [--ttl-ms 0]

Every POST to ``/fleet/<anything>`` is answered exactly as the modern bench backend
(``bench/backend.py``) answers ``/mcp``, so a gateway configured with 1,000 backends
``http://127.0.0.1:P/fleet/b0000`` ... ``/fleet/b0999`` really talks to 1,000 distinct upstream
URLs (its own connection pool and route per backend) while one process on one CPU does the
answering.  That keeps CPU use the same at every fleet size: the scale curves then measure
what the gateway's cost does as the fleet grows, not how many backend processes share a core.
``GET /healthz`` and ``GET /stats`` are the backend's own.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import backend as bench_backend  # noqa: E402

FLEET_PREFIX = "/fleet/"


class Fleet:
    """ASGI wrapper: maps every ``/fleet/...`` path onto the wrapped backend's one path."""

    def __init__(self, app: bench_backend.Base) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith(FLEET_PREFIX):
            scope = {**scope, "path": self.app.path}
        await self.app(scope, receive, send)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--tools", type=int, default=50, help="tools in each backend's tools/list")
    p.add_argument("--ttl-ms", type=int, default=0, help="ttlMs on cacheable results")
    a = p.parse_args(argv)
    if a.tools < 1 or a.ttl_ms < 0:
        p.error("--tools must be >= 1 and --ttl-ms >= 0")

    import uvicorn

    app = Fleet(bench_backend.build_app("modern", a.tools, a.ttl_ms))
    kwargs = dict(host=a.host, port=a.port, log_level="warning", access_log=False,
                  lifespan="on", server_header=False, date_header=False)
    try:
        import httptools  # noqa: F401
        import uvloop  # noqa: F401

        kwargs.update(loop="uvloop", http="httptools")
    except ImportError:  # pragma: no cover - still works, just slower
        print("fleet backend: uvloop/httptools missing, using defaults", file=sys.stderr)
    print(f"fleet backend: modern on http://{a.host}:{a.port}{FLEET_PREFIX}* pid={os.getpid()}",
          file=sys.stderr, flush=True)
    uvicorn.run(app, **kwargs)


if __name__ == "__main__":
    main()
