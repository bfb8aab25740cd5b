"""Operational endpoints: liveness, readiness, metrics. Served beside the MCP endpoint, or
on a listener of their own (`server.ops_port`, `OpsApp`) without the MCP pipeline's Host,
Origin and authentication checks: the kubelet and Prometheus send `Host: <pod IP>` and no
token, and nothing here takes input or says more than a backend's name and state."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway import asgi
from gateway.protocol import jsonrpc as rpc

if TYPE_CHECKING:
    from gateway.readiness import BackendStates

PATHS = ("/healthz", "/readyz", "/metrics")


async def healthz(scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
    await asgi.send_json(send, 200, {"status": "ok"})


class Readyz:
    """200 or 503 from the backends' remembered health (readiness.py): never waits on a
    backend, so it answers in well under the kubelet's probe timeout whatever they do."""

    def __init__(self, states: BackendStates) -> None:
        self.states = states

    async def __call__(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        await asgi.send_json(send, 200 if self.states.ready else 503, self.states.report())


async def metrics(scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
    await asgi.send_bytes(send, 200, generate_latest(), [(b"content-type", CONTENT_TYPE_LATEST.encode())])


class OpsApp:
    """The operations listener's whole application: the three paths, nothing else."""

    def __init__(self, states: BackendStates) -> None:
        self.routes: dict[str, asgi.ASGIApp] = {"/healthz": healthz, "/readyz": Readyz(states), "/metrics": metrics}

    async def __call__(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        if scope["type"] != "http":
            return  # lifespan: the MCP listener's application owns the runtime
        target = self.routes.get(scope["path"])
        if target is None:
            await asgi.send_json(send, 404, rpc.error_message(None, rpc.INVALID_REQUEST,
                                                              f"Not Found: {scope['path']} (operations listener)"))
            return
        await target(scope, receive, send)
