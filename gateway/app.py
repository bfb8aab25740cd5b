"""build_app(settings): the gateway as one ASGI application.

The request pipeline is declared here, in order, as data (the shape of Starlette's
`Middleware` list):

    telemetry → host (loopback only) → origin → authenticate → size limits → MCP endpoint
                                                                  (parse → validate → route →
                                                                   cache → forward → rewrite)

Everything after "size limits" runs in `McpEndpoint` and `Dispatcher`, because it needs the
body. Paths are matched by exact lookup: the hot path pays for no regex router.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from starlette.middleware import Middleware

from gateway import asgi, ops
from gateway.endpoint import McpEndpoint
from gateway.observability.middleware import RequestTelemetry
from gateway.policies.auth import NoAuth
from gateway.policies.limits import RequestLimits
from gateway.policies.origin import LoopbackHostPolicy, OriginPolicy
from gateway.protocol import jsonrpc as rpc
from gateway.runtime import Runtime
from gateway.settings import GatewaySettings

log = logging.getLogger("gateway.app")


def pipeline(settings: GatewaySettings) -> list[Middleware]:
    """The header-phase policies, outermost first."""
    server = settings.server
    steps: list[Middleware] = [Middleware(RequestTelemetry, path=server.path)]
    if server.bound_to_loopback:
        steps.append(Middleware(LoopbackHostPolicy, allowed_hosts=server.allowed_hosts))
    steps.append(Middleware(OriginPolicy, allowed_origins=server.allowed_origins))
    steps.append(Middleware(NoAuth))
    steps.append(Middleware(RequestLimits, max_body_bytes=server.max_body_bytes))
    return steps


def wrap(app: asgi.ASGIApp, steps: Sequence[Middleware]) -> asgi.ASGIApp:
    for cls, args, kwargs in reversed(steps):
        app = cls(app, *args, **kwargs)
    return app


class GatewayApp:
    """Path dispatch plus the ASGI lifespan that starts and stops the runtime."""

    def __init__(self, settings: GatewaySettings, runtime: Runtime | None = None) -> None:
        self.settings = settings
        self.runtime = runtime or Runtime(settings)
        endpoint = McpEndpoint(
            self.runtime.dispatcher,
            max_body_bytes=settings.server.max_body_bytes,
            keepalive_seconds=settings.server.keepalive_seconds,
        )
        self.routes: dict[str, asgi.ASGIApp] = {
            settings.server.path: endpoint,
            "/healthz": ops.healthz,
            "/readyz": ops.Readyz(self.runtime),
            "/metrics": ops.metrics,
        }
        self.app = wrap(self._route, pipeline(settings))

    async def _route(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        path = scope["path"]
        target = self.routes.get(path) or self.routes.get(path.rstrip("/") or "/")
        if target is None:
            await asgi.send_json(send, 404, rpc.error_message(None, rpc.INVALID_REQUEST, f"Not Found: {path}"))
            return
        await target(scope, receive, send)

    async def __call__(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        await self.app(scope, receive, send)

    async def _lifespan(self, receive: asgi.Receive, send: asgi.Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.runtime.start()
                except Exception as exc:
                    log.exception("start-up failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.runtime.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return


def build_app(settings: GatewaySettings, runtime: Runtime | None = None) -> GatewayApp:
    return GatewayApp(settings, runtime)
