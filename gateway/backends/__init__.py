"""Backends: the one narrow seam between the gateway and the MCP servers behind it."""

from __future__ import annotations

from gateway.backends.base import Backend
from gateway.settings import BackendSettings


class UnsupportedBackend(ValueError):
    pass


def create_backend(settings: BackendSettings) -> Backend:
    """The backend implementation for one configured backend."""
    if settings.url is not None and settings.era in ("modern", "auto"):
        from gateway.backends.modern import ModernHttpBackend

        return ModernHttpBackend(settings)
    kind = "stdio" if settings.command is not None else f"era {settings.era!r}"
    raise UnsupportedBackend(f"backend {settings.name!r}: {kind} backends are not supported by this build")
