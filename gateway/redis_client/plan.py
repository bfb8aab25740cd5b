"""`redis:` settings → a connection plan: which shape (standalone, Sentinel, Cluster), which
hosts, which credentials, which TLS. Pure (no redis-py, no network), so that the settings
model calls it at load time and `check-config` refuses exactly what `serve` could not use.

URL forms:

    redis://[user:password@]host[:port][/db]       rediss:// the same over TLS
    unix://[user:password@]/path/to/socket[?db=N]
    redis+sentinel://[user:password@]h1:26379,h2:26379/service_name[/db]    (rediss+sentinel)
    redis+cluster://[user:password@]h1:6379,h2:6379                          (rediss+cluster)

or the explicit fields (`sentinels:` + `service_name:`, `cluster: true` + `nodes:`). The
password may be a plain value, `{env: VAR}` or `{file: path}`; it is resolved here and never
appears in `repr`, logs or error messages (`describe()` shows the plan without it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

if TYPE_CHECKING:
    from gateway.settings import RedisSettings

Shape = Literal["standalone", "sentinel", "cluster"]
DEFAULT_URL = "redis://127.0.0.1:6379/0"
_SCHEMES: dict[str, tuple[Shape, bool]] = {
    "redis": ("standalone", False),
    "rediss": ("standalone", True),
    "unix": ("standalone", False),
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
}
_DEFAULT_PORT = {"standalone": 6379, "sentinel": 26379, "cluster": 6379}


@dataclass(frozen=True)
class RedisPlan:
    shape: Shape
    # standalone: the one server; sentinel: the Sentinels; cluster: the seed nodes.
    hosts: tuple[tuple[str, int], ...] = ()
    unix_path: str | None = None
    service_name: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def describe(self) -> str:
        """The plan as a URL without credentials, for logs and errors."""
        scheme = ("rediss" if self.tls else "redis") + {"standalone": "", "sentinel": "+sentinel",
                                                         "cluster": "+cluster"}[self.shape]
        if self.unix_path is not None:
            return f"unix://{self.unix_path}?db={self.db}"
        hosts = ",".join(_join_host(h, p) for h, p in self.hosts)
        # Whether a password is set, never which.
        user = f"{self.username or ''}{':***' if self.password is not None else ''}"
        user = f"{user}@" if user else ""
        if self.shape == "sentinel":
            return f"{scheme}://{user}{hosts}/{self.service_name}/{self.db}"
        if self.shape == "cluster":
            return f"{scheme}://{user}{hosts}"
        return f"{scheme}://{user}{hosts}/{self.db}"

    def __repr__(self) -> str:
        return f"RedisPlan({self.describe()})"

    __str__ = describe


def redacted(url: str) -> str:
    """A Redis URL without its password, for logs (kept for `cache.redis_url` style values)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<unparseable redis url>"
    if password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit((parts.scheme, user + netloc, parts.path, parts.query, parts.fragment))


def _join_host(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_host(text: str, default_port: int) -> tuple[str, int]:
    """`host`, `host:port`, `[v6]:port`."""
    text = text.strip()
    if not text:
        raise ValueError("an empty host")
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"{text!r} is not host:port")
        port_text = rest[1:] if rest else ""
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    elif ":" in text:
        raise ValueError(f"{text!r}: write an IPv6 address as [addr]:port")
    else:
        host, port_text = text, ""
    if not host:
        raise ValueError(f"{text!r} has no host")
    if port_text == "":
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{text!r}: the port must be a number from 1 to 65535")
    return host, int(port_text)


def resolve_secret(value: Any, where: str) -> str | None:
    """A plain value (str or SecretStr), `{env: VAR}` or `{file: path}` → the secret's text.
    Errors name the variable or the file, never a value."""
    if value is None:
        return None
    if hasattr(value, "get_secret_value"):
        return value.get_secret_value()
    if isinstance(value, str):
        return value
    env, file = getattr(value, "env", None), getattr(value, "file", None)
    if env is not None:
        found = os.environ.get(env)
        if found is None:
            raise ValueError(f"{where}: environment variable {env} is not set")
        return found
    if file is not None:
        try:
            return Path(file).read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise ValueError(f"{where}: cannot read {file}: {exc.strerror or exc}") from None
    raise ValueError(f"{where}: not a secret")


