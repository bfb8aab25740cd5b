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


class CacheSettings(_Frozen):
    store: Literal["memory", "redis", "none"] = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"


class AuthSettings(_Frozen):
    mode: Literal["none", "jwt"] = "none"


class ObservabilitySettings(_Frozen):
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = False


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
