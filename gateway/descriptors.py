"""File descriptors: the bound on how many listen streams (and connections) one process holds.

Every client connection is a descriptor, and a listen stream holds its connection for as long
as it listens. A process starts with the soft RLIMIT_NOFILE its parent gave it (often 1,024),
which it may raise up to the hard limit without privileges: `serve` does so at start-up and
logs both. The hub refuses a listen (-31004, HTTP 503, naming the limit) once its streams
would leave fewer than `RESERVED` descriptors for everything else (other clients' requests,
upstream connections, Redis, files), so a replica at its limit keeps serving instead of
failing its accept() calls (docs/subscriptions.md "Limits and descriptors").
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("gateway")

# Descriptors kept for everything but listen streams.
RESERVED = 500


def raise_soft_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard one; (soft, hard) afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            log.info("file descriptors: soft limit raised from %s to the hard limit %s", _shown(soft), _shown(hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("file descriptors: could not raise the soft limit %s to %s (%s)", _shown(soft),
                        _shown(hard), exc)
    else:
        log.info("file descriptors: limit %s", _shown(soft))
    return soft, hard


def listen_capacity() -> int | None:
    """How many listen streams the current soft limit allows (None: no limit)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    return max(0, soft - RESERVED)


def _shown(limit: int) -> str:
    return "unlimited" if limit == resource.RLIM_INFINITY else str(limit)
