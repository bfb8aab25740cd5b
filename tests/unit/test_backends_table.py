"""Which backend a configuration gets: the (transport, era) table in gateway/backends/__init__.py,
and the seam that keeps the initialize era removable (DESIGN.md principle 5)."""

from __future__ import annotations

import ast
import pathlib

import pytest

import gateway.backends as backends
from gateway.backends import UnsupportedBackend, create_backend
from gateway.backends.detect import AutoBackend
from gateway.backends.legacy.http_backend import LegacyHttpBackend
from gateway.backends.legacy.sse import LegacySseBackend
from gateway.backends.legacy.stdio import LegacyStdioBackend
from gateway.backends.modern import ModernHttpBackend
from gateway.backends.replica import ReplicaContext
from gateway.backends.stdio import ModernStdioBackend
from gateway.settings import BackendSettings

URL = "http://127.0.0.1:1/mcp"
COMMAND = ["python3", "-c", "pass"]


@pytest.mark.parametrize(("config", "kind"), [
    ({"url": URL, "era": "modern"}, ModernHttpBackend),
    ({"url": URL, "era": "legacy"}, LegacyHttpBackend),
    ({"url": URL, "era": "legacy", "transport": "streamable-http"}, LegacyHttpBackend),
    ({"url": URL, "transport": "sse"}, LegacySseBackend),
    ({"url": URL, "era": "legacy", "transport": "sse"}, LegacySseBackend),
    ({"command": COMMAND, "era": "modern"}, ModernStdioBackend),
    ({"command": COMMAND, "era": "legacy"}, LegacyStdioBackend),
    ({"url": URL}, AutoBackend),
    ({"command": COMMAND}, AutoBackend),
])
def test_each_configuration_gets_the_backend_of_its_row(config: dict, kind: type) -> None:
    assert type(create_backend(BackendSettings(name="b", **config))) is kind


def test_legacy_backends_get_the_replica_context_they_are_given() -> None:
    replica = ReplicaContext(secret=b"shared", owner="http://10.0.0.9:8080/mcp")
    backend = create_backend(BackendSettings(name="b", url=URL, era="legacy"), replica)
    assert isinstance(backend, LegacyHttpBackend)
    assert backend.replica is replica and backend.owner == "http://10.0.0.9:8080/mcp"


def test_a_build_without_the_legacy_rows_refuses_a_legacy_backend_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    modern_only = {key: factory for key, factory in backends.BACKENDS.items() if key[1] == "modern"}
    monkeypatch.setattr(backends, "BACKENDS", modern_only)
    with pytest.raises(UnsupportedBackend, match="'old': no legacy backend over streamable-http"):
        create_backend(BackendSettings(name="old", url=URL, era="legacy"))
    assert isinstance(create_backend(BackendSettings(name="new", url=URL, era="modern")), ModernHttpBackend)


def test_only_the_two_wiring_lines_outside_legacy_know_the_legacy_package() -> None:
    """Deleting gateway/backends/legacy/ must leave every other module importable but the
    table's two marked lines (one import, one `**` row)."""
    root = pathlib.Path(backends.__file__).parent
    importers = {}
    for path in root.parent.rglob("*.py"):
        if root / "legacy" in path.parents:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if any(name.startswith("gateway.backends.legacy") for name in names):
                importers.setdefault(str(path.relative_to(root.parent)), []).append(node.lineno)
    assert importers == {"backends/__init__.py": [importers.get("backends/__init__.py", [0])[0]]}
    source = (root / "__init__.py").read_text()
    assert source.count("LEGACY_BACKENDS") == 2 and source.count("the legacy era (") == 2
