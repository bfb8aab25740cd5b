"""build_app(settings): the gateway as one ASGI application.

The request pipeline is declared here, in order, as data (the shape of Starlette's
`Middleware` list):

    telemetry → host (loopback or allowed_hosts) → origin → authenticate → authorize → size limits → MCP endpoint
                                                                  (parse → validate → route →
                                                                   cache → forward → rewrite)

Host, origin, authentication, authorization (where Mcp-Method / Mcp-Name suffice) and size
limits decide from the head alone: `wrap` runs such a
row as one step (policies/head.py), and each refuses with an `McpError`. Everything after
"size limits" runs in `McpEndpoint` and `Dispatcher`, because it needs the body. Paths are matched by exact lookup:
the hot path pays for no regex router.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from starlette.middleware import Middleware

from gateway import asgi, ops
from gateway.endpoint import McpEndpoint
from gateway.legacy_clients import LegacyClients
from gateway.legacy_clients.fleet import fleet_from_settings
from gateway.legacy_clients.sse_front import SseFront
from gateway.observability import metrics
from gateway.observability.logs import AccessLog
from gateway.observability.middleware import RequestTelemetry
from gateway.policies.auth import NoAuth
from gateway.policies.authorization import Authorization, PrefixResolver, RuleSet
from gateway.policies.head import HeadPhase, HeadPolicy
from gateway.policies.jwt_auth import JwtAuth
from gateway.policies.jwt_config import metadata_paths
from gateway.policies.limits import RequestLimits
from gateway.policies.origin import HostPolicy, OriginPolicy
from gateway.policies.prm import ProtectedResourceMetadata
from gateway.protocol import jsonrpc as rpc
from gateway.routing.views import sse_paths
from gateway.runtime import Runtime
from gateway.settings import GatewaySettings

log = logging.getLogger("gateway.app")


# Served beside the MCP endpoint unless server.ops_port moves them to a listener of their own;
# open even when auth.mode is jwt (k8s probes carry no token).
OPERATIONAL_PATHS = ops.PATHS


def pipeline(settings: GatewaySettings, rules: RuleSet | None = None) -> list[Middleware]:
    """The header-phase policies, outermost first. Views (routing/views.py) are MCP paths like
    the main one: the same steps guard them."""
    server = settings.server
    view_paths = tuple(v.path for v in settings.views)
    steps: list[Middleware] = [Middleware(RequestTelemetry, **telemetry_options(settings))]
    checks_host = server.bound_to_loopback or bool(server.allowed_hosts)
    if checks_host:
        steps.append(Middleware(HostPolicy, allowed_hosts=server.allowed_hosts))
    steps.append(Middleware(OriginPolicy, allowed_origins=server.allowed_origins, trust_same_host=checks_host))
    if settings.auth.mode == "jwt":
        # Probes and OAuth discovery carry no token: those paths stay open, every other path
        # (the MCP endpoint, and any route added later) needs one (docs/auth.md).
        ops_here = OPERATIONAL_PATHS if server.ops_port is None else ()
        open_paths = (*ops_here, *(p for path in (server.path, *view_paths)
                                   for p in metadata_paths(settings.auth, path)))
        steps.append(Middleware(JwtAuth, auth=settings.auth, open_paths=open_paths, mcp_path=server.path,
                                view_paths=view_paths))
    else:
        steps.append(Middleware(NoAuth))
    if rules is not None:
        # Decided from Mcp-Method / Mcp-Name where they suffice; the dispatcher decides the rest.
        # The global rules only: a view's own are decided by its dispatcher.
        steps.append(Middleware(Authorization, rules=rules, resolver=PrefixResolver(settings),
                                mcp_paths=(server.path, *view_paths)))
    steps.append(Middleware(RequestLimits, max_body_bytes=server.max_body_bytes))
    return steps


def telemetry_options(settings: GatewaySettings) -> dict[str, Any]:
    """What the telemetry step needs: the MCP paths it watches (initialize-era HTTP+SSE
    messages too) and the access log when configured (docs/observability.md)."""
    server, observability = settings.server, settings.observability
    legacy_paths: tuple[str, ...] = ()
    if server.legacy_clients and server.legacy_sse_path is not None:
        legacy_paths = (f"{server.legacy_sse_path.rstrip('/')}/messages",)
        legacy_paths += tuple(paths[1] for v in settings.views if (paths := sse_paths(v.path, settings)))
    access_log = AccessLog(log_format=observability.log_format, sample=observability.access_log_sample) \
        if observability.access_log else None
    return {"path": server.path, "legacy_paths": legacy_paths, "access_log": access_log,
            "max_body_bytes": server.max_body_bytes, "view_paths": tuple(v.path for v in settings.views)}


def wrap(app: asgi.ASGIApp, steps: Sequence[Middleware]) -> asgi.ASGIApp:
    """Build the pipeline around `app`, outermost step first in `steps`. A row of consecutive
    head policies becomes one `HeadPhase` step that runs their checks in the declared order
    (policies/head.py says why)."""
    row: list[HeadPolicy] = []
    for cls, args, kwargs in reversed(steps):
        if issubclass(cls, HeadPolicy):
            row.insert(0, cls(app, *args, **kwargs))
            continue
        app = _head_phase(app, row)
        row = []
        app = cls(app, *args, **kwargs)
    return _head_phase(app, row)


def _head_phase(app: asgi.ASGIApp, row: list[HeadPolicy]) -> asgi.ASGIApp:
    if not row:
        return app
    return HeadPhase(app, row)


class GatewayApp:
    """Path dispatch plus the ASGI lifespan that starts and stops the runtime."""

    def __init__(self, settings: GatewaySettings, runtime: Runtime | None = None) -> None:
        self.settings = settings
        self.runtime = runtime or Runtime(settings)
        server = settings.server
        # Initialize-era clients get gateway sessions on the same endpoint (digest §h.9), and
        # HTTP+SSE clients (2024-11-05) their own two paths, served by the same sessions.
        self.legacy_clients, self.sse_front, self.routes = self._mcp_routes(
            self.runtime.live, server.path, server.legacy_sse_path)
        # Views: one MCP endpoint per path, the same endpoint code over the view's dispatcher,
        # with sessions (and /sse) of their own (routing/views.py).
        self.view_legacy_clients: list[LegacyClients] = []
        self.view_sse_fronts: list[SseFront] = []
        for view in self.runtime.views:
            sse = sse_paths(view.path, settings)
            clients, front, routes = self._mcp_routes(self.runtime.live_view(view.path), view.path,
                                                      sse[0] if sse is not None else None)
            if clients is not None:
                self.view_legacy_clients.append(clients)
            if front is not None:
                self.view_sse_fronts.append(front)
            self.routes.update(routes)
        # With an operations listener the probes and metrics live there only (`ops_app`).
        self.ops_app = ops.OpsApp(self.runtime.readiness)
        if server.ops_port is None:
            self.routes.update(self.ops_app.routes)
        if settings.auth.mode == "jwt":
            metadata = ProtectedResourceMetadata(settings.auth)
            for path in (server.path, *(v.path for v in self.runtime.views)):
                self.routes.update({p: metadata for p in metadata_paths(settings.auth, path)})
        self.app = wrap(self._route, pipeline(settings, self.runtime.rules))
        _export_gauges(self)

    def _mcp_routes(self, dispatcher: Any, path: str, sse_path: str | None
                    ) -> tuple[LegacyClients | None, SseFront | None, dict[str, asgi.ASGIApp]]:
        """One MCP endpoint at `path` over `dispatcher` (the whole fleet's, or a view's): its
        initialize-era sessions when configured, and its HTTP+SSE paths when `sse_path`."""
        settings, server = self.settings, self.settings.server
        view = path if path != server.path else None
        legacy_clients = LegacyClients(
            dispatcher,
            idle_seconds=server.legacy_session_idle_seconds,
            max_sessions=server.legacy_max_sessions,
            keepalive_seconds=server.keepalive_seconds,
            input_timeout_seconds=server.legacy_input_timeout_seconds,
            # Sessions any replica serves (secret + Redis).
            fleet=fleet_from_settings(settings, self.runtime.replica.owner, view=view),
        ) if server.legacy_clients else None
        endpoint = McpEndpoint(
            dispatcher,
            max_body_bytes=server.max_body_bytes,
            keepalive_seconds=server.keepalive_seconds,
            legacy_clients=legacy_clients,
        )
        routes: dict[str, asgi.ASGIApp] = {path: endpoint}
        sse_front: SseFront | None = None
        if legacy_clients is not None and sse_path is not None:
            # Behind the same pipeline (host, origin, auth, limits).
            sse_front = SseFront(legacy_clients, path=sse_path, keepalive_seconds=server.keepalive_seconds,
                                 max_connections=server.legacy_max_sessions, max_body_bytes=server.max_body_bytes)
            routes.update({sse_front.path: sse_front.stream, sse_front.messages_path: sse_front.message})
        return legacy_clients, sse_front, routes

    async def begin_shutdown(self) -> None:
        """The server stops accepting: long-lived streams end now, cleanly, so the drain can
        finish instead of being held (and then cut) until the deadline: /sse streams,
        initialize-era GET streams, and modern listens (their graceful-closure result)."""
        for front in (self.sse_front, *self.view_sse_fronts):
            if front is not None:
                front.close_all()
        for clients in self._all_legacy_clients():
            clients.end_streams()
        await self.runtime.begin_shutdown()

    def _all_legacy_clients(self) -> list[LegacyClients]:
        main = [self.legacy_clients] if self.legacy_clients is not None else []
        return main + self.view_legacy_clients

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
                    for clients in self._all_legacy_clients():
                        await clients.start()
                except Exception as exc:
                    log.exception("start-up failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                for clients in self._all_legacy_clients():
                    await clients.aclose()
                await self.runtime.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return


def _export_gauges(app: GatewayApp) -> None:
    """Series for every known backend and method from the start, and the gauges read at scrape
    time from the objects that hold the number (observability/metrics.py)."""
    from gateway.observability.tracing import server_address

    metrics.initialise((b.name, server_address(b.settings).get("server.address", "")) for b in app.runtime.backends)
    every = app._all_legacy_clients()
    if every:
        metrics.gauge_callback(metrics.LEGACY_CLIENT_SESSIONS, "Open gateway sessions of initialize-era clients.",
                               lambda: [((), float(sum(len(c.sessions) for c in every)))])
    backends = app.runtime.backends

    def backend_sessions() -> list[tuple[tuple[str, ...], float]]:
        out = []
        for backend in backends:
            # era: auto holds its legacy delegate (detect.py AutoBackend).
            for one in (backend, *getattr(backend, "_delegates", {}).values()):
                pool = getattr(one, "pool", None)
                if pool is not None:
                    out.append(((backend.name,), float(len(pool.sessions()))))
        return out

    metrics.gauge_callback(metrics.BACKEND_SESSIONS, "Open sessions with initialize-era backends.",
                           backend_sessions, ("backend",))


def build_app(settings: GatewaySettings, runtime: Runtime | None = None) -> GatewayApp:
    return GatewayApp(settings, runtime)
