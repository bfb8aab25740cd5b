"""Benchmark harness: direct backend vs nginx vs mcp-gateway, measured in the same run.

    /work/.venv/bin/python bench/run.py                      # all default workloads, 3 x 10 s
    /work/.venv/bin/python bench/run.py --quick              # 3 x 1 s per target
    /work/.venv/bin/python bench/run.py --smoke              # CI: every workload, smallest size
    /work/.venv/bin/python bench/run.py --workloads passthrough-call,tools-list
    /work/.venv/bin/python bench/run.py --list               # what workloads exist

For each workload the harness starts fresh processes (backend(s), nginx, gateway), checks
every target once with httpx (a target that does not answer a correct MCP result is reported,
never measured), then runs wrk against the targets interleaved A,B,C,A,B,C,... for
``--reps`` repetitions and prints medians plus ratios against the direct backend and
against nginx from the same run.  Numbers are informational; nothing here asserts speed.

CPU layout (``--layout``, default ``shared``) on a 2-core box:
  shared: wrk on CPU 0; backend AND the proxy under test (nginx / gateway) on CPU 1.
          The load generator never steals CPU from the system under test, and the direct
          target gets exactly the same single core as backend+proxy.  Since CPU 1 is
          saturated, 1/rps is the CPU time one request costs on that core, so
          "+us/req" = 1e6/rps(target) - 1e6/rps(direct) is the proxy's CPU cost per request.
  split:  wrk and backend on CPU 0, proxy on CPU 1.  Gives the proxy a core to itself but
          makes the direct target share a core with wrk, so ratios are less comparable.

Everything listens on 127.0.0.1 on free ports; every wait is bounded; every process the
harness starts is killed (by its own process group id) on exit, Ctrl-C or error.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import statistics
import string
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PY = sys.executable
MODERN = "2026-07-28"
LEGACY = "2025-11-25"
META = {"io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {}}


def log(*a) -> None:
    print("[bench]", *a, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- tools


_apt_updated = False


def ensure_tool(binary: str, package: str) -> str:
    """Return the path of ``binary``; apt-get install ``package`` when missing (root only)."""
    global _apt_updated
    found = shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise SystemExit(f"{binary} not found; install the Debian package {package!r}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if not _apt_updated:
        log("apt-get update")
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
        _apt_updated = True
    log(f"apt-get install {package}")
    subprocess.run(["apt-get", "install", "-y", "-qq", package], check=True, env=env,
                   timeout=900)
    found = shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if not found:
        raise SystemExit(f"{binary} still missing after installing {package}")
    return found


def cpu_times() -> dict[str, tuple[int, int]]:
    """Per-CPU (busy, total) jiffies from /proc/stat."""
    out = {}
    for ln in Path("/proc/stat").read_text().splitlines():
        if ln.startswith("cpu") and ln[3:4].isdigit():
            f = ln.split()
            v = [int(x) for x in f[1:]]
            idle = v[3] + (v[4] if len(v) > 4 else 0)        # idle + iowait
            out[f[0]] = (sum(v[:8]) - idle, sum(v[:8]))
    return out


def cpu_busy(before: dict, after: dict) -> dict[str, float]:
    res = {}
    for cpu, (b1, t1) in after.items():
        b0, t0 = before.get(cpu, (0, 0))
        res[cpu] = round(100.0 * (b1 - b0) / (t1 - t0), 1) if t1 > t0 else 0.0
    return res


def idle_check(seconds: float = 1.0) -> str:
    """Busy % per CPU while the harness runs nothing: other tenants' load skews numbers."""
    b = cpu_times()
    time.sleep(seconds)
    busy = cpu_busy(b, cpu_times())
    txt = " ".join(f"{c}={v:.0f}%" for c, v in busy.items())
    if any(v > 10 for v in busy.values()):
        log(f"WARNING: machine not idle before measuring ({txt}); numbers will be noisy")
    return txt


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- processes


class Procs:
    """Every child the harness starts, each in its own process group, killed by pgid."""

    def __init__(self, nice: int = 0) -> None:
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.nice = nice

    def start(self, name: str, argv: list[str], *, log_path: Path, cwd: Path | None = None,
              env: dict | None = None) -> subprocess.Popen:
        f = open(log_path, "wb")
        try:
            p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 cwd=cwd, env=env, start_new_session=True)
        finally:
            f.close()
        self.procs.append((name, p))
        log(f"started {name} pid={p.pid}: {' '.join(argv)}")
        boost(p.pid, self.nice)
        return p

    def stop_all(self) -> None:
        for name, p in reversed(self.procs):
            self._stop(name, p)
        self.procs.clear()

    @staticmethod
    def _stop(name: str, p: subprocess.Popen) -> None:
        if p.poll() is not None:
            return
        try:
            os.killpg(p.pid, signal.SIGTERM)   # pgid == pid (start_new_session)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log(f"{name} pid={p.pid} ignored SIGTERM; SIGKILL")
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=5)


def boost(pid: int, nice: int) -> None:
    """Apply ``nice`` to the autogroup of ``pid`` (it leads its own session).

    With kernel.sched_autogroup_enabled=1 every session is its own scheduling group and a
    plain ``nice`` only ranks processes inside their group, so a CPU hog in another tenant's
    session would still take half a core from the system under test.  Best effort."""
    if not nice:
        return
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    except OSError:
        pass


def wait_ready(url: str, proc: subprocess.Popen, timeout: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode} before ready:\n{tail(log_path)}")
        try:
            r = httpx.get(url, timeout=1.0)
            if r.status_code == 200:
                return
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as e:
            last = repr(e)
        time.sleep(0.1)
    raise RuntimeError(f"not ready after {timeout}s ({last}):\n{tail(log_path)}")


def tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


# --------------------------------------------------------------------------- targets


@dataclass
class Request:
    """One MCP POST, exactly as wrk will send it (see bench/mcp.lua)."""
    body: dict
    method: str = ""            # Mcp-Method ("" = omitted)
    name: str = ""              # Mcp-Name ("" = omitted)
    protocol_version: str = MODERN
    session_id: str = ""

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json",
             "Accept": "application/json, text/event-stream"}
        if self.protocol_version:
            h["MCP-Protocol-Version"] = self.protocol_version
        if self.method:
            h["Mcp-Method"] = self.method
        if self.name:
            h["Mcp-Name"] = self.name
        if self.session_id:
            h["Mcp-Session-Id"] = self.session_id
        return h

    def wrk_env(self) -> dict[str, str]:
        return {"MCP_METHOD": self.method, "MCP_NAME": self.name,
                "MCP_PROTOCOL_VERSION": self.protocol_version,
                "MCP_SESSION_ID": self.session_id,
                "MCP_BODY": json.dumps(self.body, separators=(",", ":"))}


def modern_request(method: str, params: dict | None = None, name: str = "") -> Request:
    p = dict(params or {})
    p["_meta"] = META
    return Request(body={"jsonrpc": "2.0", "id": 1, "method": method, "params": p},
                   method=method, name=name)


CALL_ECHO = modern_request("tools/call", {"name": "echo", "arguments": {"text": "hi"}}, "echo")
LIST_TOOLS = modern_request("tools/list")


@dataclass
class Target:
    name: str                   # "direct", "nginx", "gateway", ...
    url: str
    request: Request
    check: Callable[[dict], str | None] | None = None   # result -> error text or None
    skipped: str = ""           # reason; a skipped target is shown but never measured
    runs: list[dict] = field(default_factory=list)
    # Expected X-Cache of a repeated request ("hit", "miss", "bypass"; "" = not checked):
    # a cache workload whose target does not actually hit (or miss) is never measured.
    x_cache: str = ""
    # wrk connections for this target when it must not use --connections (None = use it).
    connections: int | None = None
    # Context.gateway_target's arguments for a gateway target, so that --compare can start the
    # same gateway from another source tree.
    made_with: dict | None = None
    # The answer is an SSE stream whose last message is the response (stdio-call).
    streamed: bool = False


