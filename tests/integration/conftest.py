"""Fixtures shared by the front-door integration tests: two scripted modern backends
(tests/fixtures/servers/scripted_modern.py), one pair per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.scripted import Scripted


@pytest.fixture(scope="module")
def alpha() -> Iterator[Scripted]:
    server = Scripted("alpha").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def beta() -> Iterator[Scripted]:
    server = Scripted("beta").start()
    yield server
    server.stop()
