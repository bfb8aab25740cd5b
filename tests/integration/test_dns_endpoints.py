"""DNS expansion (backends/resolve.py; docs/resilience.md "Several endpoints"): a backend URL
whose hostname resolves to several addresses (a Kubernetes headless Service) becomes one
endpoint per address, re-resolved every `resolve.interval_seconds`.

Real name resolution, changed by the test: the gateway runs as its own process in a private
mount namespace (`unshare -m`) whose /etc/hosts is a file of the test's, so the system
resolver (glibc's getaddrinfo, what production uses) answers what the test writes there, and
the machine's own /etc/hosts is never touched. The backends are real HTTPS servers on
127.0.0.2 and 127.0.0.3 (all of 127.0.0.0/8 is loopback on Linux) on one port, with a
certificate for the hostname only: a connection that sent the address as SNI or checked the
certificate against it would fail. Each records the Host header and SNI it saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from tests.support.listen import eventually
from tests.support.mcp_http import post
from tests.support.procs import ROOT, Proc, free_port
from tests.support.raw_http import json_answer, read_request
from tests.support.tls import CertificateAuthority

HOST = "mcp-headless.test"


def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(not _can_unshare(), reason="needs `unshare -m` (root, CAP_SYS_ADMIN) to give "
                                                           "the gateway a hosts file of its own")


class Replica:
    """One address of the headless Service: a tiny modern MCP server over HTTPS."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.calls = 0
        self.hosts: set[str] = set()
        self.sni: set[str | None] = set()
        self.hold = asyncio.Event()  # a `hold` tool call waits for it
        self.held = asyncio.Event()  # set when one is waiting

    def context(self, issued: Any) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(issued.cert_file, issued.key_file)
        context.sni_callback = lambda sock, name, _ctx: self.sni.add(name)  # type: ignore[assignment]
        return context

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                _, headers, body = await read_request(reader)
                self.hosts.add(headers.get("host", ""))
                msg = orjson.loads(body)
                if "id" not in msg:
                    writer.write(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                result = await self._result(msg["method"], msg.get("params") or {})
                writer.write(json_answer(orjson.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result})))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def _result(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "server/discover":
            return {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}, "resultType": "complete",
                    "serverInfo": {"name": "svc", "version": "1"}}
        if method == "tools/list":
            return {"tools": [{"name": n, "inputSchema": {"type": "object"}} for n in ("where", "hold")],
                    "resultType": "complete"}
        if method == "tools/call":
            self.calls += 1
            if params.get("name") == "hold":
                self.held.set()
                await self.hold.wait()
            return {"content": [{"type": "text", "text": self.address}], "resultType": "complete"}
        return {"resultType": "complete"}


@contextlib.asynccontextmanager
async def replicas(tmp_path: Path, *addresses: str) -> AsyncIterator[tuple[list[Replica], int, str]]:
    """HTTPS servers on each address, one port for all; yields them, the port, the CA file."""
    ca = CertificateAuthority(tmp_path)
    issued = ca.issue("headless", hosts=(HOST,))
    servers, found = [], [Replica(a) for a in addresses]
    port = 0
    for replica in found:
        server = await asyncio.start_server(replica.handle, replica.address, port, ssl=replica.context(issued))
        port = server.sockets[0].getsockname()[1]
        servers.append(server)
    try:
        yield found, port, ca.ca_file
    finally:
        for replica in found:
            replica.hold.set()
        for server in servers:
            server.close()