def check_call(result: dict) -> str | None:
    c = result.get("content")
    if not (isinstance(c, list) and c and c[0].get("text") == "hi"):
        return f"unexpected tools/call result {str(result)[:200]}"
    return None


def check_list(n: int) -> Callable[[dict], str | None]:
    def check(result: dict) -> str | None:
        tools = result.get("tools")
        if not isinstance(tools, list) or len(tools) != n:
            return f"expected {n} tools, got {str(result)[:200]}"
        return None
    return check


def verify(t: Target) -> None:
    """One real request with the exact wrk headers/body; a wrong answer skips the target."""
    try:
        r = httpx.post(t.url, content=t.request.wrk_env()["MCP_BODY"],
                       headers=t.request.headers(), timeout=10)
    except httpx.HTTPError as e:
        t.skipped = f"check request failed: {e!r}"
        return
    ctype = r.headers.get("content-type", "")
    streamed = r.status_code == 200 and ctype.startswith("text/event-stream") and t.streamed
    if r.status_code != 200 or not (ctype.startswith("application/json") or streamed):
        t.skipped = f"check: HTTP {r.status_code} {ctype} {r.text[:200]}"
        return
    if streamed:
        # A stdio backend's answer is always a stream (it may send progress first): the
        # response is its last message.
        data = [line[5:].strip() for line in r.text.splitlines() if line.startswith("data:")]
        msg = json.loads(data[-1]) if data else {}
    else:
        msg = r.json()
    if "result" not in msg:
        t.skipped = f"check: JSON-RPC error {str(msg)[:200]}"
        return
    if t.request.protocol_version == MODERN and msg["result"].get("resultType") != "complete":
        t.skipped = f"check: modern result without resultType 'complete': {str(msg)[:200]}"
        return
    if t.check and (err := t.check(msg["result"])):
        t.skipped = "check: " + err
        return
    if t.x_cache:
        # The first request may have filled the cache; the second shows the steady state.
        try:
            r = httpx.post(t.url, content=t.request.wrk_env()["MCP_BODY"],
                           headers=t.request.headers(), timeout=10)
        except httpx.HTTPError as e:
            t.skipped = f"check (repeat) request failed: {e!r}"
            return
        got = r.headers.get("x-cache", "<absent>")
        if r.status_code != 200 or got != t.x_cache:
            t.skipped = f"check: repeated request: HTTP {r.status_code}, X-Cache {got}, " \
                        f"expected 200 and X-Cache {t.x_cache}"


# --------------------------------------------------------------------------- context


