"""`mcp-gateway serve | check-config | routes | cache flush | pins list|accept | healthcheck | demo-backend`."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import socket
import sys
from collections.abc import Callable
from typing import Any

from gateway import __version__, descriptors
from gateway.settings import CONFIG_ENV, ConfigError, GatewaySettings, load_settings

log = logging.getLogger("gateway")


def _load_or_print_problems(path: str | None) -> GatewaySettings | None:
    """The settings in `path` (else $MCP_GATEWAY_CONFIG's file, else the defaults) and the
    environment; None once their problems are printed (the command then fails)."""
    try:
        return load_settings(path or os.environ.get(CONFIG_ENV))
    except ConfigError as exc:
        _print_problems(exc)
        return None


def _with_server(settings: GatewaySettings, **changes: Any) -> GatewaySettings:
    changes = {k: v for k, v in changes.items() if v is not None}
    if not changes:
        return settings
    return settings.model_copy(update={"server": settings.server.model_copy(update=changes)})


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: on the plain asyncio loop, accepted connections get TCP_NODELAY only
    # when the socket's proto says TCP (uvloop sets it regardless). Without it a response's
    # separate header and body writes wait out Nagle + the client's delayed ACK (~40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def uvicorn_config(app: Any, settings: GatewaySettings, *, front_tls: bool = True, **overrides: Any) -> Any:
    """The uvicorn configuration the gateway runs under (tests use it too, so that they run
    the same HTTP protocol as production); with `server.tls` on the MCP listener
    (`front_tls`), never on the ops listener, whose probes speak plain HTTP."""
    import uvicorn

    from gateway.http11 import Http11Protocol

    options: dict[str, Any] = dict(
        host=settings.server.host,
        port=settings.server.port,
        lifespan="on",
        log_level=settings.observability.log_level,
        # uvicorn's loggers propagate to the gateway's one handler (observability/logs.py);
        # its own access line is replaced by the gateway's, which knows the MCP request.
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=settings.server.graceful_shutdown_seconds,
        server_header=False,
        # The hot path (bench/README.md "Profile"): the gateway's own HTTP/1.1
        # protocol (gateway/http11.py) unless `server.http: uvicorn` asks for uvicorn's
        # httptools one. No X-Forwarded-* rewriting: nothing in the gateway reads
        # scope["client"] or scope["scheme"], so that middleware was pure cost per request.
        # A deep listen backlog for bursts of new connections.
        http=Http11Protocol if settings.server.http == "gateway" else "httptools",
        proxy_headers=False,
        backlog=4096,
    )
    if settings.server.tls is not None and front_tls:
        from gateway import front_tls as tls

        options.update(tls.uvicorn_options(settings.server.tls))
    options.update(overrides)
    return uvicorn.Config(app, **options)


class _StartupRefused(Exception):
    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems


def _bind_or_refuse(field: str, host: str, port: int) -> socket.socket:
    try:
        return _bind(host, port)
    except OSError as exc:
        raise _StartupRefused([(field, f"cannot listen on {host}:{port}: {exc.strerror or exc}")]) from None


def _with_demo(settings: GatewaySettings, demo_port: int | None) -> GatewaySettings:
    """The settings with the embedded demo backend appended when they ask for it (`demo`, or
    no backends). Raises ConfigError when they ask for it and none runs (`demo_port` None: it
    starts only at start-up)."""
    if not (settings.demo or not settings.backends):
        return settings
    if demo_port is None:
        raise ConfigError([("demo", "the bundled demo backend starts only at start-up: restart the gateway to "
                                    "serve it (or declare backends)")])
    return settings.model_copy(update={"backends": (
        *settings.backends,
        *GatewaySettings(backends=[{"name": "demo", "url": f"http://127.0.0.1:{demo_port}/mcp",
                                    "era": "modern"}]).backends,
    )})


async def _serve(settings: GatewaySettings, load: Callable[[], GatewaySettings] | None = None,
                 watch: str | None = None) -> None:
    """Serve `settings`; `load` reads the configuration again for a reload (SIGHUP, and
    `watch`: the file to poll for changes)."""
    import uvicorn

    from gateway.app import build_app
    from gateway.demo.backend import demo_app
    from gateway.lifecycle import Lifecycle, Listener, run_until_stopped
    from gateway.preflight import find_problems
    from gateway.reload.reloader import Reloader
    from gateway.reload.watch import ConfigWatcher

    # Listen streams hold a descriptor each: take every one the hard limit allows.
    descriptors.raise_soft_limit()
    server_settings = settings.server
    demo_server = None
    demo_port: int | None = None
    if settings.demo or not settings.backends:
        demo_sock = _bind("127.0.0.1", 0)
        demo_port = demo_sock.getsockname()[1]
        # log_config=None as for the gateway's own listeners (uvicorn_config): its lines go
        # through the one handler, in the configured format.
        # No log_level: uvicorn.Config sets it on the loggers all listeners share, and the MCP
        # listener's (observability.log_level) must hold; `secondary` keeps the banner single.
        demo_server = Listener(uvicorn.Config(demo_app, lifespan="off", log_config=None, access_log=False),
                               secondary=True)
        settings = _with_demo(settings, demo_port)
        log.info("no backends configured: serving the bundled demo backend on 127.0.0.1:%d", demo_port)
    try:
        app = build_app(settings)
    except Exception:
        # The field-named problems check-config would print, not a traceback.
        problems = await find_problems(settings)
        raise _StartupRefused(problems or [("<start-up>", "building the gateway failed")]) from None
    # Bind before anything starts: a port in use is a clear error, not a half-started process.
    mcp_sock = _bind_or_refuse("server.port", server_settings.host, server_settings.port)
    ops_sock = None
    if server_settings.ops_port is not None:
        ops_sock = _bind_or_refuse("server.ops_port", server_settings.ops_host or server_settings.host,
                                   server_settings.ops_port)
    demo_task = None
    if demo_server is not None:
        demo_task = asyncio.create_task(demo_server.serve(sockets=[demo_sock]))

    reloader = Reloader(app.runtime, lambda: _with_demo((load or (lambda: settings))(), demo_port))
    watcher = ConfigWatcher(watch, lambda: reloader.request("watch")) if watch else None

    class GatewayServer(Listener):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            # Everything alive now (modules, settings, the runtime) lives as long as the
            # process: move it out of the collector's generations, so that a full collection
            # no longer walks it. Those walks were the pass-through p99 (tens of ms every few
            # seconds under load; bench/README.md "Profile").
            gc.freeze()
            # Discovery runs in the background and fills the route table (tool indexes, URIs):
            # long-lived too, and with 1,000 backends the bulk of the heap. Freeze it when done.
            discovery = app.runtime.discovery_task
            if discovery is not None:
                discovery.add_done_callback(lambda _task: gc.freeze())

        async def shutdown(self, sockets: Any = None) -> None:
            # Stop accepting first, then give long-lived streams their clean end, so that the
            # drain of in-flight requests can finish instead of waiting out the deadline.
            for listener in getattr(self, "servers", ()):
                listener.close()
            # No reload once the stop began: the runtime is about to close.
            if watcher is not None:
                await watcher.aclose()
            await reloader.aclose()
            await app.begin_shutdown()
            await super().shutdown(sockets)

    mcp = GatewayServer(uvicorn_config(app, settings))
    ops_server = None
    if ops_sock is not None:
        ops_server = Listener(uvicorn_config(app.ops_app, settings, front_tls=False, lifespan="off",
                                             access_log=False), secondary=True)
    lifecycle = Lifecycle(app.runtime.readiness, drain_delay_seconds=server_settings.drain_delay_seconds)
    if server_settings.tls is not None:
        from gateway.front_tls import reload_certificates

        tls_settings = server_settings.tls
        # SIGHUP: the renewed certificate, beside the configuration (Lifecycle.on_reload).
        lifecycle.add_reloader("the server.tls certificate",
                               lambda: reload_certificates(mcp.config.ssl, tls_settings))

    def started() -> None:
        # Reloads start once the runtime runs (a SIGHUP before that is only logged).
        lifecycle.add_reloader("configuration", lambda: reloader.request("SIGHUP"))
        if watcher is not None:
            watcher.start()
        ops_line = ""
        if ops_sock is not None:
            ops_host = server_settings.ops_host or server_settings.host
            ops_line = f"; operations (/healthz, /readyz, /metrics) on http://{ops_host}:{ops_sock.getsockname()[1]}"
        scheme = "https" if server_settings.tls is not None else "http"
        mcp_url = f"{scheme}://{server_settings.host}:{mcp_sock.getsockname()[1]}{server_settings.path}"
        log.info("mcp-gateway %s listening on %s with %d backend(s): %s%s", __version__, mcp_url,
                 len(settings.backends), ", ".join(b.name for b in settings.backends), ops_line)

    try:
        await run_until_stopped(lifecycle, mcp, [mcp_sock], ops_server, [ops_sock] if ops_sock else [],
                                on_started=started)
    finally:
        # The embedded backend outlives the gateway's drain: in-flight calls need it.
        if demo_server is not None and demo_task is not None:
            demo_server.should_exit = True
            await demo_task
    log.info("stopped")


def cmd_serve(args: argparse.Namespace) -> int:
    settings = _load_or_print_problems(args.config)
    if settings is None:
        return 2
    settings = _with_server(settings, host=args.host, port=args.port)
    path = args.config or os.environ.get(CONFIG_ENV)
    if args.watch and path is None:
        print("serve --watch needs a configuration file (--config or $" + CONFIG_ENV + ")", file=sys.stderr)
        return 2

    def load() -> GatewaySettings:
        # Read again exactly as above: the file, the environment, the command-line overrides.
        return _with_server(load_settings(path), host=args.host, port=args.port)

    from gateway.observability import logs, tracing

    logs.configure(settings.observability.log_level, settings.observability.log_format)

    tracing.configure(settings.observability.tracing, settings.observability.tracing_exporter)
    if settings.observability.otlp_metrics:
        from gateway.observability import otel_metrics

        otel_metrics.configure(True)
    try:
        import uvloop  # noqa: F401  (uvicorn[standard]: the fast loop)

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        runner(_serve(settings, load, watch=path if args.watch else None))
    except _StartupRefused as exc:
        _print_problems(ConfigError(exc.problems))
        return 2
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(args.file)
    except ConfigError as exc:
        _print_problems(exc)
        return 1
    from gateway.preflight import startup_problems

    # Everything serve builds at start-up, built here too: what passes never crashes serve.
    problems = startup_problems(settings)
    if problems:
        _print_problems(ConfigError(problems))
        return 1
    print(f"{args.file}: OK ({len(settings.backends)} backend(s), cache: {settings.cache.store}, "
          f"auth: {settings.auth.mode})")
    return 0


def cmd_routes(args: argparse.Namespace) -> int:
    settings = _load_or_print_problems(args.config)
    if settings is None:
        return 1
    for b in settings.backends:
        where = b.url or " ".join(b.command or ())
        prefix = settings.prefix_of(b)
        transport = "stdio" if b.command else b.transport
        print(f"{b.name:<20} era={b.era:<7} transport={transport:<16} prefix={prefix!r:<16} {where}")
        for p in b.resource_prefixes:
            print(f"{'':<20} resources under {p!r}")
    return 0


def cmd_cache_flush(args: argparse.Namespace) -> int:
    settings = _load_or_print_problems(args.config)
    if settings is None:
        return 1
    from gateway.cache import admin
    from gateway.redis_client import plan_of

    if args.backend is not None and args.backend not in {b.name for b in settings.backends}:
        print(f"cache flush: no backend is named {args.backend!r} in the configuration", file=sys.stderr)
        return 1
    try:
        removed = asyncio.run(admin.flush(settings.cache, args.backend, redis=settings.cache_redis(),
                                          known_backends=tuple(b.name for b in settings.backends)))
    except admin.NotFlushable as exc:
        print(f"cache flush: {exc}", file=sys.stderr)
        return 1
    except admin.StoreUnavailable as exc:
        shown = plan_of(settings.cache_redis()).describe()
        print(f"cache flush: redis at {shown} is unavailable: {exc}", file=sys.stderr)
        return 1
    what = f"backend {args.backend!r}" if args.backend else "every backend"
    print(f"cache flushed for {what}: {removed} key(s) removed")
    return 0


def cmd_pins(args: argparse.Namespace) -> int:
    settings = _load_or_print_problems(args.config)
    if settings is None:
        return 1
    from gateway.routing.pins import store_of

    pinned_backends = {b.name for b in settings.backends if b.pin != "off"}
    if args.pins_command == "accept" and args.backend not in pinned_backends:
        print(f"pins accept: no backend named {args.backend!r} has pin: warn or block", file=sys.stderr)
        return 1

    async def run() -> int:
        store = store_of(settings)
        try:
            if args.pins_command == "accept":
                accepted = await store.accept(args.backend, args.tool)
                if not accepted:
                    what = f"tool {args.tool!r} of " if args.tool else ""
                    print(f"pins accept: nothing to accept for {what}backend {args.backend!r}", file=sys.stderr)
                    return 1
                print(f"accepted the new definition of {', '.join(sorted(accepted))} ({args.backend}); "
                      f"running gateways serve it within seconds")
                return 0
            pinned, pending = await store.load()
            for backend in sorted(pinned_backends):
                tools = pinned.get(backend, {})
                changes = pending.get(backend, {})
                print(f"{backend}: {len(tools)} pinned, {len(changes)} changed")
                for tool in sorted(changes):
                    change = changes[tool]
                    definition = change.get("definition") or {}
                    print(f"  CHANGED {tool}: pinned {change.get('pinned', '?')[:12]} -> now {change['digest'][:12]}; "
                          f"description now: {definition.get('description', '')!r}")
            return 0
        finally:
            await store.aclose()

    try:
        return asyncio.run(run())
    except Exception as exc:
        print(f"pins: cannot reach the pin store: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def cmd_healthcheck(args: argparse.Namespace) -> int:
    """Exit 0 when this configuration's /healthz (on the ops listener when there is one)
    answers 200: the image's HEALTHCHECK, and compose's, without a port written twice."""
    import urllib.error
    import urllib.request

    settings = _load_or_print_problems(args.config)
    if settings is None:
        return 1
    server = settings.server
    host = (server.ops_host or server.host) if server.ops_port is not None else server.host
    port = server.ops_port if server.ops_port is not None else server.port
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1" if host != "::" else "::1"
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}{args.path}"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as response:  # noqa: S310 - our own loopback URL
            ok = response.status == 200
    except (urllib.error.URLError, OSError) as exc:
        print(f"healthcheck: {url}: {exc}", file=sys.stderr)
        return 1
    return 0 if ok else 1


def cmd_demo_backend(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.demo.backend import demo_app

    uvicorn.run(demo_app, host=args.host, port=args.port, log_level="warning", lifespan="off")
    return 0


def _print_problems(exc: ConfigError) -> None:
    print("configuration is invalid:", file=sys.stderr)
    for loc, msg in exc.problems:
        print(f"  {loc}: {msg}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mcp-gateway", description="A gateway for the Model Context Protocol.")
    parser.add_argument("--version", action="version", version=f"mcp-gateway {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the gateway")
    p.add_argument("--config", help=f"YAML config file (or ${CONFIG_ENV}); none: the bundled demo backend")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--watch", action="store_true",
                   help="reload when the config file changes (as on SIGHUP; docs/reload.md)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("check-config", help="validate a config file and print every problem")
    p.add_argument("file")
    p.set_defaults(func=cmd_check_config)

    p = sub.add_parser("routes", help="print the backends and the names they own")
    p.add_argument("--config")
    p.set_defaults(func=cmd_routes)

    p = sub.add_parser("cache", help="operate on the shared response cache")
    cache_sub = p.add_subparsers(dest="cache_command", required=True)
    p = cache_sub.add_parser("flush", help="drop cached answers (store: redis), for every replica")
    p.add_argument("--config", help=f"YAML config file (or ${CONFIG_ENV})")
    p.add_argument("--backend", help="only this backend's entries")
    p.set_defaults(func=cmd_cache_flush)

    p = sub.add_parser("pins", help="pinned tool definitions (backends[].pin)")
    pins_sub = p.add_subparsers(dest="pins_command", required=True)
    p = pins_sub.add_parser("list", help="what is pinned, and which definitions changed")
    p.add_argument("--config", help=f"YAML config file (or ${CONFIG_ENV})")
    p.set_defaults(func=cmd_pins)
    p = pins_sub.add_parser("accept", help="accept the changed definitions of a backend (or one tool)")
    p.add_argument("backend")
    p.add_argument("tool", nargs="?")
    p.add_argument("--config", help=f"YAML config file (or ${CONFIG_ENV})")
    p.set_defaults(func=cmd_pins)

    p = sub.add_parser("healthcheck", help="exit 0 when the running gateway's /healthz answers 200")
    p.add_argument("--config", help=f"YAML config file (or ${CONFIG_ENV})")
    p.add_argument("--path", default="/healthz", help="/healthz (default) or /readyz")
    p.add_argument("--timeout", type=float, default=2.0)
    p.set_defaults(func=cmd_healthcheck)

    p = sub.add_parser("demo-backend", help="run the bundled demo MCP backend on its own")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9001)
    p.set_defaults(func=cmd_demo_backend)

    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
