"""Policies decided from the request head alone, and the one ASGI step that runs a row of them.

A `HeadPolicy` is a plain ASGI middleware (the shape of Starlette's `TrustedHostMiddleware`):
usable on its own, passes non-HTTP scopes through, validates its options once in `__init__`.
Its decision is `admit(scope)`: None lets the request on (possibly after annotating the scope,
as authentication does with `scope["auth"]`); an `McpError` (returned or raised) answers it
with its status, headers and JSON-RPC body, the one refusal shape of the gateway
(protocol/jsonrpc.py). `admit` may be a coroutine function, for a decision that needs I/O
(verifying a token against a key set, a shared rate limit in Redis); a synchronous one is
called without an await, so the usual checks cost what a function call costs.

`gateway.app` still declares every policy, in order, in one list. When several head policies
follow each other there, `HeadPhase` runs their `admit`s in that order inside one ASGI step:
the same decisions, without a coroutine frame per policy that every later suspension of the
request would have to pass through again (bench/README.md "Profile").
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Sequence

from gateway import asgi
from gateway.protocol import jsonrpc as rpc


class HeadPolicy:
    # Close WebSocket handshakes instead of passing them on (a policy that guards every path,
    # as authentication does: the gateway serves no WebSocket endpoint, so none can ever
    # appear unguarded; ASGI: close before accept → HTTP 403).
    closes_websockets = False

    def __init__(self, app: asgi.ASGIApp) -> None:
        self.app = app

    def admit(self, scope: asgi.Scope) -> rpc.McpError | None | Awaitable[rpc.McpError | None]:
        raise NotImplementedError

    @functools.cached_property
    def _phase(self) -> HeadPhase:
        return HeadPhase(self.app, (self,))

    async def __call__(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        # Used on its own (outside `gateway.app.wrap`): the same decision as in a row.
        await self._phase(scope, receive, send)


class HeadPhase:
    """Consecutive head policies as one ASGI step; the first refusal answers."""

    def __init__(self, app: asgi.ASGIApp, policies: Sequence[HeadPolicy]) -> None:
        self.app = app
        self.policies = tuple(policies)
        # (admit, is a coroutine function): decided once, so a sync admit pays no await.
        self._admits = tuple((p.admit, inspect.iscoroutinefunction(p.admit)) for p in self.policies)
        self._closes_websockets = any(p.closes_websockets for p in self.policies)

    async def __call__(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        kind = scope["type"]
        if kind == "http":
            try:
                for admit, awaits in self._admits:
                    refusal = (await admit(scope)) if awaits else admit(scope)
                    if refusal is not None:
                        await asgi.send_error(send, refusal)
                        return
            except rpc.McpError as refusal:
                await asgi.send_error(send, refusal)
                return
        elif kind == "websocket" and self._closes_websockets:
            await send({"type": "websocket.close", "code": 1008})
            return
        await self.app(scope, receive, send)