class Context:
    """What a workload function uses to start the things it measures."""

    def __init__(self, args, procs: Procs, tmp: Path) -> None:
        self.args = args
        self.procs = procs
        self.tmp = tmp
        self.nginx_bin = ""
        self._n = 0
        self.gateway_problem: str | None = None   # cached: why the gateway can't run
        self._gateway_checked = False
        self.stats_urls: list[str] = []           # every bench backend of this workload
        self.notes: list[str] = []                # extra lines printed after the tables

    def backend_posts(self) -> int | None:
        """POSTs received so far by all bench backends of this workload (bench backends say
        `{"posts": N}` on /stats, the SDK fixture `{"POST": N, ...}` on /requests)."""
        try:
            total = 0
            for u in self.stats_urls:
                counts = httpx.get(u, timeout=5).json()
                total += counts["posts"] if "posts" in counts else counts.get("POST", 0)
            return total
        except (httpx.HTTPError, ValueError, KeyError):
            return None

    def _cpu(self, role: str) -> list[str]:
        """Command prefix: pin ``role`` to its CPU, and raise priority (same for all roles)."""
        pre: list[str] = []
        if self.args.nice:
            pre = ["nice", "-n", str(self.args.nice)]
        if self.args.no_pin or not shutil.which("taskset") or (os.cpu_count() or 1) < 2:
            return pre
        cpu = {"shared": {"load": "0", "backend": "1", "proxy": "1"},
               "split": {"load": "0", "backend": "0", "proxy": "1"}}[self.args.layout][role]
        return ["taskset", "-c", cpu] + pre

    def _logfile(self, name: str) -> Path:
        self._n += 1
        return self.tmp / f"{self._n:02d}-{name}.log"

    def backend(self, mode: str = "modern", tools: int = 10, ttl_ms: int = 60_000) -> str:
        port = free_port()
        lp = self._logfile(f"backend-{mode}")
        p = self.procs.start(f"backend-{mode}", self._cpu("backend") + [
            PY, str(BENCH / "backend.py"), "--port", str(port), "--mode", mode,
            "--tools", str(tools), "--ttl-ms", str(ttl_ms)], log_path=lp)
        wait_ready(f"http://127.0.0.1:{port}/healthz", p, 15, lp)
        self.stats_urls.append(f"http://127.0.0.1:{port}/stats")
        return f"http://127.0.0.1:{port}/mcp"

    def sdk_legacy_backend(self) -> str:
        """The reference Python SDK's initialize-era server (mcp==1.30.0 FastMCP, stateful,
        JSON answers): `tests/fixtures/servers/legacy_everything.py`, run from the venv that
        `scripts/legacy-venv.sh` makes (created on first use). A legacy backend whose own
        work per call is what a real server spends, beside `backend("legacy")`, which does
        almost none."""
        made = subprocess.run(["bash", str(REPO / "scripts" / "legacy-venv.sh")], capture_output=True,
                              text=True, timeout=900)
        if made.returncode != 0:
            raise RuntimeError(f"scripts/legacy-venv.sh failed: {made.stderr.strip()[-300:]}")
        legacy_python = made.stdout.strip().splitlines()[-1]
        port = free_port()
        lp = self._logfile("backend-sdk-legacy")
        p = self.procs.start("backend-sdk-legacy", self._cpu("backend") + [
            legacy_python, str(REPO / "tests" / "fixtures" / "servers" / "legacy_everything.py"),
            "--port", str(port), "--json"], log_path=lp)
        wait_ready(f"http://127.0.0.1:{port}/requests", p, 30, lp)
        self.stats_urls.append(f"http://127.0.0.1:{port}/requests")
        return f"http://127.0.0.1:{port}/mcp"

    def fleet(self, tools: int = 50, ttl_ms: int = 0) -> Callable[[int], str]:
        """One modern bench backend process answering on every /fleet/<name> path
        (bench/fleet_backend.py); returns ``url(i)`` -> the URL of fleet member i."""
        port = free_port()
        lp = self._logfile("backend-fleet")
        p = self.procs.start("backend-fleet", self._cpu("backend") + [
            PY, str(BENCH / "fleet_backend.py"), "--port", str(port), "--tools", str(tools),
            "--ttl-ms", str(ttl_ms)], log_path=lp)
        wait_ready(f"http://127.0.0.1:{port}/healthz", p, 15, lp)
        self.stats_urls.append(f"http://127.0.0.1:{port}/stats")
        return lambda i: f"http://127.0.0.1:{port}/fleet/{member(i)}"

    def _redis_node(self, name: str, *extra: str) -> int:
        """One redis-server (no persistence) on a free port, on the proxy's CPU: the shared
        Redis is part of the system under test. Returns its port once it answers PING."""
        binary = ensure_tool("redis-server", "redis-server")
        port = free_port()
        lp = self._logfile(name)
        workdir = self.tmp / f"{name}-{port}"
        workdir.mkdir()
        p = self.procs.start(name, self._cpu("proxy") + [
            binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--protected-mode", "no", "--dir", str(workdir), *extra], log_path=lp)
        deadline = time.monotonic() + 15
        while True:
            if p.poll() is not None:
                raise RuntimeError(f"redis-server exited with {p.returncode}:\n{tail(lp)}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return port
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server not answering PING after 15 s:\n{tail(lp)}")
            time.sleep(0.1)

    def redis(self) -> str:
        """A fresh standalone redis-server; returns its redis:// URL."""
        return f"redis://127.0.0.1:{self._redis_node('redis')}/0"

    def redis_cluster(self, masters: int = 3) -> str:
        """A fresh Redis Cluster of `masters` masters (no replicas), all on the proxy's CPU
        like the standalone one; returns its redis+cluster:// URL."""
        ports = [self._redis_node(f"redis-cluster-{i}", "--cluster-enabled", "yes",
                                  "--cluster-config-file", "nodes.conf", "--cluster-port", str(free_port()))
                 for i in range(masters)]
        cli = ensure_tool("redis-cli", "redis-tools")
        created = subprocess.run([cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports), "--cluster-yes"],
                                 capture_output=True, text=True, timeout=60)
        if created.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {created.stdout[-500:]}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = [subprocess.run([cli, "-p", str(p), "cluster", "info"], capture_output=True, text=True,
                                     timeout=10).stdout for p in ports]
            if all("cluster_state:ok" in st for st in states):
                return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports)
            time.sleep(0.2)
        raise RuntimeError("the Redis Cluster did not reach cluster_state:ok in 30 s")

    def nginx(self, backend_url: str, ready_path: str = "/healthz") -> str:
        """nginx in front of `backend_url`; ready when `ready_path` answers 200 through it."""
        if not self.nginx_bin:
            self.nginx_bin = ensure_tool("nginx", "nginx")
        u = httpx.URL(backend_url)
        port = free_port()
        prefix = Path(tempfile.mkdtemp(prefix="nginx-", dir=self.tmp))
        for d in ("logs", "tmp"):
            (prefix / d).mkdir()
        conf = string.Template((BENCH / "nginx.conf.template").read_text()).substitute(
            prefix=prefix, backend_host=u.host, backend_port=u.port,
            listen_host="127.0.0.1", listen_port=port)
        (prefix / "nginx.conf").write_text(conf)
        lp = self._logfile("nginx")
        p = self.procs.start("nginx", self._cpu("proxy") + [
            self.nginx_bin, "-p", str(prefix), "-c", str(prefix / "nginx.conf"),
            "-e", str(prefix / "logs" / "error.log")], log_path=lp)
        wait_ready(f"http://127.0.0.1:{port}{ready_path}", p, 15, prefix / "logs" / "error.log")
        return f"http://127.0.0.1:{port}{u.path}"

    def gateway_unavailable(self) -> str | None:
        """Why the gateway can't be benchmarked (not importable yet), or None."""
        if self.args.gateway_cmd:
            return None
        if not self._gateway_checked:
            self._gateway_checked = True
            try:
                r = subprocess.run([PY, "-m", "gateway", "serve", "--help"], cwd=REPO,
                                   capture_output=True, text=True, timeout=60,
                                   stdin=subprocess.DEVNULL,
                                   env={**os.environ, "PYTHONPATH": str(REPO)})
                if r.returncode != 0:
                    last = (r.stderr.strip().splitlines() or ["?"])[-1]
                    self.gateway_problem = f"gateway not runnable yet ({last[:160]})"
            except subprocess.TimeoutExpired:
                self.gateway_problem = "gateway not runnable yet ('serve --help' timed out)"
        return self.gateway_problem

    def gateway(self, backends: list[dict], extra_yaml: str = "cache: {store: memory}\n",
                launcher: list[str] | None = None, ready_timeout: float = 30) -> str:
        """Start `python -m gateway serve` in front of ``backends`` (dicts: name,url,era,prefix).

        ``launcher`` replaces ``python -m gateway`` (it gets the same ``serve ...`` arguments):
        bench/prefilled_gateway.py uses it.  Raises RuntimeError (the caller marks the target
        skipped) if it can't start."""
        if problem := self.gateway_unavailable():
            raise RuntimeError(problem)
        port = free_port()
        lines = [f"server: {{host: 127.0.0.1, port: {port}, path: /mcp}}", "backends:"]
        for b in backends:
            lines.append("  - " + json.dumps(b))      # JSON is valid YAML flow style
        cfg = self.tmp / f"gateway-{port}.yaml"
        # --gateway-yaml: configuration for this tree's gateways only (never a --compare tree's,
        # which may not know the keys), e.g. the access log under test.
        own = launcher is None and self.args.gateway_yaml
        cfg.write_text("\n".join(lines) + "\n" + extra_yaml + (self.args.gateway_yaml + "\n" if own else ""))
        lp = self._logfile("gateway")
        cmd = launcher or (shlex.split(self.args.gateway_cmd) if self.args.gateway_cmd else
                           [PY, "-m", "gateway"])
        p = self.procs.start("gateway", self._cpu("proxy") + cmd + [
            "serve", "--config", str(cfg),
            "--host", "127.0.0.1", "--port", str(port)], log_path=lp, cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        wait_ready(f"http://127.0.0.1:{port}/healthz", p, ready_timeout, lp)
        return f"http://127.0.0.1:{port}/mcp"

    def gateway_target(self, request: Request, check, backends: list[dict],
                       name: str = "gateway", x_cache: str = "", **kw) -> Target:
        try:
            url = self.gateway(backends, **kw)
        except RuntimeError as e:
            return Target(name, "", request, check, skipped=str(e).splitlines()[0][:200]
                          if str(e) else "gateway failed to start", x_cache=x_cache)
        return Target(name, url, request, check, x_cache=x_cache,
                      made_with=dict(request=request, check=check, backends=backends, name=name, x_cache=x_cache, **kw))

    def compared(self, targets: list[Target]) -> list[Target]:
        """`targets` plus, for every ``--compare NAME=TREE``, each default gateway target again
        as "NAME", started from TREE (``PYTHONPATH=TREE python -P -m gateway``): two versions
        of the code measured against the same backend process, interleaved in one run. A
        fresh backend per run moves a -c1 ratio by several percent by itself (bench/README.md
        "Sixth round"); within one run the difference between trees is what is left."""
        extra: list[Target] = []
        for spec in self.args.compare:
            label, _, tree = spec.partition("=")
            launcher = ["env", f"PYTHONPATH={Path(tree).resolve()}", PY, "-P", "-m", "gateway"]
            for t in targets:
                # Gateways with a launcher of their own (prefilled_gateway.py) are not the tree's.
                if t.made_with is None or t.skipped or t.made_with.get("launcher"):
                    continue
                variant = self.gateway_target(**{**t.made_with, "name": f"{t.name}-{label}", "launcher": launcher})
                variant.connections = t.connections
                extra.append(variant)
        return targets + extra


def member(i: int) -> str:
    """Name of fleet member i (also its URL path and, with ``__``, its tool prefix)."""
    return f"b{i:04d}"


def legacy_session(url: str) -> str:
    """initialize + notifications/initialized with httpx; returns the warm session id."""
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    with httpx.Client(timeout=10) as c:
        r = c.post(url, headers=h, json={
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": LEGACY, "capabilities": {},
                       "clientInfo": {"name": "mcp-gateway-bench", "version": "0"}}})
        r.raise_for_status()
        sid = r.headers["mcp-session-id"]
        version = r.json()["result"]["protocolVersion"]
        h |= {"Mcp-Session-Id": sid, "MCP-Protocol-Version": version}
        r = c.post(url, headers=h, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        if r.status_code != 202:
            raise RuntimeError(f"notifications/initialized -> HTTP {r.status_code}")
    return sid


# --------------------------------------------------------------------------- workloads
# A workload is a small function Context -> list[Target].  The first target named
# "direct" and the one named "nginx" are the baselines for the ratio columns.


def wl_passthrough_call(ctx: Context) -> list[Target]:
    be = ctx.backend("modern", tools=10)
    return [
        Target("direct", be, CALL_ECHO, check_call),
        Target("nginx", ctx.nginx(be), CALL_ECHO, check_call),
        ctx.gateway_target(CALL_ECHO, check_call,
                           [{"name": "bench", "url": be, "era": "modern", "prefix": ""}]),
    ]


def wl_stdio_call(ctx: Context) -> list[Target]:
    """tools/call echo through the gateway to a modern stdio backend (the mcp==2.3.0 test
    fixture), one process vs `instances: 3` (issue 18 item 3). The processes inherit the
    gateway's CPU: this is what choosing among instances costs, not extra cores."""
    fixture = [PY, str(REPO / "tests" / "fixtures" / "servers" / "modern_stdio.py")]
    one = {"name": "bench", "command": fixture, "era": "modern", "prefix": ""}
    targets = [
        ctx.gateway_target(CALL_ECHO, check_call, [one], name="stdio-1"),
        ctx.gateway_target(CALL_ECHO, check_call, [{**one, "instances": 3}], name="stdio-3"),
    ]
    for t in targets:
        t.streamed = True
    return targets


def wl_passthrough_credentials(ctx: Context) -> list[Target]:
    """tools/call pass-through with no backend credentials, with `auth: {type: headers}`, and
    with a cached `oauth_client_credentials` token, against one backend in the same run
    (issue 20: each must cost no more than 3 µs per request over none)."""
    be = ctx.backend("modern", tools=10)
    port = free_port()
    lp = ctx._logfile("token-server")
    p = ctx.procs.start("token-server", [PY, str(BENCH / "token_server.py"), "--port", str(port)], log_path=lp)
    wait_ready(f"http://127.0.0.1:{port}/healthz", p, 15, lp)
    plain = {"name": "bench", "url": be, "era": "modern", "prefix": ""}
    headers = {**plain, "auth": {"type": "headers", "headers": {"x-api-key": "bench-key-" + "k" * 32}}}
    oauth = {**plain, "auth": {"type": "oauth_client_credentials", "token_url": f"http://127.0.0.1:{port}/token",
                               "client_id": "bench", "client_secret": "bench-secret"}}
    return [
        ctx.gateway_target(CALL_ECHO, check_call, [plain], name="no-credentials"),
        ctx.gateway_target(CALL_ECHO, check_call, [headers], name="headers"),
        ctx.gateway_target(CALL_ECHO, check_call, [oauth], name="client-credentials"),
    ]


def governance_yaml(limit_store: str) -> str:
    """20 authorization rules (none of which denies echo; the last one allows it) and 3 rate
    limits high enough never to refuse: what a governed pass-through pays per call."""
    rules = [{"effect": "deny", "names": [f"team{i}_*", f"*_t{i}"], "methods": ["tools/call", "prompts/get"]}
             for i in range(18)]
    rules += [{"effect": "deny", "names": ["*__delete_*"]}, {"effect": "allow", "names": ["echo", "tool_*"]}]
    limits = [{"rate": "1000000/s", "burst": 1000000, "key": ["principal"]},
              {"rate": "1000000/s", "burst": 1000000, "key": ["principal", "name"], "methods": ["tools/call"]},
              {"rate": "1000000/m", "burst": 1000000, "key": ["backend"], "names": ["ech*"]}]
    cache = "cache: {store: memory}\n" if limit_store == "memory" else limit_store
    return (cache + "authorization: " + json.dumps({"default": "deny", "rules": rules}) + "\n"
            + "rate_limits: " + json.dumps(limits) + "\n")


def wl_governance_call(ctx: Context) -> list[Target]:
    """passthrough-call with and without 20 rules and 3 rate limits (memory, then Redis)."""
    be = ctx.backend("modern", tools=10)
    one = [{"name": "bench", "url": be, "era": "modern", "prefix": ""}]
    redis = f"cache: {{store: redis, redis_url: '{ctx.redis()}'}}\n"
    return [
        ctx.gateway_target(CALL_ECHO, check_call, one),
        ctx.gateway_target(CALL_ECHO, check_call, one, name="gateway-governed",
                           extra_yaml=governance_yaml("memory")),
        ctx.gateway_target(CALL_ECHO, check_call, one, name="gateway-governed-redis",
                           extra_yaml=governance_yaml(redis)),
    ]


def wl_tools_list(ctx: Context) -> list[Target]:
    # ttlMs 0: the result is immediately stale, so a spec-following gateway forwards every
    # request (this measures the list pass-through path, not the cache; see cache-hit-*).
    n = 50
    be = ctx.backend("modern", tools=n, ttl_ms=0)
    chk = check_list(n)
    return [
        Target("direct", be, LIST_TOOLS, chk),
        Target("nginx", ctx.nginx(be), LIST_TOOLS, chk),
        ctx.gateway_target(LIST_TOOLS, chk,
                           [{"name": "bench", "url": be, "era": "modern", "prefix": ""}]),
    ]


def _legacy_call(sid: str) -> Request:
    # What an initialized 2025-11-25 client sends: no Mcp-Method/Mcp-Name, no _meta version.
    return Request(body={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                         "params": {"name": "echo", "arguments": {"text": "hi"}}},
                   protocol_version=LEGACY, session_id=sid)


def wl_legacy_direct(ctx: Context) -> list[Target]:
    be = ctx.backend("legacy", tools=10)
    req = _legacy_call(legacy_session(be))
    return [
        Target("direct", be, req, check_call),
        Target("nginx", ctx.nginx(be), req, check_call),
    ]


def wl_modern_to_legacy(ctx: Context) -> list[Target]:
    """Modern client -> gateway -> legacy backend, against a warm legacy session direct."""
    be = ctx.backend("legacy", tools=10)
    req = _legacy_call(legacy_session(be))
    return [
        Target("direct", be, req, check_call),
        Target("nginx", ctx.nginx(be), req, check_call),
        ctx.gateway_target(CALL_ECHO, check_call,
                           [{"name": "bench", "url": be, "era": "legacy", "prefix": ""}]),
    ]


def wl_modern_to_legacy_sdk(ctx: Context) -> list[Target]:
    """modern-to-legacy again, in front of the reference SDK's legacy server (mcp==1.30.0),
    one request at a time (wrk -c1): the latency one call pays for the bridge. Under -c32,
    wrk keeps about one request in flight against this server (its own req/s × p50 ≈ 1),
    while the gateway keeps all 32 there, so a -c32 row would compare unlike loads."""
    be = ctx.sdk_legacy_backend()
    req = _legacy_call(legacy_session(be))
    ctx.notes.append("modern-to-legacy-sdk: every target measured with wrk -c1 (one call at a time).")
    gateway = ctx.gateway_target(CALL_ECHO, check_call, [{"name": "sdk", "url": be, "era": "legacy", "prefix": ""}])
    gateway.connections = 1
    return [
        Target("direct", be, req, check_call, connections=1),
        Target("nginx", ctx.nginx(be, ready_path="/requests"), req, check_call, connections=1),
        gateway,
    ]


def wl_cache_hit_memory(ctx: Context) -> list[Target]:
    """tools/list with ttlMs 60 s: the gateway should answer from its memory cache."""
    n = 50
    be = ctx.backend("modern", tools=n, ttl_ms=60_000)
    chk = check_list(n)
    return [
        Target("direct", be, LIST_TOOLS, chk),
        Target("nginx", ctx.nginx(be), LIST_TOOLS, chk),
        ctx.gateway_target(LIST_TOOLS, chk,
                           [{"name": "bench", "url": be, "era": "modern", "prefix": ""}],
                           name="gateway-cache", x_cache="hit"),
    ]


def wl_tools_list_miss(ctx: Context) -> list[Target]:
    """tools/list that is never served from the cache, with the cache off and on."""
    n = 50
    be = ctx.backend("modern", tools=n, ttl_ms=0)
    chk = check_list(n)
    one = [{"name": "bench", "url": be, "era": "modern", "prefix": ""}]
    return [
        Target("direct", be, LIST_TOOLS, chk),
        Target("nginx", ctx.nginx(be), LIST_TOOLS, chk),
        # store: none -> the cache seam is NoCache: the floor for a forwarded list.
        ctx.gateway_target(LIST_TOOLS, chk, one, name="gateway-nocache", x_cache="bypass",
                           extra_yaml="cache: {store: none}\n"),
        # store: memory, backend says ttlMs 0: key, lookup, fetch, policy says "don't store".
        ctx.gateway_target(LIST_TOOLS, chk, one, name="gateway-miss", x_cache="miss"),
    ]


def wl_cache_hit_redis(ctx: Context) -> list[Target]:
    """tools/list (ttlMs 60 s, public) from the Redis store, with and without the local layer."""
    n = 50
    be = ctx.backend("modern", tools=n, ttl_ms=60_000)
    redis_url = ctx.redis()
    chk = check_list(n)
    one = [{"name": "bench", "url": be, "era": "modern", "prefix": ""}]
    redis = f"cache: {{store: redis, redis_url: '{redis_url}'"
    return [
        Target("direct", be, LIST_TOOLS, chk),
        Target("nginx", ctx.nginx(be), LIST_TOOLS, chk),
        # Default local layer (local_max_entries 1000, local_ttl_ms 1000): a hot key costs
        # one Redis MGET per second per replica; the rest are in-process hits.
        ctx.gateway_target(LIST_TOOLS, chk, one, name="gateway-redis", x_cache="hit",
                           extra_yaml=redis + "}\n"),
        # local_max_entries 0: every hit is an MGET plus decoding the stored value.
        ctx.gateway_target(LIST_TOOLS, chk, one, name="gateway-redis-nolocal", x_cache="hit",
                           extra_yaml=redis + ", local_max_entries: 0}\n"),
    ]


def wl_cache_hit_redis_cluster(ctx: Context) -> list[Target]:
    """tools/list cache hits from a standalone Redis vs a three-master Redis Cluster, local
    layer on and off: what Cluster costs per request (the cluster client, the slot lookup)."""
    n = 50
    be = ctx.backend("modern", tools=n, ttl_ms=60_000)
    shapes = {"standalone": ctx.redis(), "cluster": ctx.redis_cluster(3)}
    chk = check_list(n)
    one = [{"name": "bench", "url": be, "era": "modern", "prefix": ""}]
    targets = [Target("direct", be, LIST_TOOLS, chk)]
    for shape, url in shapes.items():
        redis = f"redis: {{url: '{url}'}}\ncache: {{store: redis"
        targets.append(ctx.gateway_target(LIST_TOOLS, chk, one, name=f"gateway-{shape}", x_cache="hit",
                                          extra_yaml=redis + "}\n"))
        targets.append(ctx.gateway_target(LIST_TOOLS, chk, one, name=f"gateway-{shape}-nolocal", x_cache="hit",
                                          extra_yaml=redis + ", local_max_entries: 0}\n"))
    return targets


def wl_listen_fanout_redis(ctx: Context) -> Report:
    """subscriptions/listen fan-out across two gateway replicas sharing a standalone Redis vs
    a three-master Cluster (bench/redis_fanout.py)."""
    import asyncio

    if problem := ctx.gateway_unavailable():
        return Report(["shape"], failures=[problem])
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import redis_fanout

    n = 200 if ctx.args.smoke else 2_000
    rounds = 3 if ctx.args.smoke else 20
    rep = Report(["shape", "N (2 replicas)", "upstream listens", "every client got every one",
                  "delivery p50 ms", "delivery p99 ms", "to last client p50 ms", "to last client p99 ms"])
    for shape, url in (("standalone", ctx.redis()), ("cluster", ctx.redis_cluster(3))):
        log(f"  listen fan-out over {shape} Redis, N={n}, {rounds} rounds")
        r = asyncio.run(redis_fanout.measure(url, n, rounds))
        rep.raw.append({"shape": shape, **r})
        rep.rows.append([shape, f"{n:,}", str(r["upstreams"]), str(r["complete"]), f"{r['p50_ms']:.1f}",
                         f"{r['p99_ms']:.1f}", f"{r['last_p50_ms']:.1f}", f"{r['last_p99_ms']:.1f}"])
        if r["upstreams"] != 1:
            rep.failures.append(f"{shape}: the backend held {r['upstreams']} upstream listens, expected 1")
        if not r["complete"]:
            rep.failures.append(f"{shape}: some clients missed notifications")
    return rep


def wl_aggregate_10(ctx: Context) -> list[Target]:
    """tools/list fanned out to 10 backends and merged, cache off, against one backend's
    list of the same total size (10 x 5 tools = 50 tools = the tools-list answer)."""
    big = ctx.fleet(tools=50, ttl_ms=0)
    small = ctx.fleet(tools=5, ttl_ms=0)
    off = "cache: {store: none}\n"
    chk = check_list(50)
    return [
        Target("direct", big(0), LIST_TOOLS, chk),
        Target("nginx", ctx.nginx(big(0)), LIST_TOOLS, chk),
        ctx.gateway_target(LIST_TOOLS, chk,
                           [{"name": member(0), "url": big(0), "era": "modern", "prefix": ""}],
                           name="gateway-1x50", extra_yaml=off),
        ctx.gateway_target(LIST_TOOLS, chk,
                           [{"name": member(i), "url": small(i), "era": "modern"}
                            for i in range(10)],
                           name="gateway-10x5", extra_yaml=off),
    ]


ROUTING_SIZES = (1, 10, 100, 1000)
CACHE_SIZES = (1_000, 10_000, 100_000, 1_000_000)
LISTEN_SIZES = (1_000, 10_000)


def learn_all_tools(url: str, expected: int, timeout: float = 120) -> str | None:
    """List every tool through the gateway (following the gateway cursor) until it lists
    ``expected``: each backend's tools are then in the route table's tool index, as in a
    gateway that has served clients for a while.  None, or why it could not."""
    deadline = time.monotonic() + timeout
    seen = -1
    with httpx.Client(timeout=60) as c:
        while time.monotonic() < deadline:
            seen, cursor = 0, None
            for _ in range(10_000):
                req = modern_request("tools/list", {"cursor": cursor} if cursor else {})
                r = c.post(url, content=req.wrk_env()["MCP_BODY"], headers=req.headers())
                if r.status_code != 200:
                    return f"tools/list HTTP {r.status_code}: {r.text[:200]}"
                result = r.json().get("result") or {}
                seen += len(result.get("tools") or [])
                cursor = result.get("nextCursor")
                if not cursor:
                    break
            if seen == expected:
                return None
            time.sleep(0.5)      # discovery runs in the background after start
    return f"the gateway listed {seen} tools, expected {expected}"


def wl_routing_scale(ctx: Context) -> list[Target]:
    """tools/call pass-through with 1 ... 1,000 configured backends of 50 tools each."""
    sizes = (10,) if ctx.args.smoke else ROUTING_SIZES
    url = ctx.fleet(tools=50, ttl_ms=0)
    targets = [Target("direct", url(0), CALL_ECHO, check_call)]
    for n in sizes:
        # Every prefix has the same length, so a name resolves with one dict probe at any
        # size (routing/table.py); the tool called belongs to the last backend configured.
        fleet = [{"name": member(i), "url": url(i), "era": "modern", "prefix": member(i) + "__"}
                 for i in range(n)]
        name = f"{member(n - 1)}__echo"
        req = modern_request("tools/call", {"name": name, "arguments": {"text": "hi"}}, name)
        t = ctx.gateway_target(req, check_call, fleet, name=f"gateway-{n}",
                               ready_timeout=120)
        if not t.skipped and (problem := learn_all_tools(t.url, 50 * n)):
            t.skipped = problem
        targets.append(t)
    return targets


def wl_cache_scale(ctx: Context) -> list[Target]:
    """Cached resources/read hits with the memory store holding 1e3 ... 1e6 entries."""
    sizes = CACHE_SIZES[:1] if ctx.args.smoke else CACHE_SIZES
    url = ctx.fleet(tools=5, ttl_ms=0)
    uri = "bench://fill/0"
    req = modern_request("resources/read", {"uri": uri}, uri)

    def chk(result: dict) -> str | None:
        c = result.get("contents")
        if not (isinstance(c, list) and c and c[0].get("text") == "fill entry 0"):
            return f"expected the pre-filled entry, got {str(result)[:200]}"
        return None

    targets, stats_files = [], {}
    for n in sizes:
        stats_files[n] = ctx.tmp / f"cache-scale-{n}.json"
        yaml = (f"cache: {{store: memory, max_entries: {n + 1000}, max_bytes: {1 << 34}}}\n")
        targets.append(ctx.gateway_target(
            req, chk, [{"name": "bench", "url": url(0), "era": "modern", "prefix": ""}],
            name=f"gateway-{n:.0e}".replace("+0", ""), x_cache="hit", extra_yaml=yaml,
            launcher=[PY, str(BENCH / "prefilled_gateway.py"), "--entries", str(n),
                      "--stats-out", str(stats_files[n])],
            ready_timeout=60 + n / 2_000))
    rows = ["| entries | fill s | bytes/entry (RSS) | in-process hit µs, random key | "
            "in-process hit µs, hot key |", "|---|---|---|---|---|"]
    for n, path in stats_files.items():
        try:
            st = json.loads(path.read_text())
        except (OSError, ValueError):
            rows.append(f"| {n:,} | - | - | - | - |")
            continue
        rows.append(f"| {n:,} | {st['fill_seconds']:.2f} | {st['bytes_per_entry']:.0f} | "
                    f"{st['hit_us_random']:.1f} | {st['hit_us_hot']:.1f} |")
    ctx.notes += ["cache-scale, measured in each gateway process before it served "
                  "(bench/prefilled_gateway.py; StoreCache.fetch without HTTP):", *rows]
    return targets


@dataclass
class Report:
    """A workload measured by its own client instead of wrk: a ready-made table."""
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    raw: list[dict] = field(default_factory=list)

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.header) + " |", "|" + "---|" * len(self.header)]
        lines += ["| " + " | ".join(r) + " |" for r in self.rows]
        return "\n".join(lines)


