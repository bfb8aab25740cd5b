"""What telemetry_pieces.py and governance_pieces.py share: one piece called in a running
event loop (a loop pass every 32 calls, as under load) and its instructions counted by
callgrind in a subprocess of the calling script."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any


def call_in_loop(call: Callable[[], Any], n: int) -> None:
    """`call` n times in a running loop; with TIME_REPEATS set (`--time`), timed instead: the
    CPU time per call of the fastest of that many runs of n, printed."""
    repeats = int(os.environ.get("TIME_REPEATS", "0"))

    async def run() -> None:
        best = float("inf")
        for _ in range(max(repeats, 1)):
            started = time.process_time()
            for i in range(n):
                call()
                if i % 32 == 31:
                    await asyncio.sleep(0)
            best = min(best, (time.process_time() - started) / n)
        if repeats:
            print(f"TIMED {best * 1e9:.1f}", flush=True)

    asyncio.run(run())


def timed(script: str, piece: str, n: int, repeats: int = 7) -> float:
    """ns per call of `script --inner piece n`, run natively: the fastest of `repeats` runs (a
    warm loop: its code and data stay in the caches, as they do not in a whole request)."""
    done = subprocess.run([sys.executable, script, "--inner", piece, str(n)], capture_output=True, text=True,
                          check=False, env={**os.environ, "PYTHONHASHSEED": "0", "TIME_REPEATS": str(repeats)})
    found = re.search(r"^TIMED ([\d.]+)$", done.stdout, re.MULTILINE)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"{piece}: timed run failed:\n{done.stderr[-2000:]}")
    return float(found.group(1))


def count(script: str, piece: str, n: int) -> int:
    """Instructions of `script --inner piece n` under callgrind; one hash seed for every run, so
    dict and set probing is the same each time."""
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, script,
                           "--inner", piece, str(n)], capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONHASHSEED": "0"})
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"{piece}: valgrind run failed:\n{done.stderr[-2000:]}")
    return int(found.group(1))
