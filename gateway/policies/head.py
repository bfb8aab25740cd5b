"""Policies decided from the request head alone, and the one ASGI step that runs a row of them.

A `HeadPolicy` is a plain ASGI middleware (the shape of Starlette's `TrustedHostMiddleware`):
usable on its own, passes non-HTTP scopes through, validates its options once in `__init__`.
Its decision is a synchronous `admit(scope)`: None lets the request on (possibly after
annotating the scope, as authentication does with `scope["auth"]`), a `Refusal` answers it.

`gateway.app` still declares every policy, in order, in one list. When several head policies
follow each other there, `HeadPhase` runs their `admit`s in that order inside one ASGI step:
the same decisions, without a coroutine frame per policy that every later suspension of the
request would have to pass through again (measured: bench/README.md "Profile").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway import asgi
from gateway.protocol import jsonrpc as rpc


@dataclass(frozen=True, slots=True)
class Refusal:
    """An id-less -32600 answered before the body is read (digest §a.3: 403, 413, 431)."""

    status: int
    message: str

    async def send(self, send: asgi.Send) -> None:
        await asgi.send_json(send, self.status, rpc.error_message(None, rpc.INVALID_REQUEST, self.message))


class HeadPolicy:
    def __init__(self, app: asgi.ASGIApp) -> None:
        self.app = app

    def admit(self, scope: asgi.Scope) -> Refusal | None:
        raise NotImplementedError

    async def __call__(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        if scope["type"] == "http":
            refusal = self.admit(scope)
            if refusal is not None:
                await refusal.send(send)
                return
        await self.app(scope, receive, send)


class HeadPhase:
    """Consecutive head policies as one ASGI step; the first refusal answers."""

    def __init__(self, app: asgi.ASGIApp, policies: Sequence[HeadPolicy]) -> None:
        self.app = app
        self.policies = tuple(policies)
        self._admits = tuple(p.admit for p in self.policies)

    async def __call__(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        if scope["type"] == "http":
            for admit in self._admits:
                refusal = admit(scope)
                if refusal is not None:
                    await refusal.send(send)
                    return
        await self.app(scope, receive, send)
