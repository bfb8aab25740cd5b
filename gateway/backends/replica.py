"""This replica as the rest of the fleet sees it, compiled once from the settings.

Initialize-era backends park MRTR continuations on the replica that started them and seal
the owner's address into `requestState` (legacy/mrtr.py). What they share across the fleet is
two facts: the key that seals the state (`security.secret`, the same on every replica) and
the URL other replicas forward a retry to (`owner`). `Runtime` builds one `ReplicaContext`
from its settings and hands it to every backend; nothing here reads the environment.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field

from gateway.settings import GatewaySettings

log = logging.getLogger("gateway.backends.replica")

# The owner of a continuation parked by a replica that knows no address of its own.
UNADVERTISED = "unadvertised:"
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]", ""})
# Without security.secret, state is sealed with a key of this process only (one per process,
# so that every backend of the replica opens what another sealed).
_PROCESS_SECRET = secrets.token_bytes(32)
_PROCESS_IDENTITY = secrets.token_hex(8)


@dataclass(frozen=True)
class ReplicaContext:
    secret: bytes = field(repr=False)
    owner: str
    # What stops MRTR retries from working across replicas, as (log level, message).
    problems: tuple[tuple[int, str], ...] = ()

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> ReplicaContext:
        secret = settings.security.secret
        return cls(secret=secret.get_secret_value().encode() if secret else _PROCESS_SECRET, owner=owner_url(settings),
                   problems=tuple(replica_problems(settings)))

    @classmethod
    def alone(cls) -> ReplicaContext:
        """A replica that shares nothing (a backend built without a Runtime: tests, tools):
        the per-process key, and an owner no other replica can reach."""
        return cls(secret=_PROCESS_SECRET, owner=f"{UNADVERTISED}{_PROCESS_IDENTITY}")

    def report_problems(self) -> None:
        """Log `problems`, each once per process (every legacy backend asks at start-up)."""
        for level, message in self.problems:
            if message not in _REPORTED:
                _REPORTED.add(message)
                log.log(level, message)


_REPORTED: set[str] = set()


def replica_problems(settings: GatewaySettings) -> list[tuple[int, str]]:
    """What stops MRTR retries from working across replicas, as (log level, message)."""
    problems: list[tuple[int, str]] = []
    security = settings.security
    if not security.secret:
        problems.append((logging.WARNING,
                         "security.secret is not set: MRTR requestState is sealed with a random per-process key, so "
                         "retries only work on this replica; several replicas need a shared one "
                         "(MCP_GATEWAY_SECURITY__SECRET)"))
    elif not security.advertise_url and settings.server.host in _WILDCARD_HOSTS:
        problems.append((logging.ERROR,
                         f"security.secret is set (several replicas) but security.advertise_url is not, and "
                         f"server.host {settings.server.host!r} names no address other replicas can reach: an MRTR "
                         "retry that lands on another replica cannot be forwarded here and fails with -31001; set "
                         "MCP_GATEWAY_SECURITY__ADVERTISE_URL to this replica's own URL (Kubernetes: "
                         "http://$(POD_IP):8080/mcp with POD_IP from status.podIP)"))
    return problems


def owner_url(settings: GatewaySettings) -> str:
    """Where other replicas send a retry for a continuation this replica parks.

    `security.advertise_url` when set. Otherwise http://<server.host>:<port><path> when the
    host is an address; but a wildcard bind (0.0.0.0) says nothing about how others reach
    this replica, and guessing a loopback URL would make every replica believe it owns every
    continuation. Then the owner is an identity unique to this process: retries that land
    here still work, and one that lands elsewhere gets an error naming the missing setting.
    """
    if settings.security.advertise_url:
        return settings.security.advertise_url
    server = settings.server
    if server.host in _WILDCARD_HOSTS:
        return f"{UNADVERTISED}{_PROCESS_IDENTITY}"
    host = f"[{server.host}]" if ":" in server.host and not server.host.startswith("[") else server.host
    scheme = "https" if server.tls is not None else "http"
    return f"{scheme}://{host}:{server.port}{server.path}"
