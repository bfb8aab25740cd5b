"""A legacy (initialize-era) backend with several endpoints (docs/resilience.md "Several
endpoints"; issue 18 item 3): each backend session is created on an endpoint chosen by power
of two choices on the sessions each holds, stays there, and moves (is re-initialized on
another) only when its endpoint cannot be reached.

Proven by the backends themselves: two real mcp==1.30.0 servers (legacy_everything.py), whose
GET /sessions lists the session ids each minted and the requests per session id it received,
and counts requests carrying an id it never minted (`foreign`). A session whose calls strayed
to the other endpoint would show there as foreign (and be refused with 404).
"""

from __future__ import annotations

import asyncio
import itertools
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import legacy_venv
from tests.support.gateway import running_gateway
from tests.support.listen import eventually
from tests.support.mcp_http import post
from tests.support.procs import Proc
from tests.support.raw_http import full_backlog

# Twelve capability sets a modern client may declare: each makes a legacy session of its own
# (the pool keys sessions by what they declare, translate.session_capabilities).
CAPABILITY_SETS = [
    {**({} if sampling is None else {"sampling": sampling}), **({} if elicitation is None else {"elicitation": elicitation})}
    for sampling, elicitation in itertools.product([None, {}, {"context": {}}, {"tools": {}}], [None, {}, {"url": {}}])
]


@pytest.fixture
def servers() -> Iterator[tuple[Proc, Proc]]:
    first = legacy_venv.legacy_server(name="legacy-endpoint-a").start()
    second = legacy_venv.legacy_server(name="legacy-endpoint-b").start()
    try:
        yield first, second
    finally:
        first.stop()
        second.stop()


async def sessions_of(proc: Proc) -> dict[str, Any]:
    async with httpx.AsyncClient(trust_env=False) as client:
        response = await client.get(f"http://127.0.0.1:{proc.port}/sessions")
        response.raise_for_status()
        return response.json()


async def echo(client: httpx.AsyncClient, url: str, capabilities: dict[str, Any], text: str) -> str | None:
    """The echoed text, or None when the call failed."""
    response = await post(client, url, "tools/call", {"name": "echo", "arguments": {"text": text}},
                          meta={"io.modelcontextprotocol/clientCapabilities": capabilities})
    if response.status_code != 200:
        return None
    from tests.support.mcp_http import sse_messages
    message = (sse_messages(response.text)[-1] if response.headers.get("content-type", "").startswith(
        "text/event-stream") else response.json())
    result = message.get("result")
    return result["content"][0]["text"] if isinstance(result, dict) and not result.get("isError") else None


async def test_legacy_sessions_spread_over_two_endpoints_stay_on_theirs_and_move_when_one_dies(servers) -> None:
    first, second = servers
    # No active checks: the only sessions the servers see are the gateway's pool's. No retries:
    # only a session's move can save a call that meets the dead endpoint.
    settings = {"backends": [{"name": "pair", "urls": [first.url, second.url], "era": "legacy", "retries": 0,
                              "session_pool_size": 32,
                              "health": {"consecutive_failures": 1, "check_interval_seconds": 0}}]}
    async with running_gateway(settings) as gw, httpx.AsyncClient(trust_env=False, timeout=20) as client:
        async def round_of_calls(tag: str) -> list[str | None]:
            return await asyncio.gather(*(echo(client, gw.url, caps, f"{tag}-{n}-{k}")
                                          for n, caps in enumerate(CAPABILITY_SETS) for k in range(4)))

        answers = await round_of_calls("a")
        assert None not in answers
        assert answers == [f"a-{n}-{k}" for n in range(len(CAPABILITY_SETS)) for k in range(4)]

        a, b = await sessions_of(first), await sessions_of(second)
        # Spread: both endpoints hold sessions (13 sessions: 12 sets and the discovery one, which
        # declares nothing like one of them may).
        assert a["minted"] and b["minted"], (a, b)
        assert abs(len(a["minted"]) - len(b["minted"])) <= 1, (a, b)  # power of two choices of two: even
        assert len(a["minted"]) + len(b["minted"]) <= len(CAPABILITY_SETS) + 1
        # Pinned: every request a server saw carried a session it minted itself.
        assert a["foreign"] == 0 and b["foreign"] == 0, (a, b)
        assert set(a["requests"]) <= set(a["minted"]) and set(b["requests"]) <= set(b["minted"])
        calls_seen = sum(a["requests"].values()) + sum(b["requests"].values())
        assert calls_seen >= len(answers)  # each call (and each session's initialized) went to its server

        # The first endpoint dies: its sessions are re-initialized on the second, and every
        # call still works (a call that meets the refused connection is replayed on the
        # session's replacement: it provably never reached the dead server).
        moved = len(a["minted"])
        first.stop(signal.SIGTERM)
        answers = await round_of_calls("b")
        assert None not in answers, answers
        after = await sessions_of(second)
        assert after["foreign"] == 0
        assert len(after["minted"]) >= len(b["minted"]) + moved - 1, (b, after)  # -1: the discovery one may share a set

        async def first_down() -> bool:
            metrics = (await client.get(f"{gw.base}/metrics")).text
            label = f'endpoint="http://127.0.0.1:{first.port}"'
            return any(line.startswith("mcp_gateway_backend_endpoint_up{") and label in line and line.endswith(" 0.0")
                       for line in metrics.splitlines())

        await eventually(first_down, timeout=5)


