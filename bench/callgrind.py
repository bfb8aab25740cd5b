"""What telemetry_pieces.py and governance_pieces.py share: one piece called in a running
event loop (a loop pass every 32 calls, as under load) and its instructions counted by
callgrind in a subprocess of the calling script."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any


def call_in_loop(call: Callable[[], Any], n: int) -> None:
    async def run() -> None:
        for i in range(n):
            call()
            if i % 32 == 31:
                await asyncio.sleep(0)

    asyncio.run(run())


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
