"""The mcp==1.30.0 interpreter for legacy fixture servers (scripts/legacy-venv.sh, run once)."""

from __future__ import annotations

import functools
import subprocess

from tests.support.procs import ROOT, Proc, python_server


@functools.cache
def legacy_python() -> str:
    out = subprocess.run([str(ROOT / "scripts" / "legacy-venv.sh")], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def legacy_server(*args: str, name: str) -> Proc:
    """tests/fixtures/servers/legacy_everything.py on a free port (not started)."""
    return python_server("legacy_everything.py", *args, python=legacy_python(), name=name)