def _from_url(url: str) -> dict[str, Any]:
    try:
        parts = urlsplit(url)
        url_password = parts.password
        url_username = parts.username
    except ValueError as exc:
        raise ValueError(f"url {redacted(url)!r} does not parse: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES:
        raise ValueError(f"url {redacted(url)!r}: the scheme must be one of {', '.join(_SCHEMES)}")
    shape, tls = _SCHEMES[scheme]
    out: dict[str, Any] = {"shape": shape, "tls": tls,
                           "username": unquote(url_username) if url_username else None,
                           "password": unquote(url_password) if url_password is not None else None}
    query = parse_qs(parts.query)
    unknown = set(query) - {"db"}
    if unknown:
        raise ValueError(f"url {redacted(url)!r}: unsupported query parameter(s) {', '.join(sorted(unknown))} "
                         "(set timeouts and TLS files as fields of the redis block)")
    netloc = parts.netloc.rsplit("@", 1)[-1]
    if scheme == "unix":
        if not parts.path:
            raise ValueError(f"url {redacted(url)!r}: unix:// needs a socket path")
        out["unix_path"] = parts.path
        db_text = query.get("db", ["0"])[-1]
        if not db_text.isdigit():
            raise ValueError(f"url {redacted(url)!r}: db must be a number")
        out["db"], out["db_explicit"] = int(db_text), "db" in query
        return out
    if not netloc:
        raise ValueError(f"url {redacted(url)!r} names no host")
    try:
        out["hosts"] = tuple(parse_host(h, _DEFAULT_PORT[shape]) for h in netloc.split(","))
    except ValueError as exc:
        raise ValueError(f"url {redacted(url)!r}: {exc}") from None
    segments = [s for s in parts.path.split("/") if s]
    if shape == "standalone":
        if len(out["hosts"]) != 1:
            raise ValueError(f"url {redacted(url)!r}: one host only (several hosts: redis+sentinel:// "
                             "or redis+cluster://)")
        if len(segments) > 1 or (segments and not segments[0].isdigit()):
            raise ValueError(f"url {redacted(url)!r}: the path is the database number, like /0")
        db_text = segments[0] if segments else query.get("db", ["0"])[-1]
        if not db_text.isdigit():
            raise ValueError(f"url {redacted(url)!r}: db must be a number")
        out["db"], out["db_explicit"] = int(db_text), bool(segments) or "db" in query
    elif shape == "sentinel":
        if not segments or len(segments) > 2 or (len(segments) == 2 and not segments[1].isdigit()):
            raise ValueError(f"url {redacted(url)!r}: the path is /service_name or /service_name/db")
        out["service_name"] = segments[0]
        out["db"], out["db_explicit"] = (int(segments[1]), True) if len(segments) == 2 else (0, False)
    else:
        if segments and segments != ["0"]:
            raise ValueError(f"url {redacted(url)!r}: Redis Cluster has only database 0")
    return out


def plan_of(settings: RedisSettings) -> RedisPlan:
    """The plan for `settings`, or ValueError saying which field is wrong (never a secret)."""
    explicit_sentinel = bool(settings.sentinels) or settings.service_name is not None
    explicit_cluster = settings.cluster or bool(settings.nodes)
    if explicit_sentinel and explicit_cluster:
        raise ValueError("Sentinel (sentinels, service_name) and Cluster (cluster, nodes) exclude each other")
    if settings.url is not None and (settings.sentinels or settings.nodes):
        raise ValueError("set either url or the explicit hosts (sentinels / nodes), not both")
    fields: dict[str, Any]
    if settings.sentinels:
        if not settings.service_name:
            raise ValueError("sentinels need service_name (the master's name in Sentinel)")
        fields = {"shape": "sentinel", "tls": False, "service_name": settings.service_name,
                  "hosts": _hosts(settings.sentinels, "sentinels", 26379)}
    elif settings.nodes:
        fields = {"shape": "cluster", "tls": False, "hosts": _hosts(settings.nodes, "nodes", 6379)}
    else:
        fields = _from_url(settings.url or DEFAULT_URL)
        if settings.service_name is not None:
            if fields["shape"] != "sentinel":
                raise ValueError("service_name applies to Sentinel: use redis+sentinel:// or sentinels")
            if fields.get("service_name") != settings.service_name:
                raise ValueError("service_name differs from the one in the url")
        if settings.cluster and fields["shape"] != "cluster":
            if settings.url is not None:
                raise ValueError("cluster: true needs redis+cluster:// (or seed nodes), not a standalone url")
            raise ValueError("cluster: true needs seed nodes (nodes: [host:port, ...]) or a redis+cluster:// url")
    shape: Shape = fields["shape"]
    if settings.db is not None:
        if shape == "cluster" and settings.db != 0:
            raise ValueError("db: Redis Cluster has only database 0")
        if fields.get("db_explicit") and fields["db"] != settings.db:
            raise ValueError("db differs from the database in the url")
        fields["db"] = settings.db
    if settings.username is not None and fields.get("username"):
        raise ValueError("username is set both in the url and as a field")
    if settings.password is not None and fields.get("password") is not None:
        raise ValueError("password is set both in the url and as a field (keep it out of the url)")
    username = settings.username or fields.get("username")
    password = resolve_secret(settings.password, "password") if settings.password is not None \
        else fields.get("password")
    if (settings.sentinel_username or settings.sentinel_password) and shape != "sentinel":
        raise ValueError("sentinel_username / sentinel_password apply to Sentinel only")
    tls = fields["tls"] if settings.tls is None else settings.tls
    if settings.tls is False and fields["tls"]:
        raise ValueError("tls: false contradicts the rediss:// url")
    if fields.get("unix_path") and tls:
        raise ValueError("TLS does not apply to a unix socket")
    for name in ("ca_file", "cert_file", "key_file"):
        path = getattr(settings, name)
        if path is None:
            continue
        if not tls:
            raise ValueError(f"{name} needs TLS (rediss:// or tls: true)")
        if not os.access(path, os.R_OK):
            raise ValueError(f"{name}: cannot read {path}")
    if (settings.cert_file is None) != (settings.key_file is None):
        raise ValueError("cert_file and key_file go together (TLS client certificate)")
    return RedisPlan(
        shape=shape, hosts=fields.get("hosts", ()), unix_path=fields.get("unix_path"),
        service_name=fields.get("service_name"), db=fields.get("db", 0),
        username=username, password=password,
        sentinel_username=settings.sentinel_username,
        sentinel_password=resolve_secret(settings.sentinel_password, "sentinel_password"),
        tls=tls, ca_file=settings.ca_file, cert_file=settings.cert_file, key_file=settings.key_file,
    )


def _hosts(values: tuple[str, ...], where: str, default_port: int) -> tuple[tuple[str, int], ...]:
    out = []
    for i, text in enumerate(values):
        try:
            out.append(parse_host(text, default_port))
        except ValueError as exc:
            raise ValueError(f"{where}.{i}: {exc}") from None
    return tuple(out)
