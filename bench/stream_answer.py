"""CPU per streamed answer through `McpEndpoint`, in process: 20 progress notifications and the
response from a FakeBackend (tests/support/fake_backend.py), no sockets. Measures the endpoint's
stream writer alone, which bench/inprocess.py (JSON answers) does not exercise.

    python bench/stream_answer.py                                  # this tree's endpoint
    python bench/stream_answer.py --endpoint /tmp/endpoint_old.py  # another endpoint.py, same run
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.dispatch import Dispatcher  # noqa: E402
from gateway.routing.table import RouteTable, Target  # noqa: E402
from tests.support.fake_backend import FakeBackend, answers, discover_result, progress, stream  # noqa: E402

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
LIST = {"tools": [{"name": "t", "inputSchema": {"type": "object"}}], "resultType": "complete"}
BODY = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                     "params": {"name": "a__t", "arguments": {}, "_meta": META}})
WIRE = [(b"mcp-protocol-version", b"2026-07-28"), (b"mcp-method", b"tools/call"), (b"mcp-name", b"a__t")]


def load(path: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"endpoint_{abs(hash(path))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def measure(module: Any, requests: int, rounds: int) -> list[float]:
    answer = stream(*[progress(i) for i in range(20)], {"content": [], "resultType": "complete"})
    backend = FakeBackend(answers({"server/discover": discover_result({"tools": {}}), "tools/list": LIST,
                                   "tools/call": answer}), name="a")
    await backend.discover()
    endpoint = module.McpEndpoint(Dispatcher(RouteTable([Target(backend, "a__")])), max_body_bytes=1 << 20,
                                  keepalive_seconds=30)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        pass

    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": WIRE}
    for _ in range(200):
        await endpoint(dict(scope), receive, send)
    per_request = []
    for _ in range(rounds):
        backend.calls.clear()
        started = time.process_time()
        for _ in range(requests):
            await endpoint(dict(scope), receive, send)
        per_request.append((time.process_time() - started) / requests * 1e6)
    return sorted(per_request)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoint", action="append", default=[], help="another endpoint.py to measure, same run")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    paths = [str(Path(__file__).resolve().parent.parent / "gateway" / "endpoint.py"), *args.endpoint]
    for path in paths * 2:  # twice, interleaved: the machine drifts
        result = asyncio.run(measure(load(path), args.requests, args.rounds))
        print(f"{path}: min {result[0]:.1f} µs, median {result[len(result) // 2]:.1f} µs per streamed answer")


if __name__ == "__main__":
    main()
