"""Count the gateway's Python work per request: line events, Python calls and C calls.

A launcher for `python -m gateway`: it starts the gateway as usual and, between SIGUSR1 and
SIGUSR2, counts with `sys.settrace` and `sys.setprofile` what every request executes. The
counts are exact and the same on every run, unlike a timing, so they show what a change to
the hot path did to the work; they do not show what the work costs (bench/README.md
"Seventh round": one-line rewrites that cut lines and added time).

    taskset -c 1 python bench/linecount.py serve --config gw.yaml --port $GP &   # the gateway
    taskset -c 0 wrk -t1 -c1 -d2s -s bench/mcp.lua http://127.0.0.1:$GP/mcp        # warm up
    kill -USR1 $GW_PID
    taskset -c 0 wrk -t1 -c1 -d3s -s bench/mcp.lua http://127.0.0.1:$GP/mcp > wrk.out
    grep -o '"requests":[0-9]*' wrk.out | cut -d: -f2 > linecount.requests
    kill -USR2 $GW_PID

SIGUSR2 writes the report to `linecount.txt` in the gateway's working directory (or to
$MCPGW_LINECOUNT_OUT, read at that moment from the gateway's environment), every count
divided by the number of requests in `linecount.requests` beside it. Tracing slows the
gateway several times over: read counts, never times, from a run under it.
"""

from __future__ import annotations

import collections
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

Key = tuple[str, int, str]
lines: collections.Counter[Key] = collections.Counter()
calls: collections.Counter[Key] = collections.Counter()
c_calls: collections.Counter[str] = collections.Counter()


def _key(frame: FrameType) -> Key:
    code = frame.f_code
    return code.co_filename, code.co_firstlineno, code.co_name


def _line(frame: FrameType, event: str, arg: Any) -> Any:
    if event == "line":
        lines[_key(frame)] += 1
    return _line


def _call(frame: FrameType, event: str, arg: Any) -> Any:
    # A coroutine's every resumption is a "call" event: a call here is an entry, not a new frame.
    calls[_key(frame)] += 1
    return _line


def _c_call(frame: FrameType, event: str, arg: Any) -> None:
    if event == "c_call":
        c_calls[getattr(arg, "__qualname__", repr(arg))] += 1


def start(*_: Any) -> None:
    lines.clear(), calls.clear(), c_calls.clear()
    sys.settrace(_call)
    sys.setprofile(_c_call)


def stop(*_: Any) -> None:
    sys.settrace(None)
    sys.setprofile(None)
    out = Path(os.environ.get("MCPGW_LINECOUNT_OUT", "linecount.txt"))
    n = int((out.parent / "linecount.requests").read_text())
    by_file: collections.Counter[str] = collections.Counter()
    for (filename, _, _), count in lines.items():
        by_file[filename] += count
    report = [f"per request ({n} requests): {sum(lines.values()) / n:.0f} lines, "
              f"{sum(calls.values()) / n:.0f} Python calls, {sum(c_calls.values()) / n:.0f} C calls",
              "", "## lines by file"]
    report += [f"{count / n:8.1f} {filename}" for filename, count in by_file.most_common(40)]
    report += ["", "## lines by function (entries per request)"]
    report += [f"{count / n:8.1f} {calls[key] / n:6.1f}  {key[2]} {key[0]}:{key[1]}"
               for key, count in lines.most_common(80)]
    report += ["", "## C calls"]
    report += [f"{count / n:8.1f} {name}" for name, count in c_calls.most_common(60)]
    out.write_text("\n".join(report) + "\n")


if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    from gateway.cli import main

    raise SystemExit(main())
