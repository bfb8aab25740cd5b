"""What backend credentials add to one pass-through request, in process: the upstream head
built (`ModernHttpBackend._headers`, the cached token read, `http1._serialize`) for no
credentials, `auth: {type: headers}` and a cached `oauth_client_credentials` token. The
difference between the rows is the per-request cost of each kind (issue 20: ≤ 3 µs).

    .venv/bin/python bench/credentials_cost.py [--rounds 40] [--number 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import timeit

from gateway.backends import http1
from gateway.backends.base import internal_call
from gateway.backends.modern import ModernHttpBackend
from gateway.settings import BackendSettings

URL = "http://127.0.0.1:9/mcp"
KINDS = {
    "no-credentials": None,
    "headers": {"type": "headers", "headers": {"x-api-key": "bench-key-" + "k" * 32}},
    "client-credentials": {"type": "oauth_client_credentials", "token_url": "http://127.0.0.1:9/token",
                           "client_id": "bench", "client_secret": "bench-secret"},
}


def backend(auth: dict | None) -> ModernHttpBackend:
    settings = BackendSettings(name="bench", url=URL, era="modern", **({"auth": auth} if auth else {}))
    b = ModernHttpBackend(settings)
    if auth and auth["type"] == "oauth_client_credentials":
        source = b.credentials.source
        source.header = "Bearer bench-token-" + "x" * 600  # a cached token, as after the first fetch
        source._usable_until = source._refresh_at = time.monotonic() + 3600
    return b


def request_head(b: ModernHttpBackend, call, body: bytes) -> bytes:
    headers = b._headers(call)
    if b._dynamic_credentials:
        authorization = b.credentials.cached(call.principal)
        if authorization is not None:
            headers["authorization"] = authorization
    head = b"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:9\r\naccept-encoding: identity\r\n"
    return http1._serialize(head, headers, body)


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--number", type=int, default=20_000)
    args = p.parse_args()
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})
    call = internal_call("tools/call", {"name": "echo", "arguments": {"text": "hi"}}, request_id=1)
    backends = {name: backend(auth) for name, auth in KINDS.items()}
    best = {name: float("inf") for name in KINDS}
    body = call.wire_body()
    order = list(backends)
    for i in range(args.rounds):  # interleaved, order rotated: the machine's load moves under all alike
        for name in order[i % 3:] + order[:i % 3]:
            b = backends[name]
            seconds = timeit.timeit(lambda b=b: request_head(b, call, body), number=args.number)
            best[name] = min(best[name], 1e6 * seconds / args.number)
    base = best["no-credentials"]
    for name, us in best.items():
        print(f"{name:<20} {us:6.2f} µs per request head   {us - base:+.2f} µs")
    asyncio.run(asyncio.sleep(0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
