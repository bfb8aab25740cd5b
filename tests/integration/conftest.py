"""Fixtures shared by integration test modules, each started once per module: two scripted
modern backends (tests/fixtures/servers/scripted_modern.py) for the front-door tests, the
counting backend (counting_modern.py) for the cache tests and the mutable backend
(mutable_modern.py) for the listen tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.governance import JwksServer
from tests.support.oauth import Issuer, rsa_key
from tests.support.procs import Proc, python_server
from tests.support.scripted import Scripted


@pytest.fixture(scope="module")
def alpha() -> Iterator[Scripted]:
    with Scripted("alpha") as server:
        yield server


@pytest.fixture(scope="module")
def beta() -> Iterator[Scripted]:
    with Scripted("beta") as server:
        yield server


@pytest.fixture(scope="module")
def counting_backend() -> Iterator[Proc]:
    proc = python_server("counting_modern.py", name="counting-modern").start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def mutable_backend() -> Iterator[Proc]:
    proc = python_server("mutable_modern.py", name="mutable-modern").start()
    try:
        yield proc
    finally:
        proc.stop()


# -- governance (authorization, rate limits, curation, views): tests/support/governance.py --


@pytest.fixture(scope="module")
def ledger() -> Iterator[Scripted]:
    with Scripted("ledger") as server:
        yield server


@pytest.fixture(scope="module")
def reports() -> Iterator[Scripted]:
    with Scripted("reports") as server:
        yield server


@pytest.fixture(scope="module")
def issuer() -> Issuer:
    return Issuer(keys=[rsa_key("k1")])


@pytest.fixture(scope="module")
def jwks_url(issuer: Issuer) -> Iterator[str]:
    with JwksServer(issuer) as server:
        yield server.url
