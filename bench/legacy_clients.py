"""Latency of an initialize-era client's `tools/call` through the gateway, per session mode.

One legacy client (raw HTTP/1.1 keep-alive, one request at a time, `Accept:
application/json` so the answer is one JSON body) calls the bench backend's `echo` tool
through a gateway process. Targets, in the same run:

    memory   sessions in the replica's memory (no secret, no Redis): the default
    fleet    sealed session ids + state in a local redis-server (security.secret + Redis),
             what any-replica legacy sessions cost per request (one Redis round trip)

each started from this tree and, with `--compare NAME=TREE`, from another tree too (memory
mode only: a tree without fleet.py has no fleet mode). Prints min / median / p90 in µs.

    python bench/legacy_clients.py --calls 3000 --compare base=/work/wt/base

Takes the bench lock like run.py. The client is a plain socket, so its own cost is small and
the same for every target.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(BENCH)]

from run import free_port, take_lock  # noqa: E402

PY = sys.executable


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(port)


class Client:
    """HTTP/1.1 keep-alive POSTs on one socket; answers must carry Content-Length."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.sock.sendall(f"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {len(body)}\r\n{head}\r\n"
                          .encode() + body)
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self.sock.recv(65536)
        raw_head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = raw_head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        answer_headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        length = int(answer_headers["content-length"])
        while len(self.buffer) < length:
            self.buffer += self.sock.recv(65536)
        payload, self.buffer = self.buffer[:length], self.buffer[length:]
        return status, answer_headers, payload


def measure(gateway_port: int, calls: int, warmup: int) -> list[float]:
    client = Client(gateway_port)
    base = {"content-type": "application/json", "accept": "application/json"}
    status, headers, _ = client.post(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}).encode(),
        base)
    assert status == 200, status
    session = {**base, "mcp-session-id": headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
    client.post(b'{"jsonrpc":"2.0","method":"notifications/initialized"}', session)
    samples: list[float] = []
    for i in range(warmup + calls):
        body = json.dumps({"jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
                           "params": {"name": "echo", "arguments": {"text": "hi"}}}).encode()
        started = time.perf_counter()
        status, _, payload = client.post(body, session)
        elapsed = time.perf_counter() - started
        assert status == 200 and b'"result"' in payload, payload[:200]
        if i >= warmup:
            samples.append(elapsed * 1e6)
    return samples


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3, help="targets are measured in turn, this many times")
    p.add_argument("--compare", action="append", default=[], metavar="NAME=TREE")
    a = p.parse_args()
    redis_binary = shutil.which("redis-server")
    procs: list[subprocess.Popen] = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-legacy-"))
    with take_lock(600):
        try:
            backend_port = free_port()
            procs.append(subprocess.Popen([PY, str(BENCH / "backend.py"), "--port", str(backend_port)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_port(backend_port, procs[-1])
            targets: list[tuple[str, Path, dict]] = [("memory", REPO, {})]
            for spec in a.compare:
                name, tree = spec.split("=", 1)
                targets.append((f"{name} memory", Path(tree).resolve(), {}))
            if redis_binary:
                redis_port = free_port()
                procs.append(subprocess.Popen([redis_binary, "--port", str(redis_port), "--save", "",
                                               "--appendonly", "no"], stdout=subprocess.DEVNULL))
                wait_port(redis_port, procs[-1])
                targets.append(("fleet", REPO, {
                    "cache": {"store": "redis", "redis_url": f"redis://127.0.0.1:{redis_port}/0"},
                    "security": {"secret": "bench-secret"}}))
            ports = []
            for i, (name, tree, extra) in enumerate(targets):
                port = free_port()
                config = tmp / f"gw{i}.yaml"
                config.write_text(yaml.safe_dump({
                    "server": {"host": "127.0.0.1", "port": port},
                    "backends": [{"name": "bench", "url": f"http://127.0.0.1:{backend_port}/mcp", "era": "modern"}],
                    "observability": {"log_level": "warning"}, **extra}))
                procs.append(subprocess.Popen([PY, "-P", "-m", "gateway", "serve", "--config", str(config)],
                                              env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                wait_port(port, procs[-1])
                ports.append(port)
            results: dict[str, list[float]] = {name: [] for name, _, _ in targets}
            for _ in range(a.rounds):
                for (name, _, _), port in zip(targets, ports):
                    results[name] += measure(port, a.calls, a.warmup)
            print(f"{'target':<16} {'min µs':>8} {'median µs':>10} {'p90 µs':>8}   ({a.rounds} x {a.calls} calls)")
            for name, samples in results.items():
                samples.sort()
                print(f"{name:<16} {samples[0]:8.0f} {statistics.median(samples):10.0f} "
                      f"{samples[int(len(samples) * 0.9)]:8.0f}")
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()


if __name__ == "__main__":
    main()
