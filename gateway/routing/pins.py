"""Pinned tool definitions: `backends[].pin: warn | block` (docs/governance.md).

The first time the gateway sees a tool of a pinned backend it records a digest of its
definition (name, title, description, input and output schemas, annotations). When the
backend later lists that tool with another definition — a "rug pull": a description or schema
changed after someone approved the tool — the change is logged and counted
(`mcp_gateway_tool_definition_changes_total`), recorded as pending with the new definition,
and with `block` the tool is withheld: absent from lists, its calls refused saying why, until
an operator accepts the new definition (`mcp-gateway pins accept BACKEND [TOOL]`; `pins list`
shows what changed).

Where pins live: Redis when the cache is there (`cache.store: redis`), so every replica agrees
on what is pinned and what is withheld; otherwise a JSON file (`pins.file`). Each replica
keeps a copy and reloads it every `_RELOAD_SECONDS`, which is how an accept made by the CLI
reaches running gateways. A tool with a pending change stays withheld after a restart, before
any list has passed.

Digests are taken of the backend's own definitions, before curation and prefixing: renaming
or redescribing a tool in the configuration is not a change of the backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from prometheus_client import Counter

if TYPE_CHECKING:
    from gateway.settings import GatewaySettings

log = logging.getLogger("gateway.pins")

_DEFINITION_FIELDS = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")
_RELOAD_SECONDS = 2.0

DEFINITION_CHANGES = Counter(
    "mcp_gateway_tool_definition_changes_total",
    "Tool definitions that changed since they were pinned, by backend and action (warned, withheld).",
    ["backend", "action"])


def digest(tool: dict[str, Any]) -> str:
    """sha256 of the definition's canonical JSON (sorted keys)."""
    definition = {k: tool[k] for k in _DEFINITION_FIELDS if k in tool}
    return hashlib.sha256(orjson.dumps(definition, option=orjson.OPT_SORT_KEYS)).hexdigest()


class PinStore(Protocol):
    """Pinned digests and pending changes, per backend. `pending` values: {"digest",
    "pinned" (the digest it replaces), "definition", "seen_at"}."""

    async def load(self) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, dict[str, Any]]]]: ...

    async def pin(self, backend: str, tool: str, digest: str) -> None:
        """Record `digest` unless the tool is already pinned (the first sighting wins)."""

    async def note_change(self, backend: str, tool: str, change: dict[str, Any]) -> None: ...

    async def accept(self, backend: str, tool: str | None) -> list[str]:
        """Pin the pending definitions (of one tool); the tools accepted."""

    async def aclose(self) -> None: ...