def wl_listen_fanout(ctx: Context) -> Report:
    """subscriptions/listen fan-out through bench/listen_fanout.py (its own client): N = 1,000,
    10,000 and the largest the descriptor limit allows, through one gateway and through two
    replicas sharing Redis, for this tree and every ``--compare`` tree."""
    import asyncio

    if problem := ctx.gateway_unavailable():
        return Report(["N"], failures=[problem])
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import listen_fanout

    sizes = LISTEN_SIZES[:1] if ctx.args.smoke else (*LISTEN_SIZES, listen_fanout.largest_n())
    if ctx.args.listen_sizes:
        sizes = tuple(listen_fanout.largest_n() if s.strip() == "max" else int(s)
                      for s in ctx.args.listen_sizes.split(",") if s.strip())
    reader_modes = [m.strip() for m in ctx.args.listen_readers.split(",") if m.strip()]
    trees: list[tuple[str, str | None]] = [("gateway", None)]
    for spec in ctx.args.compare:
        label, _, tree = spec.partition("=")
        trees.append((label, tree))
    steerings = [m.strip() for m in ctx.args.listen_steering.split(",") if m.strip()]
    processes = [int(m) for m in ctx.args.listen_reader_processes.split(",") if m.strip()]
    backlogs = [int(m) for m in ctx.args.listen_backlog.split(",") if m.strip()]
    rep = Report(["N", "gateway", "replicas", "loopback steering", "readers", "reader processes",
                  "input backlog", "upstream listens",
                  "every client got every one", "open all (s)",
                  "gateway CPU µs/delivery (user+sys)", "delivery p50 ms", "delivery p99 ms",
                  "to last client p50 ms", "to last client p99 ms", "to first client p50 ms",
                  "gateway write loop p50 / max ms", "gateway RSS per idle stream KB",
                  "readers CPU µs/delivery", "NET_RX softirqs per CPU", "backlog drops per CPU",
                  "TCP retransmits (loss probes, timeouts)"])
    for n in sizes:
        rounds = 3 if ctx.args.smoke else (20 if n <= 10_000 else 10)
        for replicas, steer, backlog, readers, procs in (
                (r, m, b, d, k) for r in ((1,) if ctx.args.smoke else (1, 2)) for m in steerings
                for b in backlogs for d in reader_modes for k in processes):
            for label, tree in trees:  # trees back to back at each size: the same machine state
                what = (f"N={n} {label} x{replicas} steering={steer} backlog={backlog or 'as is'} "
                        f"readers={readers} x{procs}")
                log(f"  listen fan-out {what}, {rounds} rounds")
                r = None
                for attempt in (1, 2):  # once more after a failure: free ports race other tenants
                    try:
                        r = asyncio.run(listen_fanout.measure(n, rounds, replicas=replicas, tree=tree,
                                                              pinned=not ctx.args.no_pin, nice=ctx.args.nice,
                                                              steer=steer, readers=readers,
                                                              reader_processes=procs, backlog=backlog or None))
                        break
                    except Exception as e:  # one failed size must not cost the others their figures
                        log(f"  {what} attempt {attempt} FAILED: {type(e).__name__}: {e}")
                        if attempt == 2:
                            rep.failures.append(f"{what}: {type(e).__name__}: {e}")
                if r is None:
                    continue
                r["gateway"] = label
                rep.raw.append(r)
                loop = ("-" if r["loop_p50_ms"] is None
                        else f"{r['loop_p50_ms']:.1f} / {r['loop_max_ms']:.1f}")
                rep.rows.append([f"{n:,}", label, str(replicas), steer, readers, str(procs), str(r["backlog"]),
                                 str(r["upstreams"]),
                                 str(r["complete"]), f"{r['open_s']:.1f}",
                                 f"{r['cpu_us_per_delivery']:.1f} ({r['user_us_per_delivery']:.1f}+"
                                 f"{r['sys_us_per_delivery']:.1f})",
                                 f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}", f"{r['last_p50_ms']:.1f}",
                                 f"{r['last_p99_ms']:.1f}", f"{r['first_p50_ms']:.1f}", loop,
                                 f"{r['rss_per_stream_kb']:.1f}",
                                 f"{r['reader_us_per_delivery']:.1f}", "/".join(map(str, r["net_rx_per_cpu"])),
                                 "/".join(map(str, r["backlog_drops_per_cpu"])),
                                 "{RetransSegs} ({TCPLossProbes}, {TCPTimeouts})".format_map(r["tcp_retransmits"])])
                if r["upstreams"] != 1:
                    rep.failures.append(f"{what}: the backend held {r['upstreams']} upstream listens, expected 1")
                if not r["complete"]:
                    rep.failures.append(f"{what}: some clients missed notifications or got one that failed the check")
                log(f"  N={n}: " + " ".join(f"{k}={v}" for k, v in zip(rep.header[1:], rep.rows[-1][1:])))
    return rep


