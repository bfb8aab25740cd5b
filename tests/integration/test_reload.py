"""Live reload with real processes: a gateway subprocess, real HTTP backends and a stdio one.

Under load (calls running, 100 listen streams open), a reload by SIGHUP and by `serve
--watch` adds a backend, removes one (with a call still under way on it) and changes one:
no call fails, no stream is cut, every listener hears `notifications/tools/list_changed`, the
unchanged stdio backend keeps its process, and a broken configuration is refused (counted,
logged) while the running one keeps serving.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support import mcp_http
from tests.support.listen import ListenReader, eventually
from tests.support.procs import FIXTURE_SERVERS, Proc, gateway_process
from tests.support.scripted import Scripted

UNLIMITED = httpx.Limits(max_connections=None, max_keepalive_connections=None)
LISTENERS = 100
TOOLS_CHANGED = "notifications/tools/list_changed"


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, Scripted]]:
    started = {name: Scripted(name).start() for name in ("alpha", "beta", "gamma", "delta")}
    yield started
    for server in started.values():
        server.stop()


def stdio_backend(name: str) -> dict[str, Any]:
    return {"name": name, "command": [sys.executable, str(FIXTURE_SERVERS / "modern_stdio.py")], "era": "modern"}


def config(servers: dict[str, Scripted], names: list[str], stdio: tuple[str, ...] = ("local",),
           **backend_changes: dict[str, Any]) -> dict[str, Any]:
    backends = [{"name": n, "url": servers[n].url, "era": "modern", **backend_changes.get(n, {})} for n in names]
    return {"backends": [*backends, *(stdio_backend(n) for n in stdio)],
            "subscriptions": {"poll_min_seconds": 1.0, "max_listens_per_principal": 500}}


def write(path: Path, data: dict[str, Any] | str) -> None:
    """Replace the file at once (as an editor or a ConfigMap update does), never half-written."""
    text = data if isinstance(data, str) else yaml.safe_dump(data)
    scratch = path.with_suffix(".tmp")
    scratch.write_text(text)
    os.replace(scratch, path)


def children(pid: int) -> dict[int, str]:
    """The direct child processes of `pid` and their command lines (from /proc)."""
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found[int(entry)] = cmdline
    return found


def stdio_pids(gw: Proc) -> set[int]:
    assert gw.proc is not None
    return {pid for pid, cmd in children(gw.proc.pid).items() if "modern_stdio.py" in cmd}


async def metric(client: httpx.AsyncClient, base: str, line_start: str) -> float:
    text = (await client.get(f"{base}/metrics")).text
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def tool_names(client: httpx.AsyncClient, url: str) -> set[str]:
    names: set[str] = set()
    cursor = None
    for _ in range(50):
        answer = await mcp_http.post(client, url, "tools/list", {"cursor": cursor} if cursor else {})
        result = answer.json()["result"]
        names |= {t["name"] for t in result["tools"]}
        cursor = result.get("nextCursor")
        if not cursor:
            return names
    raise AssertionError("tools/list kept paging")


def final(answer: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC response of a POST, answered as JSON or as an SSE stream."""
    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        return [m for m in mcp_http.sse_messages(answer.text) if "method" not in m][-1]
    return answer.json()


