"""Configuration: a YAML file plus `MCP_GATEWAY_*` environment overrides, validated once.

The models are frozen: the running gateway reads them and never mutates them. Errors name the
field path (`backends.1.url: ...`), which is what `mcp-gateway check-config` prints.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

ENV_PREFIX = "MCP_GATEWAY_"
CONFIG_ENV = "MCP_GATEWAY_CONFIG"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ServerSettings(_Frozen):
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8080
    path: str = "/mcp"
    # Extra Origins to accept; same-host and loopback Origins are always accepted.
    allowed_origins: tuple[str, ...] = ()
    # Extra Host header values to accept when bound to loopback (DNS-rebinding defence).
    allowed_hosts: tuple[str, ...] = ()
    max_body_bytes: Annotated[int, Field(gt=0)] = 4 * 1024 * 1024
    # How long a shutdown waits for in-flight requests before closing them.
    graceful_shutdown_seconds: Annotated[float, Field(ge=0)] = 20.0
    # SSE keep-alive comment interval on quiet streams.
    keepalive_seconds: Annotated[float, Field(gt=0)] = 15.0

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("must start with '/'")
        return v.rstrip("/") or "/"

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for origin in v:
            if origin != "*" and not urlsplit(origin).scheme:
                raise ValueError(f"{origin!r} is not an origin like 'https://app.example.com'")
        return tuple(o.rstrip("/").lower() for o in v)

    @property
    def bound_to_loopback(self) -> bool:
        if self.host in ("localhost", "ip6-localhost"):
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


class BackendSettings(_Frozen):
    name: Annotated[str, Field(pattern=r"^[a-z0-9-]+$", min_length=1, max_length=63)]
    url: str | None = None
    command: tuple[str, ...] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    era: Literal["auto", "modern", "legacy"] = "auto"
    # Prepended to this backend's tool and prompt names. None: "" with one backend,
    # "<name>__" with several (DESIGN.md, the user-facing contract).
    prefix: str | None = None
    # URI prefixes (or "scheme:") routed to this backend for resources/read, in addition to
    # the URIs it lists.
    resource_prefixes: tuple[str, ...] = ()
    # Static headers sent upstream (a backend API key, say). The client's own credentials are
    # never forwarded (spec: no token passthrough).
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_seconds: Annotated[float, Field(gt=0)] = 60.0
    connect_timeout_seconds: Annotated[float, Field(gt=0)] = 5.0
    # Deadline for this backend's share of an aggregated list; a late backend is left out.
    list_timeout_seconds: Annotated[float, Field(gt=0)] = 5.0
    # Retries for idempotent reads (lists, resources/read, server/discover) only, and only
    # before any byte reached the client.
    retries: Annotated[int, Field(ge=0, le=5)] = 1
    max_connections: Annotated[int, Field(gt=0)] = 256

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{v!r} is not an http(s) URL")
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is not None and (not v or not v[0]):
            raise ValueError("must be a non-empty list: [program, arg, ...]")
        return v

    @model_validator(mode="after")
    def _one_transport(self) -> BackendSettings:
        if (self.url is None) == (self.command is None):
            raise ValueError("set exactly one of 'url' (Streamable HTTP) or 'command' (stdio)")
        return self


CacheableMethod = Literal[
    "server/discover", "tools/list", "prompts/list", "resources/list", "resources/templates/list", "resources/read"
]
_Millis = Annotated[int, Field(ge=0)]


class CacheRule(_Frozen):
    """Freshness bounds for one backend and/or method (docs/cache.md). A field left unset
    falls through to a less specific rule, then to the `cache` section itself."""

    backend: str | None = None  # None: every backend
    method: CacheableMethod | None = None  # None: every cacheable method
    enabled: bool | None = None
    default_ttl_ms: _Millis | None = None
    min_ttl_ms: _Millis | None = None
    max_ttl_ms: _Millis | None = None
    # Treat every result as private, whatever the backend says.
    force_private: bool | None = None


class CacheSettings(_Frozen):
    store: Literal["memory", "redis", "none"] = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Prefix of every Redis key and the invalidation channel; replicas sharing a cache share it.
    key_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")] = "mcpgw"
    # The in-memory store (store: memory): LRU bounded by entry count and by encoded bytes.
    max_entries: Annotated[int, Field(gt=0)] = 10_000
    max_bytes: Annotated[int, Field(gt=0)] = 64 * 1024 * 1024
    # A larger result is served but not stored.
    max_entry_bytes: Annotated[int, Field(gt=0)] = 1024 * 1024
    # Freshness: the backend's ttlMs, clamped to [min, max]; `default_ttl_ms` when it sends
    # none (spec: absent means 0, so the default is 0). `rules` refine per backend/method.
    default_ttl_ms: _Millis = 0
    min_ttl_ms: _Millis = 0
    max_ttl_ms: _Millis = 3_600_000
    rules: tuple[CacheRule, ...] = ()
    # Remember a backend's "method not found" for this long (0: never).
    negative_ttl_ms: _Millis = 0
    # Serve an expired entry for this long past its expiry when the backend fails (0: never).
    stale_if_error_ms: _Millis = 0
    # Redis values larger than this are zlib-compressed.
    compress_above_bytes: _Millis = 1024
    # With Redis: a small in-process layer in front (0 entries: none). Entries live there at
    # most `local_ttl_ms`; invalidations published by any replica drop them everywhere.
    local_max_entries: _Millis = 1000
    local_ttl_ms: _Millis = 1000
    # Cross-replica fetch lock: how long one replica may hold it while it asks the backend.
    lock_timeout_ms: Annotated[int, Field(gt=0)] = 2000
    # Redis commands slower than this count as a failure (the request then bypasses the cache).
    redis_timeout_ms: Annotated[int, Field(gt=0)] = 250
    # After a Redis failure, skip Redis for this long before trying again.
    redis_retry_seconds: Annotated[float, Field(ge=0)] = 1.0

    @model_validator(mode="after")
    def _bounds(self) -> CacheSettings:
        if self.min_ttl_ms > self.max_ttl_ms:
            raise ValueError(f"min_ttl_ms ({self.min_ttl_ms}) is above max_ttl_ms ({self.max_ttl_ms})")
        for i, rule in enumerate(self.rules):
            low = rule.min_ttl_ms if rule.min_ttl_ms is not None else self.min_ttl_ms
            high = rule.max_ttl_ms if rule.max_ttl_ms is not None else self.max_ttl_ms
            if low > high:
                raise ValueError(f"rules.{i}: min_ttl_ms ({low}) is above max_ttl_ms ({high})")
        return self


class AuthSettings(_Frozen):
    mode: Literal["none", "jwt"] = "none"


class ObservabilitySettings(_Frozen):
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = False
    # OpenTelemetry spans per request, continued from the client's traceparent.
    tracing: bool = False
    # console, or otlp (needs the optional opentelemetry-exporter-otlp package; configured by
    # the standard OTEL_EXPORTER_OTLP_* environment variables).
    tracing_exporter: Literal["console", "otlp"] = "console"


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", frozen=True
    )

    server: ServerSettings = ServerSettings()
    backends: tuple[BackendSettings, ...] = ()
    cache: CacheSettings = CacheSettings()
    auth: AuthSettings = AuthSettings()
    observability: ObservabilitySettings = ObservabilitySettings()
    # Start the bundled demo backend in-process and route to it (the embedded defaults).
    demo: bool = False

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The YAML file arrives as init kwargs; the environment overrides it, key by key.
        return (env_settings, init_settings)

    @model_validator(mode="after")
    def _fleet(self) -> GatewaySettings:
        names = [b.name for b in self.backends]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"backend names must be unique; repeated: {', '.join(dupes)}")
        for i, rule in enumerate(self.cache.rules):
            if rule.backend is not None and rule.backend not in names:
                raise ValueError(f"cache.rules.{i}.backend: no backend is named {rule.backend!r}")
        prefixes = [self.prefix_of(b) for b in self.backends]
        for i, p in enumerate(prefixes):
            for j, q in enumerate(prefixes):
                if i < j and (p.startswith(q) or q.startswith(p)) and len(self.backends) > 1:
                    raise ValueError(
                        f"backends {self.backends[i].name!r} and {self.backends[j].name!r} have overlapping name "
                        f"prefixes {p!r} and {q!r}: a tool name could not be routed unambiguously"
                    )
        return self

    def prefix_of(self, backend: BackendSettings) -> str:
        if backend.prefix is not None:
            return backend.prefix
        return "" if len(self.backends) == 1 else f"{backend.name}__"


class ConfigError(Exception):
    """Configuration that does not validate; `problems` are (field path, message) pairs."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("\n".join(f"{loc}: {msg}" for loc, msg in problems))


def load_settings(path: str | os.PathLike[str] | None = None, **overrides: Any) -> GatewaySettings:
    """Read the YAML file (if any) and the environment into validated, frozen settings."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError([("<file>", f"cannot read {path}: {exc.strerror or exc}")]) from None
        except yaml.YAMLError as exc:
            raise ConfigError([("<file>", f"{path} is not valid YAML: {exc}")]) from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError([("<file>", f"{path} must hold a mapping at the top level")])
        data = loaded
    data.update(overrides)
    try:
        return GatewaySettings(**data)
    except ValidationError as exc:
        raise ConfigError(
            [(".".join(str(p) for p in err["loc"]) or "<root>", err["msg"]) for err in exc.errors()]
        ) from None