WORKLOADS: dict[str, tuple[Callable[[Context], list[Target] | Report], str, bool]] = {
    # name: (function, what it measures, in the default set)
    "passthrough-call": (wl_passthrough_call,
                         "tools/call echo on a modern backend: direct, nginx, gateway", True),
    "stdio-call": (wl_stdio_call,
                   "tools/call echo through the gateway to a modern stdio backend: 1 process vs"
                   " instances: 3", False),
    "passthrough-credentials": (wl_passthrough_credentials,
                                "tools/call pass-through: no backend credentials vs auth headers vs a"
                                " cached client-credentials token", False),
    "governance-call": (wl_governance_call,
                        "tools/call pass-through with no rules vs 20 rules + 3 rate limits (memory,"
                        " Redis)", False),
    "tools-list": (wl_tools_list,
                   "tools/list (50 tools, ttlMs 0 = not cacheable): direct, nginx, gateway", True),
    "legacy-direct": (wl_legacy_direct,
                      "tools/call on a 2025-11-25 backend with a warm session: direct, nginx",
                      True),
    "modern-to-legacy": (wl_modern_to_legacy,
                         "modern tools/call through the gateway to a legacy backend, vs legacy"
                         " direct/nginx", False),
    "modern-to-legacy-sdk": (wl_modern_to_legacy_sdk,
                             "modern-to-legacy in front of the reference SDK's legacy server, wrk -c1"
                             " (mcp==1.30.0, stateful, JSON answers), vs its direct/nginx", False),
    "cache-hit-memory": (wl_cache_hit_memory,
                         "tools/list (ttlMs 60 s, public) answered from the gateway memory cache",
                         False),
    "tools-list-miss": (wl_tools_list_miss,
                        "tools/list never served from the cache: store none vs memory store "
                        "with ttlMs 0", False),
    "cache-hit-redis": (wl_cache_hit_redis,
                        "tools/list from the Redis cache (real redis-server), local layer on "
                        "and off", False),
    "cache-hit-redis-cluster": (wl_cache_hit_redis_cluster,
                                "tools/list cache hits: standalone Redis vs a three-master Cluster, "
                                "local layer on and off", False),
    "listen-fanout-redis": (wl_listen_fanout_redis,
                            "listen fan-out across two replicas: standalone Redis vs a three-master "
                            "Cluster (bench/redis_fanout.py)", False),
    "aggregate-10": (wl_aggregate_10,
                     "tools/list merged from 10 backends x 5 tools vs 1 x 50, cache off", False),
    "routing-scale": (wl_routing_scale,
                      "tools/call pass-through with 1, 10, 100, 1000 backends x 50 tools",
                      False),
    "cache-scale": (wl_cache_scale,
                    "resources/read cache hits with 1e3..1e6 entries in the memory store",
                    False),
    "listen-fanout": (wl_listen_fanout,
                      "subscriptions/listen to N = 1,000, 10,000 and the descriptor limit, one gateway and"
                      " two replicas over Redis: CPU per delivery, delivery p50/p99, RSS per stream"
                      " (bench/listen_fanout.py)", False),
}


