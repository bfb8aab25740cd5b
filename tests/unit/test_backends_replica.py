"""What a replica shares with the fleet, compiled once (gateway/backends/replica.py)."""

from __future__ import annotations

import time

import pytest

from gateway.backends.legacy import mrtr
from gateway.backends.legacy.http_backend import LegacyHttpBackend
from gateway.backends.replica import UNADVERTISED, ReplicaContext
from gateway.runtime import Runtime
from gateway.settings import BackendSettings, load_settings


def test_a_backend_built_alone_never_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # It used to build GatewaySettings() itself, which read MCP_GATEWAY_* behind the caller's back.
    monkeypatch.setenv("MCP_GATEWAY_SECURITY__SECRET", "from-the-environment")
    monkeypatch.setenv("MCP_GATEWAY_SECURITY__ADVERTISE_URL", "http://10.9.9.9:8080/mcp")
    backend = LegacyHttpBackend(BackendSettings(name="old", url="http://127.0.0.1:1/mcp", era="legacy"))
    assert backend.owner.startswith(UNADVERTISED)
    sealed = mrtr.StateSealer(b"from-the-environment").seal({"exp": time.time() + 5})
    with pytest.raises(mrtr.StateError):
        backend.sealer.open(sealed)


async def test_runtime_compiles_one_context_for_every_legacy_backend() -> None:
    settings = load_settings(None, server={"host": "10.0.0.9", "port": 9000}, security={"secret": "s3cret"},
                             backends=[{"name": "a", "url": "http://127.0.0.1:1/mcp", "era": "legacy"},
                                       {"name": "b", "url": "http://127.0.0.1:2/mcp", "era": "legacy"}])
    runtime = Runtime(settings)
    try:
        assert runtime.replica.owner == "http://10.0.0.9:9000/mcp" and runtime.replica.problems == ()
        a, b = runtime.backends
        assert a.replica is b.replica is runtime.replica
        assert b.sealer.open(a.sealer.seal({"exp": time.time() + 5})) is not None
        assert mrtr.StateSealer(b"s3cret").open(a.sealer.seal({"exp": time.time() + 5})) is not None
    finally:
        await runtime.aclose()


def test_the_secret_is_never_in_the_repr() -> None:
    replica = ReplicaContext.from_settings(load_settings(None, security={"secret": "hunter2-very-secret"}))
    assert "hunter2" not in repr(replica) and "secret" not in repr(replica)
    with pytest.raises(AttributeError):
        replica.owner = "elsewhere"  # type: ignore[misc]  # frozen
