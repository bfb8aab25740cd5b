"""bench/paired_cpu.py, the harness that turns an instruction-count difference into CPU time:
trees served by processes that stay up and take turns in short rounds (A B B A), against a real
backend (bench/backend.py) on 127.0.0.1."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.support.procs import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from paired_cpu import median_interval  # noqa: E402


def test_the_interval_of_a_median_is_read_from_the_order_statistics() -> None:
    values = [float(v) for v in range(25)]  # n = 25: k = floor(12.5 - 1.96 * 5 / 2) = 7
    assert median_interval(values) == (7.0, 17.0)
    assert median_interval(list(reversed(values))) == (7.0, 17.0)  # sorted first
    assert median_interval([3.0]) == (3.0, 3.0)


def _run(*trees: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(ROOT / "bench/paired_cpu.py"), "--pairs", "2", "--requests", "64", "--warmup", "32"]
    for tree in trees:
        argv += ["--tree", tree]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, cwd=ROOT)


def test_two_configurations_of_one_tree_are_timed_in_turns_and_paired() -> None:
    done = _run(f"plain={ROOT}", f"json={ROOT}:access-log-batched")
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    # A B B A twice: the first tree serves 4 rounds, the other 4, each a CPU time per request.
    for name in ("plain", "json"):
        found = re.search(rf"^{name}: median ([\d.]+) µs CPU per request .*?; (\d+) rounds;", out, re.M)
        assert found, out
        assert float(found.group(1)) > 0 and found.group(2) == "4"
    assert re.search(r"^json − plain: median [+-][\d.]+ µs per request, 95 % interval [+-][\d.]+ … [+-][\d.]+ "
                     r"\(2 blocks\)$", out, re.M), out


def test_a_directory_without_the_gateway_is_refused_by_name(tmp_path) -> None:
    done = _run(f"plain={ROOT}", f"empty={tmp_path}")
    assert done.returncode != 0
    assert "empty" in done.stdout + done.stderr
