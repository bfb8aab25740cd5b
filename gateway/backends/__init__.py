"""Backends: the one narrow seam between the gateway and the MCP servers behind it."""

from __future__ import annotations

from gateway.backends.base import Backend
from gateway.settings import BackendSettings, GatewaySettings


class UnsupportedBackend(ValueError):
    pass


def create_backend(settings: BackendSettings, gateway: GatewaySettings | None = None) -> Backend:
    """The backend implementation for one configured backend. `gateway` (the whole settings)
    supplies what legacy backends share across the fleet: the MRTR secret and this replica's
    address (docs/legacy.md)."""
    if settings.command is not None:
        from gateway.backends import stdio
        from gateway.backends.legacy import stdio as legacy_stdio

        if settings.era == "modern":
            return stdio.ModernStdioBackend(settings)
        if settings.era == "legacy":
            return legacy_stdio.LegacyStdioBackend(settings, gateway)
        from gateway.backends.detect import AutoBackend, StdioAutoProbe

        prober = StdioAutoProbe(settings)

        def make_stdio(era: str) -> Backend:
            if era == "modern":
                return stdio.ModernStdioBackend(settings, process=prober.process)
            return legacy_stdio.LegacyStdioBackend(settings, gateway, process=prober.process)

        return AutoBackend(settings, probe=prober.probe, make=make_stdio)

    from gateway.backends.modern import ModernHttpBackend

    if settings.transport == "sse":
        from gateway.backends.legacy.sse import LegacySseBackend

        return LegacySseBackend(settings, gateway)  # HTTP+SSE is initialize-era by definition
    if settings.era == "modern":
        return ModernHttpBackend(settings)
    from gateway.backends.legacy.http_backend import LegacyHttpBackend

    if settings.era == "legacy":
        # Pinned: no probe at all, so Streamable HTTP unless `transport: sse` said otherwise.
        return LegacyHttpBackend(settings, gateway)
    from gateway.backends.detect import AutoBackend, probe_http
    from gateway.backends.legacy.sse import LegacySseBackend

    async def probe() -> str:
        return await probe_http(settings)

    def make(kind: str) -> Backend:
        if kind == "modern":
            return ModernHttpBackend(settings)
        return LegacySseBackend(settings, gateway) if kind == "legacy-sse" else LegacyHttpBackend(settings, gateway)

    return AutoBackend(settings, probe=probe, make=make)
