"""Origin and Host checks: the DNS-rebinding defence (SHTTP §Security Warning, digest §a.2).

A browser page on a hostile site can reach a server on 127.0.0.1 by rebinding its own DNS
name; it cannot forge `Origin`, and the `Host` it sends is its own name. So:

- `Origin` present and not allowed → 403 with an id-less JSON-RPC error. Allowed: loopback
  origins, the origin of the request's own Host (same-host), and `server.allowed_origins`.
- When the gateway listens on loopback, a `Host` that is not a loopback name (or listed in
  `server.allowed_hosts`) is refused too: nothing legitimate reaches a loopback socket under
  a foreign name. When it listens beyond loopback and `server.allowed_hosts` is set, the Host
  must be one of those (or a loopback name, for local probes).
- "Same-host" Origins are trusted only while the Host itself is checked: without a Host
  check, a rebinding page sends a Host and an Origin of its own choosing that match each
  other, so equality proves nothing. A deployment beyond loopback without `allowed_hosts`
  accepts loopback Origins and `allowed_origins` only.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable
from urllib.parse import SplitResult, urlsplit

from gateway import asgi
from gateway.policies.head import HeadPolicy
from gateway.protocol import jsonrpc as rpc

_LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost", "localhost.localdomain"})


# Memoized: it runs on every request (Host check), and parsing an IP address is a visible share
# of a cached tools/list (bench/README.md "Profile"). Bounded, since clients choose the names.
@functools.lru_cache(maxsize=1024)
def _is_loopback_host(host: str) -> bool:
    # Brackets already off (urlsplit's hostname, `_split_host`): one left over means a
    # malformed value ("[::1", "[::1]evil.example"), which must not pass for "::1".
    host = host.lower()
    if host in _LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@functools.lru_cache(maxsize=1024)  # per request, like _is_loopback_host; bounded likewise
def _split_host(hostport: str) -> str:
    """The host part of a Host header value (IPv6 literals keep their brackets off)."""
    hostport = hostport.strip().lower()
    if hostport.startswith("["):
        end = hostport.find("]")
        rest = hostport[end + 1 :] if end != -1 else ""
        # Only an optional port may follow the literal (RFC 9110 §7.2: uri-host [":" port]);
        # "[::1]evil.example" is not the loopback literal, and stays whole (refused).
        if end == -1 or (rest and not (rest[0] == ":" and (rest[1:].isdigit() or rest == ":"))):
            return hostport
        return hostport[1:end]
    return hostport.rsplit(":", 1)[0] if hostport.count(":") == 1 else hostport


def _valid_port(parts: SplitResult) -> bool:
    try:
        parts.port  # noqa: B018 - raises ValueError for anything but an integer in range
    except ValueError:
        return False
    return True


def _forbidden(why: str) -> rpc.McpError:
    return rpc.request_refused(403, f"Forbidden: {why}")


class OriginPolicy(HeadPolicy):
    def __init__(self, app: asgi.ASGIApp, *, allowed_origins: Iterable[str] = (), trust_same_host: bool = True
                 ) -> None:
        super().__init__(app)
        self.trust_same_host = trust_same_host
        origins = {o.rstrip("/").lower() for o in allowed_origins}
        self.allow_any = "*" in origins
        self.allowed = frozenset(origins - {"*"})

    def origin_allowed(self, origin: str, host: str | None) -> bool:
        origin = origin.rstrip("/").lower()
        if self.allow_any or origin in self.allowed:
            return True
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return False  # includes the opaque "null" origin
        # A serialized origin is scheme "://" host [":" port] and nothing else (RFC 6454 §6.2).
        # Anything more (userinfo, a path, a second origin after a comma when the header was
        # repeated) would let urlsplit find a loopback host in a value that names another.
        if "@" in parts.netloc or parts.path or parts.query or parts.fragment or not _valid_port(parts):
            return False
        if _is_loopback_host(parts.hostname):
            return True
        return self.trust_same_host and host is not None and parts.netloc == host.lower()

    def admit(self, scope: asgi.Scope) -> rpc.McpError | None:
        headers = asgi.request_headers(scope)
        origin = headers.get("origin")
        if origin is not None and not self.origin_allowed(origin, headers.get("host")):
            return _forbidden(f"Origin {origin!r} is not allowed")
        return None


class HostPolicy(HeadPolicy):
    """Refuses a `Host` that is neither a loopback name nor in `allowed_hosts`. Installed when
    the gateway is bound to loopback, or when `server.allowed_hosts` is configured."""

    def __init__(self, app: asgi.ASGIApp, *, allowed_hosts: Iterable[str] = ()) -> None:
        super().__init__(app)
        self.allowed = frozenset(h.lower() for h in allowed_hosts)

    def admit(self, scope: asgi.Scope) -> rpc.McpError | None:
        host = _split_host(asgi.request_headers(scope).get("host", ""))
        if not (_is_loopback_host(host) or host in self.allowed):
            return _forbidden(f"Host {host!r} is not a loopback name or an allowed host (DNS-rebinding protection)")
        return None
