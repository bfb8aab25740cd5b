"""Operational endpoints beside the MCP endpoint: liveness, readiness, metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway import asgi

if TYPE_CHECKING:
    from gateway.runtime import Runtime


async def healthz(scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
    await asgi.send_json(send, 200, {"status": "ok"})


class Readyz:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def __call__(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        ready, backends = await self.runtime.readiness()
        await asgi.send_json(send, 200 if ready else 503,
                             {"status": "ready" if ready else "not ready", "backends": backends})


async def metrics(scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
    await asgi.send_bytes(send, 200, generate_latest(), [(b"content-type", CONTENT_TYPE_LATEST.encode())])