# --------------------------------------------------------------------------- measuring


def run_wrk(ctx: Context, t: Target, seconds: int) -> dict:
    wrk = ensure_tool("wrk", "wrk")
    a = ctx.args
    connections = t.connections or a.connections
    argv = ctx._cpu("load") + [wrk, "-t", str(min(a.threads, connections)), "-c", str(connections),
                               "-d", f"{seconds}s", "--timeout", "5s",
                               "-s", str(BENCH / "mcp.lua"), t.url]
    posts0 = ctx.backend_posts()
    before = cpu_times()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL, start_new_session=True,
                         env={**os.environ, **t.request.wrk_env()})
    boost(p.pid, a.nice)
    try:
        out, err = p.communicate(timeout=seconds + 60)
    except BaseException:                          # timeout, Ctrl-C: never leave wrk behind
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=5)
        raise
    r = subprocess.CompletedProcess(argv, p.returncode, out, err)
    busy = cpu_busy(before, cpu_times())
    posts1 = ctx.backend_posts()
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("WRK_JSON ")), None)
    if r.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({r.returncode}): {r.stderr.strip()[:300]} "
                           f"{r.stdout.strip()[-300:]}")
    d = json.loads(line[len("WRK_JSON "):])
    non2xx = 0
    for ln in r.stdout.splitlines():
        if "Non-2xx or 3xx responses:" in ln:
            non2xx = int(ln.split(":")[1])
    secs = d["duration_us"] / 1e6
    e = d["errors"]
    return {"rps": d["requests"] / secs if secs else 0.0,
            "p50_ms": d["latency_us"]["p50"] / 1000, "p90_ms": d["latency_us"]["p90"] / 1000,
            "p99_ms": d["latency_us"]["p99"] / 1000, "requests": d["requests"],
            "non2xx": non2xx,
            "socket_errors": e["connect"] + e["read"] + e["write"] + e["timeout"],
            "cpu_busy_pct": busy,
            # backend POSTs per client request: 1.0 = forwarded each one, ~0 = cache hit
            "fwd": round((posts1 - posts0) / d["requests"], 3)
            if posts0 is not None and posts1 is not None and d["requests"] else None}


