"""The initialize-era rows of `gateway.backends.BACKENDS` (keyed by transport and era)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.backends.legacy.http_backend import LegacyHttpBackend
from gateway.backends.legacy.sse import LegacySseBackend
from gateway.backends.legacy.stdio import LegacyStdioBackend

if TYPE_CHECKING:
    from gateway.backends import Era, Factory, Transport

LEGACY_BACKENDS: dict[tuple[Transport, Era], Factory] = {
    ("streamable-http", "legacy"): lambda settings, replica, process: LegacyHttpBackend(settings, replica),
    ("sse", "legacy"): lambda settings, replica, process: LegacySseBackend(settings, replica),
    ("stdio", "legacy"): lambda settings, replica, process: LegacyStdioBackend(settings, replica, process=process),
}