class HostsFile:
    """The gateway's /etc/hosts. Rewritten in place: the bind mount holds the inode."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.set()

    def set(self, *addresses: str) -> None:
        lines = ["127.0.0.1 localhost"] + [f"{address} {HOST}" for address in addresses]
        with self.path.open("r+" if self.path.exists() else "w") as f:
            f.seek(0)
            f.write("\n".join(lines) + "\n")
            f.truncate()


def gateway_with_hosts(config: Path, hosts: Path) -> Proc:
    port = free_port()
    script = 'mount --bind "$0" /etc/hosts && exec "$@"'
    argv = ["unshare", "-m", "--", "sh", "-c", script, str(hosts),
            sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(port)]
    return Proc(argv, port, env={"MCP_GATEWAY_SERVER__DRAIN_DELAY_SECONDS": "0"}, cwd=ROOT, name="gateway-dns")


def endpoint_series(metrics: str, backend: str = "svc") -> dict[str, float]:
    out = {}
    for line in metrics.splitlines():
        if line.startswith("mcp_gateway_backend_endpoint_up{") and f'backend="{backend}"' in line:
            label = line.split('endpoint="', 1)[1].split('"', 1)[0]
            out[label] = float(line.rsplit(" ", 1)[1])
    return out


def counter(metrics: str, name: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_a_hostname_with_several_addresses_is_an_endpoint_per_address_that_follows_the_answer(tmp_path):
    hosts = HostsFile(tmp_path / "hosts")
    hosts.set("127.0.0.2")
    async with replicas(tmp_path, "127.0.0.2", "127.0.0.3") as ((second, third), port, ca_file):
        config = tmp_path / "gateway.yaml"
        config.write_text(yaml.safe_dump({"backends": [{
            "name": "svc", "url": f"https://{HOST}:{port}/mcp", "era": "modern", "retries": 0,
            "tls": {"ca_file": ca_file}, "resolve": {"interval_seconds": 0.2},
            "health": {"check_interval_seconds": 0}}]}))
        gateway = gateway_with_hosts(config, hosts.path)
        await asyncio.to_thread(gateway.start)
        try:
            async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
                url = f"http://127.0.0.1:{gateway.port}/mcp"

                async def where() -> str:
                    response = await post(client, url, "tools/call", {"name": "where", "arguments": {}})
                    assert response.status_code == 200, response.text
                    return response.json()["result"]["content"][0]["text"]

                async def series() -> dict[str, float]:
                    return endpoint_series((await client.get(f"http://127.0.0.1:{gateway.port}/metrics")).text)

                label2, label3 = f"127.0.0.2:{port}", f"127.0.0.3:{port}"
                # One address: every call goes there, by address, with the hostname as Host and SNI.
                await eventually(lambda: _has(series, {label2}), timeout=10)
                assert {await where() for _ in range(10)} == {"127.0.0.2"}

                # The answer grows: the new address joins with fresh health, calls spread.
                hosts.set("127.0.0.2", "127.0.0.3")
                await eventually(lambda: _has(series, {label2, label3}), timeout=5)
                seen = [await where() for _ in range(40)]
                assert {"127.0.0.2", "127.0.0.3"} <= set(seen), seen

                # A call under way on .2 when .2 leaves the answer: drained, not cut.
                held = asyncio.create_task(post(client, url, "tools/call", {"name": "hold", "arguments": {}}))
                while not (second.held.is_set() or third.held.is_set()):
                    await asyncio.sleep(0.01)
                holder = second if second.held.is_set() else third
                leaving = holder.address
                staying = "127.0.0.3" if leaving == "127.0.0.2" else "127.0.0.2"
                hosts.set(staying)
                await eventually(lambda: _has(series, {f"{staying}:{port}"}), timeout=5)
                calls_before = holder.calls
                assert {await where() for _ in range(10)} == {staying}
                assert holder.calls == calls_before  # no new call went to the removed address
                holder.hold.set()
                response = await held
                assert response.status_code == 200 and response.json()["result"]["content"][0]["text"] == leaving

                # A failed resolution keeps the last good set, logged once and counted.
                hosts.set()
                metrics_url = f"http://127.0.0.1:{gateway.port}/metrics"

                async def failing() -> bool:
                    text = (await client.get(metrics_url)).text
                    return counter(text, "mcp_gateway_backend_resolve_failures_total") >= 3

                await eventually(failing, timeout=5)
                assert {await where() for _ in range(5)} == {staying}
                assert await series() == {f"{staying}:{port}": 1.0}
                assert gateway.output().count(f"cannot resolve {HOST}") == 1, gateway.output()[-2000:]
                # ... and it comes back.
                hosts.set("127.0.0.2", "127.0.0.3")
                await eventually(lambda: _has(series, {label2, label3}), timeout=5)
        finally:
            await asyncio.to_thread(gateway.stop)
        # Every request named the service, never an address: Host header and TLS SNI.
        for replica in (second, third):
            assert replica.hosts <= {f"{HOST}:{port}"}, replica.hosts
            assert replica.sni <= {HOST}, replica.sni
        assert second.hosts and third.hosts


async def _has(series: Any, labels: set[str]) -> bool:
    return set(await series()) == labels


class AddressedProc(Proc):
    """A legacy fixture server bound to one loopback address (Proc waits on 127.0.0.1)."""

    def __init__(self, address: str, port: int) -> None:
        from tests.support import legacy_venv

        super().__init__([legacy_venv.legacy_python(), str(ROOT / "tests/fixtures/servers/legacy_everything.py"),
                          "--host", address, "--port", str(port)], port, name=f"legacy-{address}")
        self.address = address

    def start(self, timeout: float = 20.0) -> Proc:
        import time

        self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection((self.address, self.port), timeout=0.2):
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} did not start: {self.output()[-2000:]}")


async def test_legacy_sessions_are_placed_on_the_addresses_of_the_answer(tmp_path):
    from tests.integration.test_legacy_endpoints import CAPABILITY_SETS, echo

    port = free_port()
    servers = [AddressedProc(a, port) for a in ("127.0.0.2", "127.0.0.3")]
    for server in servers:
        await asyncio.to_thread(server.start)
    hosts = HostsFile(tmp_path / "hosts")
    hosts.set("127.0.0.2", "127.0.0.3")
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({"backends": [{
        # era: auto: the probe picks the legacy delegate, which shares the backend's health
        # (the endpoint set the DNS watch changes, detect.AutoBackend).
        "name": "svc", "url": f"http://{HOST}:{port}/mcp", "era": "auto", "retries": 0,
        "resolve": {"interval_seconds": 0.2}, "health": {"check_interval_seconds": 0}}]}))
    gateway = gateway_with_hosts(config, hosts.path)
    await asyncio.to_thread(gateway.start)
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=20) as client:
            metrics_url = f"http://127.0.0.1:{gateway.port}/metrics"

            async def expanded() -> bool:
                return set(endpoint_series((await client.get(metrics_url)).text)) == {
                    f"127.0.0.2:{port}", f"127.0.0.3:{port}"}

            await eventually(expanded, timeout=10)
            url = f"http://127.0.0.1:{gateway.port}/mcp"
            for n, caps in enumerate(CAPABILITY_SETS[:8]):
                assert await echo(client, url, caps, str(n)) == str(n)
            states = []
            for server in servers:
                response = await client.get(f"http://{server.address}:{port}/sessions")
                states.append(response.json())
    finally:
        await asyncio.to_thread(gateway.stop)
        for server in servers:
            await asyncio.to_thread(server.stop)
    # Each address holds sessions of its own, and saw requests only for those.
    assert all(state["minted"] for state in states), states
    assert all(state["foreign"] == 0 for state in states), states
