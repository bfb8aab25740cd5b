"""The deployment validators (scripts/deploy-tools.sh: kubernetes-validate, checkov,
hadolint, check-jsonschema + the Compose schema) and kubectl, found or installed once per run;
a test that needs one skips with the reason when it cannot be had."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.procs import ROOT


@functools.cache
def _tools_bin() -> tuple[Path | None, str]:
    found = os.environ.get("MCPGW_DEPLOY_TOOLS_BIN")
    if found and Path(found, "checkov").exists():
        return Path(found), ""
    try:
        done = subprocess.run(["bash", str(ROOT / "scripts" / "deploy-tools.sh")], capture_output=True, text=True,
                              timeout=900, cwd=ROOT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"scripts/deploy-tools.sh failed: {exc}"
    if done.returncode != 0:
        return None, f"scripts/deploy-tools.sh could not install the validators: {done.stderr.strip()[-500:]}"
    return Path(done.stdout.strip()), ""


def tool(name: str) -> Path:
    """The validator's executable (or the venv's share/ file), else skip saying why."""
    bin_dir, why = _tools_bin()
    if bin_dir is None:
        pytest.skip(why)
    path = bin_dir / name if not name.endswith(".json") else bin_dir.parent / "share" / name
    if not path.exists():
        pytest.skip(f"{path} is missing (scripts/deploy-tools.sh)")
    return path


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl is not installed: the manifests cannot be rendered (kubectl kustomize)")
    return found
