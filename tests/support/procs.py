"""Start real servers (subprocesses) on free loopback ports and stop them for sure."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_SERVERS = ROOT / "tests" / "fixtures" / "servers"
# The specification's official example messages (draft = 2026-07-28), copied unmodified.
SPEC_EXAMPLES = ROOT / "tests" / "fixtures" / "spec_examples"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Sockets bound (never listening) for the whole test run: see refused_url.
_HELD_PORTS: list[socket.socket] = []


def refused_url() -> str:
    """A loopback MCP URL where nothing listens, and nothing will: the port stays bound (without
    `listen()`) by this process for the rest of the run, so connecting is refused, never
    answered by a server that a later test happened to start on a recycled `free_port()`."""
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("127.0.0.1", 0))
    _HELD_PORTS.append(held)
    return f"http://127.0.0.1:{held.getsockname()[1]}/mcp"


def wait_for_port(port: int, timeout: float = 20.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


class Proc:
    """A subprocess listening on a port; `stop()` kills its whole process group."""

    def __init__(self, argv: list[str], port: int, *, env: dict[str, str] | None = None,
                 cwd: Path | None = None, name: str = "proc") -> None:
        self.argv, self.port, self.name = argv, port, name
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.cwd = cwd or ROOT
        self.log = tempfile.NamedTemporaryFile(prefix=f"{name}-", suffix=".log", delete=False)
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 20.0) -> Proc:
        self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        try:
            wait_for_port(self.port, timeout, self.proc)
        except Exception:
            self.stop()
            raise RuntimeError(f"{self.name} did not start: {self.output()[-3000:]}") from None
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(5)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self, timeout: float = 20.0) -> Proc:
        self.stop()
        return self.start(timeout)


def python_server(script: str, *args: str, python: str | None = None, name: str | None = None) -> Proc:
    """A fixture server script from tests/fixtures/servers, run with `--port P`."""
    port = free_port()
    argv = [python or sys.executable, str(FIXTURE_SERVERS / script), "--port", str(port), *args]
    return Proc(argv, port, name=name or script.removesuffix(".py"))


def gateway_process(config_path: Path, port: int | None = None, env: dict[str, str] | None = None,
                    args: tuple[str, ...] = ()) -> Proc:
    """The gateway as its own process (`python -m gateway serve`, plus `args`). No drain delay
    unless `env` sets one: a test's SIGTERM should not wait for load balancers that are not there."""
    port = port or free_port()
    env = {"MCP_GATEWAY_SERVER__DRAIN_DELAY_SECONDS": "0", **(env or {})}
    argv = [sys.executable, "-m", "gateway", "serve", "--config", str(config_path), "--port", str(port), *args]
    return Proc(argv, port, env=env, name="gateway")


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


class RedisServer(Proc):
    """A real redis-server on a free port, without persistence; can be killed and restarted
    on the same port to test outages."""

    def __init__(self) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise RuntimeError("redis-server is not installed (scripts/test.sh installs it)")
        port = free_port()
        super().__init__([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                         port, name="redis")

    @property
    def url(self) -> str:  # type: ignore[override]
        return f"redis://127.0.0.1:{self.port}/0"
