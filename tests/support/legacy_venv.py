"""The legacy (mcp==1.30.0) fixture servers, run from tests.

mcp 1.30 cannot share the gateway's venv (mcp 2.x), so its servers run under the interpreter
of ${MCPGW_CACHE_DIR:-<repo>/.cache}/venv-legacy, made once by scripts/legacy-venv.sh
(idempotent; the first call on a fresh machine installs mcp==1.30.0 + uvicorn there).

    proc = legacy_server("--stateless", "--json", name="legacy-json").start()   # legacy_everything.py
    proc = legacy_server(script="legacy_conformance.py", name="legacy-conf").start()
    ... proc.url ...; proc.stop()

For `--stdio`, spawn `[legacy_python(), str(FIXTURE_SERVERS / "legacy_everything.py"), "--stdio"]`.
"""

from __future__ import annotations

import functools
import os
import subprocess

from tests.support.procs import ROOT, Proc, python_server


@functools.cache
def legacy_python() -> str:
    """Path of the mcp==1.30.0 venv's python (created by scripts/legacy-venv.sh if needed)."""
    out = subprocess.run(["bash", str(ROOT / "scripts" / "legacy-venv.sh")], check=True, capture_output=True,
                         text=True)
    python = out.stdout.strip().splitlines()[-1]
    if not os.access(python, os.X_OK):
        raise RuntimeError(f"legacy-venv.sh printed {python!r}, which is not an executable")
    return python


def legacy_server(*args: str, script: str = "legacy_everything.py", name: str | None = None) -> Proc:
    """A legacy fixture server (tests/fixtures/servers/<script>) on a free port, not started;
    extra `args` go to the script (e.g. "--stateless", "--json", "--no-event-store")."""
    return python_server(script, *args, python=legacy_python(), name=name)
