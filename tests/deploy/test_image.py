"""The Docker image's recipe: hadolint-clean Dockerfiles, a numeric user, an exec-form
HEALTHCHECK, dependencies pinned by a committed constraints file, and tini as PID 1 reaping
the orphans of stdio backends (run for real: the gateway under tini with a stdio backend that
leaves an orphan behind)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from tests.support.deploy_tools import tool
from tests.support.procs import FIXTURE_SERVERS, ROOT, free_port, wait_for_port

DOCKERFILES = [ROOT / "Dockerfile", ROOT / "deploy" / "compose" / "legacy-backend" / "Dockerfile"]


def final_stage(path: Path) -> list[str]:
    lines = path.read_text().replace("\\\n", " ").splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("FROM "))
    return lines[start:]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_hadolint_finds_nothing(dockerfile):
    done = subprocess.run([str(tool("hadolint")), str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_numeric_user_and_exec_form_healthcheck(dockerfile):
    stage = final_stage(dockerfile)
    users = [line.split()[1] for line in stage if line.startswith("USER ")]
    # runAsNonRoot can only verify a numeric user (else: CreateContainerConfigError).
    assert users == ["10001:10001"]
    healthchecks = [line for line in stage if line.startswith("HEALTHCHECK ")]
    assert len(healthchecks) == 1 and re.search(r"\bCMD \[", healthchecks[0])


def test_tini_is_pid_1_and_forwards_to_the_gateway_alone():
    stage = final_stage(ROOT / "Dockerfile")
    assert 'ENTRYPOINT ["/usr/bin/tini", "--", "mcp-gateway"]' in stage
    assert any("tini" in line and "apt-get install" in line for line in stage)


def test_python_dependencies_install_from_the_committed_constraints():
    build = (ROOT / "Dockerfile").read_text()
    assert re.search(r"pip install [^\n]*--constraint constraints\.txt", build)
    assert "COPY constraints.txt" in build
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"{line!r} is not an exact pin"
            pins[name.lower().replace("_", "-")] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for spec in [*project["dependencies"], *project["optional-dependencies"]["otlp"]]:
        requirement = Requirement(spec)
        name = requirement.name.lower().replace("_", "-")
        assert name in pins, f"{name} is not pinned in constraints.txt (bash scripts/lock.sh)"
        assert requirement.specifier.contains(pins[name], prereleases=True), (name, pins[name], str(requirement))


def children_of(pid: int) -> list[tuple[int, str, str]]:
    """(pid, state, command) of every process whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        state, ppid = stat.rpartition(")")[2].split()[:2]
        if int(ppid) == pid:
            found.append((int(entry.name), state, cmdline))
    return found


def test_tini_reaps_the_orphans_a_stdio_backend_leaves(tmp_path):
    if not Path("/usr/bin/tini").exists():
        pytest.skip("tini is not installed (scripts/test.sh installs the Debian package)")
    # The backend forks a child and its own parent shell exits: the child is orphaned and
    # re-parented to the nearest subreaper. In the image that is tini as PID 1; here, not PID
    # 1, `-s` makes it the subreaper. When the orphan exits, tini must collect it.
    orphan_seconds = 1.5
    command = ["sh", "-c", f"(sleep {orphan_seconds} &) ; exec {sys.executable} {FIXTURE_SERVERS / 'modern_stdio.py'}"]
    config = tmp_path / "gateway.yaml"
    port = free_port()
    config.write_text(yaml.safe_dump({"backends": [{"name": "forks", "command": command, "era": "modern"}]}))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "MCP_GATEWAY_SERVER__DRAIN_DELAY_SECONDS": "0"}
    proc = subprocess.Popen(["/usr/bin/tini", "-s", "--", "mcp-gateway", "serve", "--config", str(config),
                             "--port", str(port)], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, 20, proc)
        deadline = time.monotonic() + 10
        while not any(cmd.startswith("sleep") for _, _, cmd in children_of(proc.pid)):
            assert time.monotonic() < deadline, "the orphan was never re-parented to tini"
            time.sleep(0.05)
        time.sleep(orphan_seconds + 1)
        leftovers = [(pid, state, cmd) for pid, state, cmd in children_of(proc.pid) if cmd.startswith("sleep")
                     or state == "Z"]
        assert leftovers == [], f"not reaped: {leftovers}"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) in (0, 143)
