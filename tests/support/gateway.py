"""Run the gateway in-process on a real loopback socket, in the test's own event loop, so
tests can drive it over HTTP and still look at its runtime."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import uvicorn

from gateway.app import GatewayApp, build_app
from gateway.cli import uvicorn_config
from gateway.settings import GatewaySettings, load_settings


class RunningGateway:
    def __init__(self, app: GatewayApp, port: int) -> None:
        self.app = app
        self.port = port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.app.settings.server.path}"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def runtime(self) -> Any:
        return self.app.runtime


@contextlib.asynccontextmanager
async def running_gateway(settings: GatewaySettings | dict[str, Any], *, discover: bool = True,
                          uvicorn_options: dict[str, Any] | None = None) -> AsyncIterator[RunningGateway]:
    if isinstance(settings, dict):
        settings = load_settings(None, **settings)
    # IPPROTO_TCP: asyncio sets TCP_NODELAY only when the socket's proto says TCP; without it
    # every answer of this in-process gateway waits out Nagle + delayed ACK (~40 ms).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = build_app(settings)
    # The production uvicorn configuration (its HTTP protocol included), minus logging noise.
    server = uvicorn.Server(uvicorn_config(app, settings, **{"log_level": "warning", "access_log": False,
                                                             "timeout_graceful_shutdown": 2, **(uvicorn_options or {})}))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    if discover:
        await app.runtime.discover_all()
    try:
        yield RunningGateway(app, port)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)
        sock.close()
