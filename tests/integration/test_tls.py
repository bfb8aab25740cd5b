"""TLS both ways, with certificates made in the test (tests/support/tls.py): a backend that
requires a client certificate (mTLS), a private CA trusted only where configured, an SNI
override, and the gateway's own TLS listener (optionally mTLS) serving real clients, its
certificate reloaded on SIGHUP."""

from __future__ import annotations

import signal
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import yaml

from tests.support import mcp_http
from tests.support.gateway import running_gateway
from tests.support.oauth import RecordingBackend, ServedApp
from tests.support.procs import free_port, gateway_process
from tests.support.tls import CertificateAuthority

in_module_loop = pytest.mark.asyncio(loop_scope="module")  # beside the module's servers


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority(directory, "Private CA")
    other = CertificateAuthority(directory, "Other CA")
    return {
        "ca": ca, "other": other,
        "server": ca.issue("backend", hosts=("127.0.0.1", "backend.internal")),
        "named": ca.issue("named-only", hosts=("backend.internal",)),
        "client": ca.issue("gateway-client", client=True),
        "stranger": other.issue("stranger-client", client=True),
        "front": ca.issue("gateway-front", hosts=("127.0.0.1",)),
        "front2": ca.issue("gateway-front-renewed", hosts=("127.0.0.1",)),
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mtls_backend(pki) -> AsyncIterator[tuple[ServedApp, RecordingBackend]]:
    backend = RecordingBackend()
    served = ServedApp(backend, ssl_certfile=pki["server"].cert_file, ssl_keyfile=pki["server"].key_file,
                       ssl_ca_certs=pki["ca"].ca_file, ssl_cert_reqs=ssl.CERT_REQUIRED)
    await served.start()
    yield served, backend
    await served.stop()


def gateway(url: str, tls: dict[str, Any] | None, server: dict[str, Any] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": "alpha", "url": url, "era": "modern", "retries": 0}
    if tls is not None:
        entry["tls"] = tls
    return {"backends": [entry], **({"server": server} if server else {})}


async def tools_list(gw_url: str, **client: Any) -> httpx.Response:
    async with httpx.AsyncClient(**client) as http:
        return await mcp_http.post(http, gw_url, "tools/list")


@in_module_loop
async def test_a_backend_that_requires_a_client_certificate_is_reached_with_one(pki, mtls_backend):
    served, backend = mtls_backend
    tls = {"ca_file": pki["ca"].ca_file, "cert_file": pki["client"].cert_file, "key_file": pki["client"].key_file}
    async with running_gateway(gateway(f"{served.base}/mcp", tls), discover=False) as gw:
        response = await tools_list(gw.url)
    assert response.status_code == 200, response.text
    assert response.json()["result"]["tools"][0]["name"] == "echo"


@in_module_loop
async def test_without_a_client_certificate_the_backend_refuses_the_handshake(pki, mtls_backend):
    served, _ = mtls_backend
    async with running_gateway(gateway(f"{served.base}/mcp", {"ca_file": pki["ca"].ca_file}), discover=False) as gw:
        response = await tools_list(gw.url)
    assert response.status_code == 502
    error = response.json()["error"]
    # TLS 1.3: the backend checks the certificate after the client's handshake ends, and
    # resets the connection on the first request.
    assert error["code"] == -31001 and error["data"] == {"backends": ["alpha"]}
    assert "Connection reset" in error["message"] or "TLS" in error["message"]


@in_module_loop
async def test_a_client_certificate_from_another_ca_is_refused(pki, mtls_backend):
    served, _ = mtls_backend
    tls = {"ca_file": pki["ca"].ca_file, "cert_file": pki["stranger"].cert_file, "key_file": pki["stranger"].key_file}
    async with running_gateway(gateway(f"{served.base}/mcp", tls), discover=False) as gw:
        response = await tools_list(gw.url)
    assert response.status_code == 502


@in_module_loop
async def test_a_private_ca_is_trusted_only_where_configured(pki, mtls_backend):
    served, _ = mtls_backend
    client = {"cert_file": pki["client"].cert_file, "key_file": pki["client"].key_file}
    # No ca_file: the system trust store, which has never heard of the private CA.
    async with running_gateway(gateway(f"{served.base}/mcp", client), discover=False) as gw:
        response = await tools_list(gw.url)
    assert response.status_code == 502
    assert "certificate verify failed" in response.json()["error"]["message"]
    # Another CA's bundle does not vouch for it either.
    async with running_gateway(gateway(f"{served.base}/mcp", {**client, "ca_file": pki["other"].ca_file}),
                               discover=False) as gw:
        assert (await tools_list(gw.url)).status_code == 502


@in_module_loop
async def test_server_name_checks_and_sends_the_configured_name(pki, tmp_path):
    backend = RecordingBackend()
    served = ServedApp(backend, ssl_certfile=pki["named"].cert_file, ssl_keyfile=pki["named"].key_file)
    await served.start()
    try:
        url = f"{served.base}/mcp"  # https://127.0.0.1:port: the certificate names backend.internal only
        async with running_gateway(gateway(url, {"ca_file": pki["ca"].ca_file}), discover=False) as gw:
            assert (await tools_list(gw.url)).status_code == 502  # hostname mismatch
        async with running_gateway(gateway(url, {"ca_file": pki["ca"].ca_file, "server_name": "backend.internal"}),
                                   discover=False) as gw:
            assert (await tools_list(gw.url)).status_code == 200
    finally:
        await served.stop()


def test_insecure_skip_verify_is_refused_without_the_explicit_allow_flag(pki):
    from gateway.settings import ConfigError, load_settings

    with pytest.raises(ConfigError) as exc:
        load_settings(None, **gateway("https://127.0.0.1:1/mcp", {"insecure_skip_verify": True}))
    assert exc.value.problems[0][0] == "backends.0.tls.insecure_skip_verify"
    assert "allow_insecure_skip_verify" in exc.value.problems[0][1]
    settings = load_settings(None, **gateway("https://127.0.0.1:1/mcp", {"insecure_skip_verify": True,
                                                                          "allow_insecure_skip_verify": True}))
    assert settings.backends[0].tls.insecure_skip_verify


@in_module_loop
async def test_insecure_skip_verify_with_the_allow_flag_reaches_an_untrusted_backend(pki):
    backend = RecordingBackend()
    served = ServedApp(backend, ssl_certfile=pki["named"].cert_file, ssl_keyfile=pki["named"].key_file)
    await served.start()
    try:
        tls = {"insecure_skip_verify": True, "allow_insecure_skip_verify": True}
        async with running_gateway(gateway(f"{served.base}/mcp", tls), discover=False) as gw:
            assert (await tools_list(gw.url)).status_code == 200
    finally:
        await served.stop()


# -- the gateway's own listener ---------------------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def plain_backend() -> AsyncIterator[ServedApp]:
    served = ServedApp(RecordingBackend())
    await served.start()
    yield served
    await served.stop()


@in_module_loop
async def test_the_gateway_serves_tls_to_a_real_client(pki, plain_backend):
    front = {"tls": {"cert_file": pki["front"].cert_file, "key_file": pki["front"].key_file}}
    async with running_gateway(gateway(f"{plain_backend.base}/mcp", None, front), discover=False) as gw:
        url = gw.url.replace("http://", "https://")
        response = await tools_list(url, verify=ssl.create_default_context(cafile=pki["ca"].ca_file))
        assert response.status_code == 200
        with pytest.raises((httpx.ConnectError, httpx.RemoteProtocolError)):
            await tools_list(gw.url)  # plain HTTP on the TLS port: no answer
        with pytest.raises(httpx.ConnectError):
            await tools_list(url)  # the system trust store does not know the private CA


@in_module_loop
async def test_the_gateway_requires_a_client_certificate_with_client_ca_file(pki, plain_backend):
    front = {"tls": {"cert_file": pki["front"].cert_file, "key_file": pki["front"].key_file,
                     "client_ca_file": pki["ca"].ca_file}}
    async with running_gateway(gateway(f"{plain_backend.base}/mcp", None, front), discover=False) as gw:
        url = gw.url.replace("http://", "https://")
        with_cert = ssl.create_default_context(cafile=pki["ca"].ca_file)
        with_cert.load_cert_chain(pki["client"].cert_file, pki["client"].key_file)
        assert (await tools_list(url, verify=with_cert)).status_code == 200
        with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
            await tools_list(url, verify=ssl.create_default_context(cafile=pki["ca"].ca_file))


def _served_certificate(port: int, ca_file: str) -> str:
    context = ssl.create_default_context(cafile=ca_file)
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert()["subject"][0][0][1]


def test_sighup_reloads_the_listeners_certificate(pki, tmp_path):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(Path(pki["front"].cert_file).read_bytes())
    key.write_bytes(Path(pki["front"].key_file).read_bytes())
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({"demo": True, "server": {"tls": {"cert_file": str(cert), "key_file": str(key)}}}))
    proc = gateway_process(config, free_port())
    proc.start()
    try:
        assert _served_certificate(proc.port, pki["ca"].ca_file) == "gateway-front"
        cert.write_bytes(Path(pki["front2"].cert_file).read_bytes())
        key.write_bytes(Path(pki["front2"].key_file).read_bytes())
        assert proc.proc is not None
        proc.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while _served_certificate(proc.port, pki["ca"].ca_file) != "gateway-front-renewed":
            assert time.monotonic() < deadline, proc.output()[-2000:]
            time.sleep(0.1)
        assert proc.proc.poll() is None  # still serving
        # A broken file on the next reload: the current certificate keeps serving.
        cert.write_text("not a certificate")
        proc.proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert _served_certificate(proc.port, pki["ca"].ca_file) == "gateway-front-renewed"
        assert "reloading" in proc.output() and "the current certificate keeps serving" in proc.output()
    finally:
        proc.stop()


@in_module_loop
async def test_a_token_endpoint_behind_a_private_ca_is_trusted_through_auth_ca_file(pki, plain_backend):
    from tests.support.oauth import AuthorizationServer

    authz = AuthorizationServer({"gw": "gw-secret"})
    served = ServedApp(authz, ssl_certfile=pki["server"].cert_file, ssl_keyfile=pki["server"].key_file)
    await served.start()
    try:
        auth = {"type": "oauth_client_credentials", "token_url": f"{served.base}/token", "client_id": "gw",
                "client_secret": "gw-secret"}
        settings = gateway(f"{plain_backend.base}/mcp", None)
        settings["backends"][0]["auth"] = auth
        async with running_gateway(settings, discover=False) as gw:
            assert (await tools_list(gw.url)).status_code == 502  # the system store does not know the CA
        settings["backends"][0]["auth"] = {**auth, "ca_file": pki["ca"].ca_file}
        async with running_gateway(settings, discover=False) as gw:
            assert (await tools_list(gw.url)).status_code == 200
        assert len(authz.requests) == 1
    finally:
        await served.stop()
