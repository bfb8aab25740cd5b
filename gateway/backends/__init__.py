"""Backends: the one narrow seam between the gateway and the MCP servers behind it.

`create_backend` looks the backend up in `BACKENDS`, a table keyed by (transport, era); an
`era: auto` backend is an `AutoBackend` that probes first (detect.py) and then builds the row
its verdict names. The initialize-era rows come from `legacy/wiring.py`: removing that era is
deleting `legacy/` and the two lines marked below. docs/backends.md says which file holds what.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from gateway.backends import detect
from gateway.protocol import jsonrpc as rpc
from gateway.backends.base import Backend
from gateway.backends.legacy.wiring import LEGACY_BACKENDS  # the legacy era (1 of 2)
from gateway.backends.modern import ModernHttpBackend
from gateway.backends.replica import ReplicaContext
from gateway.backends.stdio import ModernStdioBackend
from gateway.backends.stdio_instances import spread
from gateway.backends.stdio_process import StdioProcess
from gateway.settings import BackendSettings

Transport = Literal["stdio", "streamable-http", "sse"]
Era = Literal["modern", "legacy"]
# (its settings, what this replica shares with the fleet, a stdio process to adopt: the era
# probe's, already running) -> the backend.
Factory = Callable[[BackendSettings, ReplicaContext | None, StdioProcess | None], Backend]

BACKENDS: dict[tuple[Transport, Era], Factory] = {
    ("streamable-http", "modern"): lambda settings, replica, process: ModernHttpBackend(settings, replica),
    ("stdio", "modern"): lambda settings, replica, process: ModernStdioBackend(settings, process=process),
    **LEGACY_BACKENDS,  # the legacy era (2 of 2)
}

# What the HTTP era probe tells apart (detect.Kind) -> the row it names.
_HTTP_KINDS: dict[detect.Kind, tuple[Transport, Era]] = {
    "modern": ("streamable-http", "modern"),
    "legacy": ("streamable-http", "legacy"),
    "legacy-sse": ("sse", "legacy"),
}


class UnsupportedBackend(ValueError):
    pass


def transport_of(settings: BackendSettings) -> Transport:
    if settings.command is not None:
        return "stdio"
    # `transport: auto` is Streamable HTTP unless the era probe finds HTTP+SSE.
    return "sse" if settings.transport == "sse" else "streamable-http"


def _build(key: tuple[Transport, Era], settings: BackendSettings, replica: ReplicaContext | None,
           process: StdioProcess | None = None) -> Backend:
    factory = BACKENDS.get(key)
    if factory is None:
        raise UnsupportedBackend(f"backend {settings.name!r}: no {key[1]} backend over {key[0]} in this build")
    if key[0] == "stdio":
        # `instances: N`: N of the row's one-process backends behind the name; the first adopts
        # the era probe's process, already running (stdio_instances.py).
        return spread(settings, lambda one, index: factory(one, replica, process if index == 0 else None))
    return factory(settings, replica, process)


def create_backend(settings: BackendSettings, replica: ReplicaContext | None = None) -> Backend:
    """The backend implementation for one configured backend. `replica` (compiled once by
    Runtime) is what legacy backends share across the fleet: the MRTR key and this replica's
    address (backends/replica.py, docs/legacy.md)."""
    transport = transport_of(settings)
    if transport == "sse":
        return _build(("sse", "legacy"), settings, replica)  # HTTP+SSE is initialize-era by definition
    if settings.era != "auto":
        # Pinned: no probe at all.
        return _build((transport, settings.era), settings, replica)
    if transport == "stdio":
        prober = detect.StdioAutoProbe(settings)
        return detect.AutoBackend(settings, probe=prober.probe,
                                  make=lambda era: _build(("stdio", era), settings, replica, prober.process))

    async def probe() -> detect.Kind:
        return await detect.probe_http(settings)

    def make(kind: detect.Kind) -> Backend:
        if kind == "legacy-sse" and len(settings.endpoint_urls) > 1:
            # Validation refuses `transport: sse` with `urls`; a probe that finds it is told so.
            raise rpc.backend_protocol_error(settings.name, "it speaks HTTP+SSE (2024-11-05), whose session is one "
                                             "GET stream to one URL: several `urls` need Streamable HTTP")
        return _build(_HTTP_KINDS[kind], settings, replica)

    return detect.AutoBackend(settings, probe=probe, make=make)
