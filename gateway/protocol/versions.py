"""Protocol revisions and their eras (digest §0).

Modern revisions carry their metadata on every request; legacy revisions negotiate it once in
an `initialize` handshake. Code that is specific to one era lives in its own module; this one
only names the versions.
"""

from __future__ import annotations

# Newest first. The gateway serves these to clients statelessly.
MODERN_VERSIONS: tuple[str, ...] = ("2026-07-28",)
LATEST_MODERN = MODERN_VERSIONS[0]

# Initialize-era revisions the gateway can speak to backends (and, later, to legacy clients).
LEGACY_VERSIONS: tuple[str, ...] = ("2025-11-25", "2025-06-18", "2025-03-26")
LATEST_LEGACY = LEGACY_VERSIONS[0]
# What a legacy *backend* may answer `initialize` with: the above, plus 2024-11-05, the first
# revision (HTTP+SSE transport, or stdio). Its messages are a subset of 2025-03-26's, so the
# same translation serves it. Clients get it only over HTTP+SSE, its own transport
# (legacy_clients/sse_front.py); on the Streamable HTTP endpoint they get 2025-11-25.
OLDEST_LEGACY = "2024-11-05"
BACKEND_LEGACY_VERSIONS: tuple[str, ...] = (*LEGACY_VERSIONS, OLDEST_LEGACY)


def is_modern(version: str) -> bool:
    return version in MODERN_VERSIONS


def is_legacy(version: str) -> bool:
    return version in LEGACY_VERSIONS
