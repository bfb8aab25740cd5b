"""Instructions per call of each piece of the request telemetry, counted by valgrind.

Whole-request instruction counts (bench/instructions.py) resolve about ±2,000 instructions
with `--callers 1`; a piece called alone repeats to ~1 %. Each piece is called N times in a
running event loop (a loop pass every 32 calls, as under load), under `valgrind --tool=callgrind`
with the hash seed fixed, with N = 2,000 and 22,000; the difference over 20,000 calls, minus the
loop's own cost ("empty"), is printed. "telemetry-step" is the whole RequestTelemetry step (JSON
access line on) around an app that answers at once, less that app alone ("bare-app"); the
request's headers are decoded beforehand, as the first policy to ask would.

    python bench/telemetry_pieces.py              # every piece
    python bench/telemetry_pieces.py access-line  # one
    python bench/telemetry_pieces.py --time       # each timed natively instead (ns per call, warm)

Figures: bench/README.md "The ≤ 5 µs budget, counted right".
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from callgrind import call_in_loop, count, timed  # bench/ is on sys.path: these run as scripts

ROOT = Path(__file__).resolve().parents[1]
PIECES = ("empty", "access-line", "record", "finish", "note-answer", "backend-call", "backend-answer",
          "outgoing-headers", "telemetry-step")


def _inner(piece: str, n: int) -> None:
    sys.path.insert(0, str(ROOT))
    from gateway.observability.logs import AccessLog
    from gateway.observability.middleware import RequestTelemetry
    from gateway.observability.record import RequestRecord, new_request_id

    scope = {"client": ("127.0.0.1", 5000), "http_version": "1.1"}
    log = AccessLog(log_format="json", fd=os.open(os.devnull, os.O_WRONLY))
    telemetry = RequestTelemetry(None, path="/mcp")  # type: ignore[arg-type]

    def record() -> RequestRecord:
        made = RequestRecord(new_request_id(), time.perf_counter(), "modern", scope)  # no X-Request-Id sent
        made.method, made.name, made.backend, made.status = "tools/call", "echo", "bench", 200
        return made

    done = record()
    answer = {"jsonrpc": "2.0", "id": 1, "result": {"content": [], "resultType": "complete"}}

    # A backend call, as dispatch.py `_send` measures it: made, answered at once (not a stream).
    from types import SimpleNamespace

    from gateway import asgi
    from gateway.observability import tracing
    from gateway.observability.backend_call import BackendCall, answered
    from gateway.observability.record import CURRENT

    backend = SimpleNamespace(name="bench", settings=SimpleNamespace(command=None, url="http://127.0.0.1:1/mcp"))
    upstream = SimpleNamespace(method="tools/call", version="2026-07-28")

    def backend_call() -> None:  # a traced call's, or a stream's, or a failed one's object
        BackendCall(backend, upstream, "echo").sent(answer)

    def backend_answer() -> None:  # an untraced whole answer, as dispatch.py `_send` counts it
        answered(backend, upstream, "echo", time.perf_counter(), answer)

    CURRENT.set(done)  # what the backends' headers read the request id from

    # The whole telemetry step (RequestTelemetry, JSON access line on) around an app that answers
    # at once; "bare-app" is that app alone, subtracted from "telemetry-step".
    start = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
    body = {"type": "http.response.body", "body": b"{}"}
    raw = [(b"mcp-method", b"tools/call"), (b"mcp-name", b"echo"), (b"mcp-protocol-version", b"2026-07-28")]

    async def app(scope: dict, receive: object, send: object) -> None:
        await send(dict(start))  # type: ignore[operator]
        await send(body)  # type: ignore[operator]

    async def sink(message: dict) -> None:
        pass

    step = RequestTelemetry(app, path="/mcp", access_log=log)  # type: ignore[arg-type]

    def drive(asgi_app: object) -> None:
        request = {"type": "http", "method": "POST", "path": "/mcp", "headers": raw, **scope}
        asgi.request_headers(request)  # decoded by whichever step asks first: not the telemetry's own
        try:
            asgi_app(request, None, sink).send(None)  # type: ignore[operator]
        except StopIteration:
            pass

    shape = log.shape_of(done)  # kept by RequestTelemetry with the record's metric children
    call = {"empty": lambda: None, "access-line": lambda: log.log(done, 0.00123, None, shape), "record": record,
            "finish": lambda: telemetry._finish(done, scope, {}), "note-answer": lambda: done.note_answer(answer),
            "backend-call": backend_call, "backend-answer": backend_answer,
            "outgoing-headers": lambda: tracing.add_outgoing_headers({}),
            "bare-app": lambda: drive(app), "telemetry-step": lambda: drive(step)}[piece]

    call_in_loop(call, n)


def _count(piece: str, n: int) -> int:
    return count(__file__, piece, n)


def main() -> int:
    if sys.argv[1:2] == ["--inner"]:
        _inner(sys.argv[2], int(sys.argv[3]))
        return 0
    clock = "--time" in sys.argv[1:]
    wanted = [a for a in sys.argv[1:] if a != "--time"] or list(PIECES)
    baselines = {"empty", *("bare-app" for piece in wanted if piece == "telemetry-step")}
    if clock:
        per_call = {piece: timed(__file__, piece, 20_000) for piece in (*baselines, *wanted)}
    else:
        per_call = {piece: (_count(piece, 22_000) - _count(piece, 2_000)) / 20_000 for piece in (*baselines, *wanted)}
    for piece in wanted:
        if piece != "empty":
            less = "bare-app" if piece == "telemetry-step" else "empty"
            figure = per_call[piece] - per_call[less]
            print(f"{piece}: {figure:,.0f} {'ns of CPU' if clock else 'instructions'} per call", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
