"""Fixtures shared by every test: real servers on loopback, real redis-server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.procs import Proc, RedisServer, python_server, redis_server_binary


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    if redis_server_binary() is None:
        pytest.fail("redis-server is not installed; run the tests through scripts/test.sh, which installs it")
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def conformance_backend() -> Iterator[Proc]:
    """The modern conformance fixture (mcp==2.3.0 MCPServer), shared by a test session."""
    proc = python_server("conformance_modern.py", name="conformance-modern").start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def second_backend() -> Iterator[Proc]:
    """A second, independent modern backend with the same surface, for fleet tests."""
    proc = python_server("conformance_modern.py", name="conformance-modern-2").start()
    try:
        yield proc
    finally:
        proc.stop()