class FilePins:
    """Pins in one JSON file, rewritten atomically (a temporary file renamed over it)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def _read(self) -> dict[str, Any]:
        try:
            data = orjson.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {"pinned": {}, "pending": {}}
        return {"pinned": data.get("pinned") or {}, "pending": data.get("pending") or {}}

    def _write(self, data: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".pins-")
        with os.fdopen(fd, "wb") as f:
            f.write(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
        os.replace(tmp, self.path)

    async def load(self) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, dict[str, Any]]]]:
        data = self._read()
        return data["pinned"], data["pending"]

    async def pin(self, backend: str, tool: str, digest: str) -> None:
        data = self._read()
        if tool not in data["pinned"].setdefault(backend, {}):
            data["pinned"][backend][tool] = digest
            self._write(data)

    async def note_change(self, backend: str, tool: str, change: dict[str, Any]) -> None:
        data = self._read()
        data["pending"].setdefault(backend, {})[tool] = change
        self._write(data)

    async def accept(self, backend: str, tool: str | None) -> list[str]:
        data = self._read()
        pending = data["pending"].get(backend, {})
        accepted = [t for t in pending if tool is None or t == tool]
        for t in accepted:
            data["pinned"].setdefault(backend, {})[t] = pending.pop(t)["digest"]
        if accepted:
            self._write(data)
        return accepted

    async def aclose(self) -> None:
        pass


class RedisPins:
    """Pins in Redis: a hash of digests and a hash of pending changes per backend, both under
    the backend's hash tag (one slot: an accept is one MULTI, on Cluster too)."""

    def __init__(self, client: Any, *, prefix: str, backends: list[str]) -> None:
        self.client = client
        self.prefix = prefix
        self.backends = backends

    @classmethod
    def from_url(cls, url: str, *, prefix: str, backends: list[str], timeout_seconds: float) -> RedisPins:
        import redis.asyncio as aioredis

        return cls(aioredis.Redis.from_url(url, socket_timeout=timeout_seconds,
                                           socket_connect_timeout=timeout_seconds),
                   prefix=prefix, backends=backends)

    def _pinned(self, backend: str) -> str:
        return f"{self.prefix}:pins:{{{backend}}}"

    def _pending(self, backend: str) -> str:
        return f"{self.prefix}:pins:{{{backend}}}:pending"

    async def load(self) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, dict[str, Any]]]]:
        pinned: dict[str, dict[str, str]] = {}
        pending: dict[str, dict[str, dict[str, Any]]] = {}
        pipe = self.client.pipeline(transaction=False)
        for backend in self.backends:
            pipe.hgetall(self._pinned(backend))
            pipe.hgetall(self._pending(backend))
        answers = await pipe.execute()
        for i, backend in enumerate(self.backends):
            pinned[backend] = {k.decode(): v.decode() for k, v in answers[2 * i].items()}
            pending[backend] = {k.decode(): orjson.loads(v) for k, v in answers[2 * i + 1].items()}
        return pinned, pending

    async def pin(self, backend: str, tool: str, digest: str) -> None:
        await self.client.hsetnx(self._pinned(backend), tool, digest)

    async def note_change(self, backend: str, tool: str, change: dict[str, Any]) -> None:
        await self.client.hset(self._pending(backend), tool, orjson.dumps(change))

    async def accept(self, backend: str, tool: str | None) -> list[str]:
        pending = {k.decode(): orjson.loads(v) for k, v in (await self.client.hgetall(self._pending(backend))).items()}
        accepted = [t for t in pending if tool is None or t == tool]
        if accepted:
            pipe = self.client.pipeline(transaction=True)
            pipe.hset(self._pinned(backend), mapping={t: pending[t]["digest"] for t in accepted})
            pipe.hdel(self._pending(backend), *accepted)
            await pipe.execute()
        return accepted

    async def aclose(self) -> None:
        await self.client.aclose()


def store_of(settings: GatewaySettings) -> PinStore:
    cache = settings.cache
    if cache.store == "redis":
        from gateway.cache.factory import redis_of
        from gateway.redis_client.clients import client_for
        from gateway.redis_client.plan import plan_of

        timeout = max(cache.redis_timeout_ms / 1000, 1.0)
        client = client_for(plan_of(redis_of(cache, settings.redis)), timeout=timeout, connect_timeout=timeout)
        return RedisPins(client, prefix=cache.key_prefix, backends=[b.name for b in settings.backends])
    return FilePins(settings.pins.file)


