"""Instructions per call of each piece of a governed pass-through call, counted by valgrind.

Issue 19's budget (20 rules + 3 memory rate limits ≤ 10 µs over none) is met or missed by a
few thousand instructions, below what a whole-request count resolves (bench/instructions.py,
±20,000). Here each piece runs alone, N times in a running event loop (a loop pass every 32
calls, as under load), under `valgrind --tool=callgrind`, N = 2,000 and 22,000; the difference
over 20,000 calls, minus the loop's own cost ("empty"), is printed. The rules and limits are
bench/run.py governance-call's; the call is bench/inprocess.py's `tools/call` of `echo`, made
by the anonymous caller, with a request record current (as the telemetry step sets it).

    python bench/governance_pieces.py              # every piece
    python bench/governance_pieces.py govern       # one

Pieces: `head` the header-phase decision (`Authorization.admit`), `govern` the dispatcher's
whole governance step (`Dispatcher._govern`: the decision again, the name's backend, the three
limits), and its parts `decide`, `backend-of`, `limits`. Figures: bench/README.md "The
governance budget, counted".
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from callgrind import call_in_loop, count  # bench/ is on sys.path: these run as scripts

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
PIECES = ("empty", "head", "govern", "decide", "backend-of", "limits")


def steps() -> dict[str, Callable[[], object]]:
    """Each piece as a callable, set up once (also for timing them with `timeit`)."""
    sys.path[:0] = [str(ROOT), str(BENCH)]
    import yaml
    from inprocess import request
    from run import governance_yaml

    from gateway import asgi
    from gateway.observability.record import CURRENT, RequestRecord
    from gateway.policies.authorization import Authorization, PrefixResolver
    from gateway.protocol.principal import ANONYMOUS
    from gateway.protocol.request import parse_call
    from gateway.runtime import Runtime
    from gateway.settings import GatewaySettings

    governance = {k: v for k, v in yaml.safe_load(governance_yaml("memory")).items() if k != "cache"}
    settings = GatewaySettings(backends=[{"name": "bench", "url": "http://127.0.0.1:9/mcp", "era": "modern",
                                          "prefix": ""}], cache={"store": "memory"}, **governance)
    runtime = Runtime(settings)
    dispatcher = runtime.dispatcher
    assert runtime.rules is not None and runtime.rate_limits is not None
    rules, limits = runtime.rules, runtime.rate_limits
    head = Authorization(None, rules=rules, resolver=PrefixResolver(settings),  # type: ignore[arg-type]
                         mcp_paths=[settings.server.path])
    body, headers = request("call")
    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": headers, "http_version": "1.1",
             "client": ("127.0.0.1", 5000)}
    call = parse_call(body, asgi.request_headers(scope), ANONYMOUS)
    CURRENT.set(RequestRecord("bench", time.perf_counter(), "modern", scope))

    def checked(value: object) -> None:
        # A piece that refused would be measuring the refusal, not the pass-through.
        if value is not None:
            raise SystemExit(f"{value!r}, not None")

    return {
        "empty": lambda: None,
        "head": lambda: checked(head.admit(scope)),
        "govern": lambda: checked(dispatcher._govern(call)),
        "decide": lambda: rules.decide(ANONYMOUS, "tools/call", name="echo", backend="bench"),
        "backend-of": lambda: dispatcher._backend_of("echo", None, "tools", whole_fleet=True),
        "limits": lambda: checked(limits.check(ANONYMOUS, "tools/call", "echo", "bench")),
    }


def _inner(piece: str, n: int) -> None:
    step = steps()[piece]

    call_in_loop(step, n)


def _count(piece: str, n: int) -> int:
    return count(__file__, piece, n)


def main() -> int:
    if sys.argv[1:2] == ["--inner"]:
        _inner(sys.argv[2], int(sys.argv[3]))
        return 0
    wanted = sys.argv[1:] or list(PIECES)
    unknown = set(wanted) - set(PIECES)
    if unknown:
        raise SystemExit(f"unknown pieces {sorted(unknown)}; pieces: {', '.join(PIECES)}")
    per_call = {piece: (_count(piece, 22_000) - _count(piece, 2_000)) / 20_000 for piece in ("empty", *wanted)}
    for piece in wanted:
        if piece != "empty":
            print(f"{piece}: {per_call[piece] - per_call['empty']:,.0f} instructions per call", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