def measure(ctx: Context, targets: list[Target]) -> None:
    a = ctx.args
    live = [t for t in targets if not t.skipped]
    for t in live:
        if a.warmup:
            try:
                run_wrk(ctx, t, a.warmup)        # discarded: warms connection pools/caches
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                t.skipped = str(e)[:200]
                log(f"  {t.name}: FAILED in warm-up: {t.skipped}")
    live = [t for t in live if not t.skipped]
    for rep in range(a.reps):
        for t in live:                           # interleaved: A,B,C,A,B,C,...
            if t.skipped:
                continue
            try:
                res = run_wrk(ctx, t, a.duration)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                t.skipped = str(e)[:200]
                log(f"  {t.name}: FAILED: {t.skipped}")
                continue
            t.runs.append(res)
            bad = f" non2xx={res['non2xx']} sockerr={res['socket_errors']}" \
                if res["non2xx"] or res["socket_errors"] else ""
            cpus = " ".join(f"{c}:{v:.0f}%" for c, v in res["cpu_busy_pct"].items())
            log(f"  rep {rep + 1}/{a.reps} {t.name:<14} {res['rps']:>9.0f} req/s "
                f"p50 {res['p50_ms']:.2f} ms p99 {res['p99_ms']:.2f} ms fwd {res['fwd']}  "
                f"busy {cpus}{bad}")


def summarize(t: Target) -> dict | None:
    if not t.runs:
        return None
    med = lambda k: statistics.median(r[k] for r in t.runs)  # noqa: E731
    fwd = [r["fwd"] for r in t.runs if r.get("fwd") is not None]
    return {"rps": med("rps"), "p50_ms": med("p50_ms"), "p99_ms": med("p99_ms"),
            "fwd": statistics.median(fwd) if fwd else None,
            "non2xx": sum(r["non2xx"] for r in t.runs),
            "socket_errors": sum(r["socket_errors"] for r in t.runs)}


def table(workload: str, targets: list[Target]) -> str:
    s = {t.name: summarize(t) for t in targets}
    base = {k: s.get(k) for k in ("direct", "nginx")}

    def ratio(v, b, key):
        return f"{v[key] / b[key]:.2f}" if v and b and b[key] else "-"

    head = ("| workload | target | req/s | p50 ms | p99 ms | rps/direct | rps/nginx | "
            "p50/direct | p50/nginx | p99/direct | p99/nginx | +µs/req vs direct | fwd |")
    rows = [head, "|" + "---|" * 13]
    for t in targets:
        v = s[t.name]
        if v is None:
            rows.append(f"| {workload} | {t.name} | skipped: {t.skipped} |" + " |" * 10)
            continue
        d = base["direct"]
        extra = f"{1e6 / v['rps'] - 1e6 / d['rps']:+.0f}" if d and v["rps"] and d["rps"] else "-"
        warn = " ⚠" if v["non2xx"] or v["socket_errors"] else ""
        rows.append(
            f"| {workload} | {t.name}{warn} | {v['rps']:.0f} | {v['p50_ms']:.2f} | "
            f"{v['p99_ms']:.2f} | {ratio(v, d, 'rps')} | {ratio(v, base['nginx'], 'rps')} | "
            f"{ratio(v, d, 'p50_ms')} | {ratio(v, base['nginx'], 'p50_ms')} | "
            f"{ratio(v, d, 'p99_ms')} | {ratio(v, base['nginx'], 'p99_ms')} | {extra} | "
            f"{'-' if v['fwd'] is None else format(v['fwd'], '.2f')} |")
    return "\n".join(rows)


def machine() -> str:
    model = "?"
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                model = ln.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    wrk_v = subprocess.run([shutil.which("wrk") or "wrk", "-v"], capture_output=True,
                           text=True).stdout.splitlines()[:1] if shutil.which("wrk") else ["?"]
    return (f"nproc={os.cpu_count()} cpu='{model}' loadavg={os.getloadavg()[0]:.2f} "
            f"python={sys.version.split()[0]} wrk='{(wrk_v or ['?'])[0].strip()}'")


# --------------------------------------------------------------------------- main


LOCK_PATH = Path(tempfile.gettempdir()) / "mcp-gateway-bench.lock"


