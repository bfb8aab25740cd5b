"""The initialize-era rows of `gateway.backends.BACKENDS` (keyed by transport and era)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.backends.legacy.http_backend import LegacyHttpBackend
from gateway.backends.legacy.sse import LegacySseBackend
from gateway.backends.legacy.stdio import LegacyStdioBackend

if TYPE_CHECKING:
    from gateway.backends import Era, Factory, Transport

LEGACY_BACKENDS: dict[tuple[Transport, Era], Factory] = {
    ("streamable-http", "legacy"): lambda settings, gateway, process: LegacyHttpBackend(settings, gateway),
    ("sse", "legacy"): lambda settings, gateway, process: LegacySseBackend(settings, gateway),
    ("stdio", "legacy"): lambda settings, gateway, process: LegacyStdioBackend(settings, gateway, process=process),
}