class Pins:
    """This replica's view of the pins, and the checks lists and calls make against it."""

    def __init__(self, store: PinStore, modes: dict[str, str], *, on_change: Any = None) -> None:
        self.store = store
        self.modes = modes  # backend -> "warn" | "block"
        for backend, mode in modes.items():  # the series exists before the first change (rate())
            DEFINITION_CHANGES.labels(backend, "withheld" if mode == "block" else "warned")
        self._pinned: dict[str, dict[str, str]] = {b: {} for b in modes}
        self._pending: dict[str, dict[str, dict[str, Any]]] = {b: {} for b in modes}
        self._loaded_at = float("-inf")
        self._loading: asyncio.Task[None] | None = None
        self._writes: set[asyncio.Task[None]] = set()
        # Called when what is withheld changes (the route table bumps its revision, so no
        # kept aggregated answer outlives it).
        self.on_change = on_change

    @classmethod
    def from_settings(cls, settings: GatewaySettings, *, on_change: Any = None) -> Pins | None:
        modes = {b.name: b.pin for b in settings.backends if b.pin != "off"}
        if not modes:
            return None
        return cls(store_of(settings), modes, on_change=on_change)

    async def reload(self) -> None:
        try:
            pinned, pending = await self.store.load()
        except Exception as exc:  # the last copy keeps serving; never fail a list over it
            log.warning("pins: cannot read the pin store (%s: %s); keeping the last copy", type(exc).__name__, exc)
            self._loaded_at = time.monotonic()
            return
        before = self._withheld_set()
        for backend in self.modes:
            self._pinned[backend] = {**pinned.get(backend, {}), **{
                t: d for t, d in self._pinned[backend].items() if t not in pinned.get(backend, {})}}
            self._pending[backend] = dict(pending.get(backend, {}))
        self._loaded_at = time.monotonic()
        if self._withheld_set() != before and self.on_change is not None:
            self.on_change()

    async def reload_if_stale(self) -> None:
        if time.monotonic() - self._loaded_at < _RELOAD_SECONDS:
            return
        if self._loading is None or self._loading.done():
            self._loading = asyncio.ensure_future(self.reload())
        await asyncio.shield(self._loading)

    def _withheld_set(self) -> set[tuple[str, str]]:
        return {(b, t) for b, mode in self.modes.items() if mode == "block" for t in self._pending[b]}

    def present(self, backend: str, tools: list[Any]) -> list[Any]:
        """The tools of `backend`'s list a client may see; pins new tools, notes changes."""
        mode = self.modes.get(backend)
        if mode is None:
            return tools
        pinned, pending = self._pinned[backend], self._pending[backend]
        kept = []
        changed = False
        for tool in tools:
            name = tool.get("name") if isinstance(tool, dict) else None
            if not isinstance(name, str):
                continue
            seen = digest(tool)
            known = pinned.get(name)
            if known is None:
                pinned[name] = seen
                self._write(self.store.pin(backend, name, seen))
            elif known != seen:
                change = pending.get(name)
                if change is None or change.get("digest") != seen:
                    change = {"digest": seen, "pinned": known, "definition": tool, "seen_at": int(time.time())}
                    pending[name] = change
                    changed = True
                    self._write(self.store.note_change(backend, name, change))
                    action = "withheld" if mode == "block" else "warned"
                    DEFINITION_CHANGES.labels(backend, action).inc()
                    log.warning("backend %s: tool %r changed its definition since it was pinned (%s); %s", backend,
                                name, seen[:12], "withheld until `mcp-gateway pins accept`" if mode == "block"
                                else "still offered (pin: warn)")
                if mode == "block":
                    continue
            elif name in pending:
                # Back to the pinned definition: nothing left to accept.
                del pending[name]
                changed = True
            kept.append(tool)
        if changed and self.on_change is not None:
            self.on_change()
        return kept

    def withheld(self, backend: str, tool: str) -> str | None:
        """Why a call to `tool` is refused, or None."""
        if self.modes.get(backend) != "block" or tool not in self._pending[backend]:
            return None
        return (f"tool {tool!r} of backend {backend!r} is withheld: its definition changed since it was pinned; "
                f"an operator must accept it (mcp-gateway pins accept {backend} {tool})")

    def _write(self, work: Any) -> None:
        async def run() -> None:
            try:
                await work
            except Exception as exc:
                log.warning("pins: cannot write the pin store (%s: %s)", type(exc).__name__, exc)

        task = asyncio.ensure_future(run())
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def aclose(self) -> None:
        for task in list(self._writes):
            with contextlib.suppress(Exception):
                await task
        await self.store.aclose()
