"""Era verdicts from probe answers (gateway/backends/detect.py, digest §h.1)."""

from __future__ import annotations

import pytest

from gateway.backends.detect import verdict


@pytest.mark.parametrize("answer", [
    {"jsonrpc": "2.0", "id": 1, "result": {"supportedVersions": ["2026-07-28"], "capabilities": {}}},
    {"jsonrpc": "2.0", "id": 1, "error": {"code": -32022, "message": "x", "data": {"supported": ["2027-01-01"]}}},
    {"jsonrpc": "2.0", "id": 1, "error": {"code": -32020, "message": "header mismatch"}},
    {"jsonrpc": "2.0", "id": 1, "error": {"code": -32021, "message": "needs sampling"}},
])
def test_modern_evidence(answer: dict) -> None:
    assert verdict(answer) == "modern"


@pytest.mark.parametrize("answer", [
    None,  # 404/405 without a body, a redirect, a timeout
    {"jsonrpc": "2.0", "id": "server-error", "error": {"code": -32600, "message": "Bad Request: Missing session ID"}},
    {"jsonrpc": "2.0", "id": 1, "error": {"code": -32000, "message": "Server not initialized"}},
    {"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "Method not found"}},
    {"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "Invalid request parameters"}},
    # discover answered, but only handshake-era versions advertised (VER)
    {"jsonrpc": "2.0", "id": 1, "result": {"supportedVersions": ["2025-11-25"], "capabilities": {}}},
    ["not", "an", "object"],
])
def test_everything_else_is_legacy(answer: object) -> None:
    assert verdict(answer) == "legacy"