def take_lock(timeout: float):
    """One benchmark at a time on this machine: concurrent runs would measure each other."""
    import fcntl

    f = open(LOCK_PATH, "a+")
    deadline = time.monotonic() + timeout
    waited = False
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            if time.monotonic() >= deadline:
                f.close()
                raise SystemExit(f"another bench run holds {LOCK_PATH}; gave up after "
                                 f"{timeout:.0f}s (--lock-timeout)")
            if not waited:
                log(f"another bench run holds {LOCK_PATH}; waiting up to {timeout:.0f}s")
                waited = True
            time.sleep(1)


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="mcp-gateway benchmark harness",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="short run: 3 reps x 1 s per target")
    p.add_argument("--smoke", action="store_true",
                   help="CI: every workload (default and extra) at its smallest size, 1 rep x "
                        "2 s; exits 1 only if a target fails to start or answers wrongly")
    p.add_argument("--workloads", default="", help="comma list (default: the default set)")
    p.add_argument("--list", action="store_true", help="list workloads and exit")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--duration", type=int, default=10, help="seconds per measured run")
    p.add_argument("--warmup", type=int, default=2, help="seconds of discarded warm-up/target")
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--threads", type=int, default=1, help="wrk threads (all on the load CPU)")
    p.add_argument("--layout", choices=("shared", "split"), default="shared",
                   help="CPU pinning (see module doc)")
    p.add_argument("--no-pin", action="store_true", help="do not use taskset")
    p.add_argument("--listen-steering", default="loopback,rps",
                   help="listen-fanout: loopback packet steering modes, each N in each (bench/listen_fanout.py "
                        "STEERING: loopback = the kernel's default, the readers' TCP input in the gateway's "
                        "write(); rps = that input on the readers' CPU, as over a network; rfs)")
    p.add_argument("--listen-readers", default="paced",
                   help="listen-fanout: the reader processes, each N with each (bench/listen_fanout.py READERS: "
                        "paced = not woken per segment, checks every notification; woken = the first two "
                        "rounds' reader; epoll = paced's check on one raw epoll loop, no asyncio), e.g. "
                        "woken,paced,epoll")
    p.add_argument("--listen-reader-processes", default="2",
                   help="listen-fanout: how many reader processes share the N streams, comma list, each N "
                        "with each (default 2)")
    p.add_argument("--listen-backlog", default="0",
                   help="listen-fanout: net.core.netdev_max_backlog during each measurement, comma list, each "
                        "N with each; 0 = as the machine has it (bench/listen_fanout.py _MAX_BACKLOG says "
                        "why a run may raise it), e.g. 0,30000")
    p.add_argument("--listen-sizes", default="",
                   help="listen-fanout: the N to measure, comma list ('max' = the descriptor limit); default "
                        "1000,10000,max")
    p.add_argument("--nice", type=int, default=-10 if os.geteuid() == 0 else 0,
                   help="niceness for every process under test and wrk (default -10 as root:"
                        " other tenants' CPU hogs then disturb less; same for every target)")
    p.add_argument("--json", type=Path, help="also write raw results here")
    p.add_argument("--lock-timeout", type=float, default=900,
                   help="seconds to wait for another bench run on this machine to finish")
    p.add_argument("--gateway-cmd", default="",
                   help="command for the gateway instead of '<python> -m gateway' (gets "
                        "'serve --config F --host H --port P' appended), e.g. 'mcp-gateway'")
    p.add_argument("--gateway-yaml", default="", metavar="YAML",
                   help="YAML appended to the configuration of this tree's gateways (not --compare trees'), "
                        "e.g. 'observability: {log_format: json, access_log: true}'")
    p.add_argument("--compare", action="append", default=[], metavar="NAME=TREE",
                   help="also measure every gateway target as started from the source tree TREE "
                        "(a directory holding gateway/), named NAME, in the same run; repeatable. "
                        "E.g. --compare base=/tmp/base after 'git archive HEAD gateway | tar -x -C /tmp/base'")
    a = p.parse_args(argv)
    for spec in a.compare:
        name, _, tree = spec.partition("=")
        if not name or not tree or not (Path(tree) / "gateway" / "__init__.py").is_file():
            p.error(f"--compare {spec!r}: expected NAME=TREE, TREE a directory holding gateway/")

    if a.list:
        for name, (fn, desc, default) in WORKLOADS.items():
            print(f"{name:<18} {'default' if default else 'extra  '}  {desc}")
        return 0
    if a.quick:
        a.reps, a.duration, a.warmup = 3, 1, 1
    if a.smoke:
        a.reps, a.duration, a.warmup = 1, 2, 1
    names = [w.strip() for w in a.workloads.split(",") if w.strip()] or \
        [n for n, (_, _, d) in WORKLOADS.items() if d or a.smoke]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        p.error(f"unknown workloads {unknown}; try --list")

    signal.signal(signal.SIGINT, signal.default_int_handler)   # even if started with SIGINT ignored
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGHUP, _raise_exit)
    lock = take_lock(a.lock_timeout)   # held until the process exits  # noqa: F841
    # No load balancer in front of the targets: their SIGTERM should stop them at once, not
    # keep accepting for a drain delay (trees without the setting ignore the variable).
    os.environ.setdefault("MCP_GATEWAY_SERVER__DRAIN_DELAY_SECONDS", "0")
    ensure_tool("wrk", "wrk")
    ensure_tool("nginx", "nginx")
    info = machine()
    log(info)
    idle = idle_check()
    log(f"busy before start: {idle}")
    log(f"layout={a.layout} nice={a.nice} reps={a.reps} duration={a.duration}s warmup={a.warmup}s "
        f"connections={a.connections} threads={a.threads}")

    results: dict[str, list[Target]] = {}
    reports: dict[str, Report] = {}
    notes: dict[str, list[str]] = {}
    failures: list[str] = []     # --smoke: what failed to start or answered wrongly
    procs = Procs(a.nice)
    rc = 0
    with tempfile.TemporaryDirectory(prefix="mcp-bench-") as tmp:
        try:
            for name in names:
                log(f"workload {name}")
                ctx = Context(a, procs, Path(tmp))
                try:
                    made = WORKLOADS[name][0](ctx)
                    if isinstance(made, Report):
                        reports[name] = made
                        failures += [f"{name}: {f}" for f in made.failures]
                        for f in made.failures:
                            log(f"  FAILED: {f}")
                        continue
                    targets = ctx.compared(made)
                    for t in targets:
                        if not t.skipped:
                            verify(t)
                        if t.skipped:
                            log(f"  {t.name}: SKIPPED: {t.skipped}")
                    measure(ctx, targets)
                    results[name] = targets
                    for t in targets:
                        if t.skipped:
                            failures.append(f"{name}/{t.name}: {t.skipped}")
                        elif sum(r["non2xx"] for r in t.runs):
                            failures.append(f"{name}/{t.name}: non-2xx answers while measured")
                except Exception as e:  # one broken workload must not stop the others
                    log(f"workload {name} FAILED: {type(e).__name__}: {e}")
                    failures.append(f"{name}: {type(e).__name__}: {e}")
                    rc = 1
                finally:
                    if ctx.notes:
                        notes[name] = ctx.notes
                    procs.stop_all()
        except KeyboardInterrupt:
            log("interrupted")
            rc = 130
        finally:
            procs.stop_all()

    out = [f"machine: {info} busy-before-start: {idle}",
           f"layout={a.layout} nice={a.nice} reps={a.reps} x {a.duration}s, wrk -t{a.threads} "
           f"-c{a.connections}; medians over reps", ""]
    for i, (name, targets) in enumerate(results.items()):
        tb = table(name, targets)
        out.append(tb if i == 0 else "\n".join(tb.splitlines()[2:]))
    for name, lines in notes.items():
        out += ["", *lines]
    for name, report in reports.items():
        out += ["", f"{name}:", report.markdown()]
    print("\n".join(out))
    if a.json:
        a.json.write_text(json.dumps({
            "machine": info, "args": {k: str(v) for k, v in vars(a).items()},
            "results": {n: [{"target": t.name, "skipped": t.skipped, "runs": t.runs,
                             "median": summarize(t)} for t in ts]
                        for n, ts in results.items()},
            "reports": {n: {"raw": r.raw, "failures": r.failures} for n, r in reports.items()},
            "notes": notes}, indent=2))
    if a.smoke:
        # CI keeps the harness honest about what it runs, never about how fast it ran.
        for f in failures:
            log(f"SMOKE FAILURE: {f}")
        return 1 if failures or rc else 0
    return rc


if __name__ == "__main__":
    sys.exit(main())
