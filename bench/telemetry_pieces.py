"""Instructions per call of each piece of the request telemetry, counted by valgrind.

Whole-request instruction counts (bench/instructions.py) resolve about ±20,000 instructions;
a piece called alone is exact to a few. Each piece is called N times in a running event loop
(a loop pass every 32 calls, as under load), under `valgrind --tool=callgrind`, with N = 2,000
and 22,000; the difference over 20,000 calls, minus the loop's own cost ("empty"), is printed.

    python bench/telemetry_pieces.py              # every piece
    python bench/telemetry_pieces.py access-line  # one

Figures: bench/README.md "The ≤ 5 µs budget, measured again".
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PIECES = ("empty", "access-line", "record", "finish", "note-answer")


def _inner(piece: str, n: int) -> None:
    sys.path.insert(0, str(ROOT))
    from gateway.observability.logs import AccessLog
    from gateway.observability.middleware import RequestTelemetry
    from gateway.observability.record import RequestRecord, request_id_from

    scope = {"client": ("127.0.0.1", 5000), "http_version": "1.1"}
    log = AccessLog(log_format="json", fd=os.open(os.devnull, os.O_WRONLY))
    telemetry = RequestTelemetry(None, path="/mcp")  # type: ignore[arg-type]

    def record() -> RequestRecord:
        made = RequestRecord(request_id_from(None), time.perf_counter(), "modern", scope)
        made.method, made.name, made.backend, made.status = "tools/call", "echo", "bench", 200
        return made

    done = record()
    answer = {"jsonrpc": "2.0", "id": 1, "result": {"content": [], "resultType": "complete"}}
    call = {"empty": lambda: None, "access-line": lambda: log.log(done, 0.00123, None), "record": record,
            "finish": lambda: telemetry._finish(done, scope, {}), "note-answer": lambda: done.note_answer(answer)}[piece]

    async def run() -> None:
        for i in range(n):
            call()
            if i % 32 == 31:
                await asyncio.sleep(0)

    asyncio.run(run())


def _count(piece: str, n: int) -> int:
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
                           "--inner", piece, str(n)], capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"{piece}: valgrind run failed:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> int:
    if sys.argv[1:2] == ["--inner"]:
        _inner(sys.argv[2], int(sys.argv[3]))
        return 0
    wanted = sys.argv[1:] or list(PIECES)
    per_call = {piece: (_count(piece, 22_000) - _count(piece, 2_000)) / 20_000 for piece in ("empty", *wanted)}
    for piece in wanted:
        if piece != "empty":
            print(f"{piece}: {per_call[piece] - per_call['empty']:,.0f} instructions per call", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