class Load:
    """Calls in a loop to backends that exist before and after the reload; every failure is kept."""

    def __init__(self, client: httpx.AsyncClient, url: str, tools: list[str], workers: int = 6) -> None:
        self.client, self.url, self.tools = client, url, tools
        self.failures: list[str] = []
        self.done = 0
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._work(i)) for i in range(workers)]

    async def _work(self, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            tool = self.tools[(i + n) % len(self.tools)]
            n += 1
            try:
                answer = await mcp_http.post(self.client, self.url, "tools/call",
                                             {"name": tool, "arguments": {"text": f"w{i}-{n}"}})
                body = final(answer)
                if answer.status_code != 200 or "error" in body or body["result"].get("isError"):
                    self.failures.append(f"{tool}: {answer.status_code} {answer.text[:200]}")
            except (httpx.HTTPError, ValueError, IndexError) as exc:
                self.failures.append(f"{tool}: {type(exc).__name__} {exc}")
            self.done += 1

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


@pytest.mark.parametrize("trigger", ["sighup", "watch"])
async def test_reload_under_load_adds_removes_and_changes_backends(servers, tmp_path, trigger):
    path = tmp_path / "gateway.yaml"
    write(path, config(servers, ["alpha", "beta", "delta"], stdio=("local", "spare")))
    gw = gateway_process(path, args=("--watch",) if trigger == "watch" else ()).start()
    assert gw.proc is not None

    def reload() -> None:
        if trigger == "sighup":
            assert gw.proc is not None
            os.kill(gw.proc.pid, signal.SIGHUP)

    base = f"http://127.0.0.1:{gw.port}"
    url = f"{base}/mcp"
    readers: list[ListenReader] = []
    load: Load | None = None
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=30, limits=UNLIMITED) as client:
            await eventually(lambda: len(stdio_pids(gw)) == 2)
            both = stdio_pids(gw)
            assert {"alpha__echo", "delta__echo", "local__echo"} <= await tool_names(client, url)
            readers = [ListenReader(client, url, {"toolsListChanged": True}, id=f"l{i}") for i in range(LISTENERS)]
            await asyncio.gather(*(r.open() for r in readers))
            for r in readers:
                assert r.status == 200 and r.ack["params"]["notifications"].get("toolsListChanged"), r.error
            load = Load(client, url, ["alpha__echo", "beta__echo", "local__echo"])
            # A call under way on the backend about to be removed: the drain lets it finish.
            on_removed = asyncio.create_task(mcp_http.post(client, url, "tools/call",
                                                           {"name": "delta__slow", "arguments": {"seconds": 1.5}}))
            on_removed_stdio = asyncio.create_task(mcp_http.post(
                client, url, "tools/call", {"name": "spare__slow_echo", "arguments": {"text": "late", "delay": 2}}))
            await eventually(lambda: load.done >= 30)
            await asyncio.sleep(0.3)

            # -- the reload: gamma added, delta removed, beta changed; alpha and local kept
            changed = config(servers, ["alpha", "beta", "gamma"], beta={"timeout_seconds": 31})
            changed["server"] = {"max_body_bytes": 2_000_000}  # only a restart applies this
            write(path, changed)
            reload()
            await eventually(lambda: all(any(m.get("method") == TOOLS_CHANGED for m in r.notifications)
                                         for r in readers), timeout=30)
            names = await tool_names(client, url)
            assert "gamma__echo" in names and not any(n.startswith("delta__") for n in names)
            answer = await on_removed
            assert answer.status_code == 200 and final(answer)["result"]["content"][0]["text"] == "delta: slept", \
                answer.text
            answer = await on_removed_stdio  # its process lives until the call is answered
            assert answer.status_code == 200 and final(answer)["result"]["content"][0]["text"] == "late", answer.text
            await eventually(lambda: len(stdio_pids(gw)) == 1)  # then it is closed
            before = load.done
            await eventually(lambda: load.done >= before + 30)  # calls keep flowing after the swap
            gamma = await mcp_http.post(client, url, "tools/call", {"name": "gamma__echo", "arguments": {"text": "hi"}})
            assert final(gamma)["result"]["content"][0]["text"] == "gamma: hi"
            assert await metric(client, base, 'mcp_gateway_config_reloads_total{result="applied"}') == 1
            assert await metric(client, base, "mcp_gateway_config_needs_restart") == 1

            # -- a broken configuration: refused, the running one keeps serving
            write(path, "backends:\n  - name: Bad Name\n    url: http://127.0.0.1:1/mcp\n")
            reload()

            async def refused() -> bool:
                return await metric(client, base, 'mcp_gateway_config_reloads_total{result="refused"}') == 1

            await eventually(refused, timeout=15)
            assert await tool_names(client, url) == names
            before = load.done
            await eventually(lambda: load.done >= before + 30)
            await load.stop()

            assert load.failures == [], load.failures[:5]
            assert not [r.id for r in readers if r.ended], "a listen stream was cut by the reload"
            (kept,) = stdio_pids(gw)
            assert kept in both, "the unchanged stdio backend lost its process"
            # The replaced backend's and the removed one's calls went to the right servers.
            assert any(c["params"].get("name") == "echo" for c in await servers["gamma"].calls("tools/call"))
    finally:
        if load is not None:
            await load.stop()
        for r in readers:
            await r.close()
        gw.stop()
    log = gw.output()
    assert "server.max_body_bytes changed, which only a restart applies" in log
    assert "refused: the configuration is invalid" in log and "backends.0.name" in log
    assert "added gamma; removed delta, spare; replaced beta" in log
