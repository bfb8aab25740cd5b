"""The shared cache over TLS with a private CA and a password from a file, against a real
redis-server that speaks only TLS: two replicas share an answer; without the CA the server's
certificate is refused, the cache is bypassed (never a failed request), and neither the
password nor the certificate error's details leak a secret into the logs."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import mcp_http
from tests.support.gateway import running_gateway
from tests.support.procs import Proc, free_port, redis_server_binary
from tests.support.tls import TlsFiles, loopback_certificates

PASSWORD = "tls-test-password-3f9a"


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return loopback_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_redis(tls_files: TlsFiles) -> Iterator[Proc]:
    if redis_server_binary() is None:
        pytest.fail("redis-server is not installed; run the tests through scripts/test.sh, which installs it")
    port = free_port()
    proc = Proc(["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                 "--tls-cert-file", str(tls_files.cert), "--tls-key-file", str(tls_files.key),
                 "--tls-ca-cert-file", str(tls_files.ca), "--tls-auth-clients", "no",
                 "--requirepass", PASSWORD, "--save", "", "--appendonly", "no"], port, name="redis-tls")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def config(backend: Proc, redis: dict) -> dict:
    return {"backends": [{"name": "counted", "url": backend.url}],
            "redis": redis,
            "cache": {"store": "redis", "local_max_entries": 0, "redis_retry_seconds": 0.1,
                      "redis_timeout_ms": 1000}}


async def _read(http: httpx.AsyncClient, url: str, uri: str) -> tuple[str, str | None]:
    response = await mcp_http.post(http, url, "resources/read", {"uri": uri})
    assert response.status_code == 200, response.text
    return response.json()["result"]["contents"][0]["text"], response.headers.get("x-cache")


async def test_two_replicas_share_the_cache_over_tls_with_a_private_ca(counting_backend, tls_redis, tls_files,
                                                                       tmp_path: Path):
    secret = tmp_path / "redis-password"
    secret.write_text(PASSWORD + "\n")
    redis = {"url": f"rediss://127.0.0.1:{tls_redis.port}/0", "ca_file": str(tls_files.ca),
             "password": {"file": str(secret)}}
    uri = f"count://public/{uuid.uuid4().hex[:10]}"
    async with running_gateway(config(counting_backend, redis)) as one, \
            running_gateway(config(counting_backend, redis)) as two, httpx.AsyncClient(timeout=30) as http:
        first, outcome = await _read(http, one.url, uri)
        assert outcome == "miss"
        assert await _read(http, two.url, uri) == (first, "hit")


async def test_without_the_ca_the_certificate_is_refused_and_the_cache_bypassed(counting_backend, tls_redis,
                                                                                caplog, monkeypatch):
    monkeypatch.setenv("I22A_TLS_REDIS_PASSWORD", PASSWORD)
    redis = {"url": f"rediss://127.0.0.1:{tls_redis.port}/0", "password": {"env": "I22A_TLS_REDIS_PASSWORD"}}
    caplog.set_level(logging.INFO)
    async with running_gateway(config(counting_backend, redis)) as gw, httpx.AsyncClient(timeout=30) as http:
        text, outcome = await _read(http, gw.url, f"count://public/{uuid.uuid4().hex[:10]}")
        assert outcome == "bypass" and text.endswith("#1")
    logged = [r.getMessage() for r in caplog.records]
    assert any("redis cache at rediss://:***@127.0.0.1" in m and "certificate" in m.lower() for m in logged), logged
    assert not [m for m in logged if PASSWORD in m]