async def test_each_legacy_endpoint_is_checked_by_a_ping_on_its_own_session_and_returns(servers) -> None:
    first, second = servers
    settings = {"backends": [{"name": "pair", "urls": [first.url, second.url], "era": "legacy",
                              "health": {"check_interval_seconds": 0.2, "check_timeout_seconds": 1,
                                         "failed_checks": 2, "base_ejection_seconds": 60}}]}
    async with running_gateway(settings) as gw, httpx.AsyncClient(trust_env=False, timeout=20) as client:
        for caps in CAPABILITY_SETS[:3]:  # sessions on both endpoints
            assert await echo(client, gw.url, caps, "x") == "x"
        a, b = await sessions_of(first), await sessions_of(second)
        assert a["minted"] and b["minted"]
        await asyncio.sleep(1.0)  # about five rounds of checks
        a2, b2 = await sessions_of(first), await sessions_of(second)
        # The checks pinged the pooled sessions (their request counts grew) and opened none.
        assert (len(a2["minted"]), len(b2["minted"])) == (len(a["minted"]), len(b["minted"]))
        assert sum(a2["requests"].values()) > sum(a["requests"].values())
        assert sum(b2["requests"].values()) > sum(b["requests"].values())

        async def first_is(value: float) -> bool:
            metrics = (await client.get(f"{gw.base}/metrics")).text
            label = f'endpoint="http://127.0.0.1:{first.port}"'
            return any(line.startswith("mcp_gateway_backend_endpoint_up{") and label in line
                       and line.endswith(f" {value}") for line in metrics.splitlines())

        first.stop(signal.SIGTERM)
        await eventually(lambda: first_is(0.0), timeout=5)  # the checks alone eject it
        first.start()
        await eventually(lambda: first_is(1.0), timeout=5)  # and bring it back
        assert (await sessions_of(first))["minted"]  # by an initialize of its own there


async def test_a_session_whose_endpoint_is_down_from_the_start_is_made_on_another(servers) -> None:
    first, _ = servers
    # The first endpoint takes no connection (a full accept queue: each connect hangs until
    # connect_timeout_seconds, so every session below is placed before any of them fails);
    # no retries, and never ejected by these calls: only a new session's move to the other
    # endpoint can answer them.
    with full_backlog() as silent:
        settings = {"backends": [{"name": "pair", "urls": [silent, first.url], "era": "legacy", "retries": 0,
                                  "connect_timeout_seconds": 0.5,
                                  "health": {"consecutive_failures": 100, "check_interval_seconds": 0}}]}
        async with running_gateway(settings, discover=False) as gw, httpx.AsyncClient(trust_env=False,
                                                                                     timeout=20) as client:
            # Six sessions opened at once are placed three and three: three first try the
            # endpoint that takes no connection.
            answers = await asyncio.gather(*(echo(client, gw.url, caps, str(n))
                                             for n, caps in enumerate(CAPABILITY_SETS[:6])))
            assert answers == [str(n) for n in range(6)]
            assert len((await sessions_of(first))["minted"]) == 6
