"""backends/retry.py: what is sent again (never-sent calls whatever the method, idempotent reads
after a failure or a 502/503/504), how often (`retries`), within the budget, and never to an
ejected backend. The backend here is a real `Backend` subclass whose `send` follows a script."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.backends import retry
from gateway.backends.base import Backend, Reply, internal_call
from gateway.backends.errors import mark_never_sent
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.request import Call
from gateway.settings import BackendSettings


class ScriptedBackend(Backend):
    """Answers each send with the next item of `script`: an McpError (raised), an int (a Reply
    with that HTTP status), or "ok"."""

    def __init__(self, script: list[Any], **settings: Any) -> None:
        super().__init__(BackendSettings(name="b", url="http://127.0.0.1:9/mcp", retry_backoff_seconds=0,
                                         **settings))
        self.script = list(script)
        self.sent = 0

    async def send(self, call: Call) -> Reply:
        self.sent += 1
        step = self.script.pop(0)
        if isinstance(step, rpc.McpError):
            raise step
        status = 200 if step == "ok" else step
        return Reply("b", status, message={"jsonrpc": "2.0", "id": call.id, "result": {}})


def refused() -> rpc.McpError:
    return mark_never_sent(rpc.backend_unavailable("b", "cannot connect"))


def reset() -> rpc.McpError:
    return rpc.backend_unavailable("b", "connection closed before the response was complete")


async def test_a_call_that_never_reached_the_backend_is_retried_whatever_its_method():
    backend = ScriptedBackend([refused(), "ok"])
    reply = await retry.send_with_retries(backend, internal_call("tools/call", {"name": "t"}))
    assert reply.status == 200 and backend.sent == 2


async def test_a_tool_call_that_may_have_reached_the_backend_is_not_retried():
    backend = ScriptedBackend([reset(), "ok"])
    with pytest.raises(rpc.McpError):
        await retry.send_with_retries(backend, internal_call("tools/call", {"name": "t"}))
    assert backend.sent == 1


async def test_an_idempotent_read_is_retried_after_a_failure_or_a_5xx_answer():
    backend = ScriptedBackend([reset(), 503, "ok"], retries=2)
    reply = await retry.send_with_retries(backend, internal_call("tools/list"))
    assert reply.status == 200 and backend.sent == 3


async def test_retries_stop_at_the_configured_count_and_every_failure_is_heard():
    heard: list[str] = []
    backend = ScriptedBackend([reset(), reset(), "ok"], retries=1)
    with pytest.raises(rpc.McpError):
        await retry.send_with_retries(backend, internal_call("tools/list"), heard.append)
    assert backend.sent == 2 and len(heard) == 2


async def test_the_budget_bounds_retries_to_a_share_of_calls():
    # No allowance per second: only calls earn retries, 1 per 4 calls at 25 %.
    backend = ScriptedBackend(["ok"] * 7 + [reset(), "ok", reset(), "ok"], retry_budget_percent=25,
                              retry_budget_min_per_second=0)
    for _ in range(7):
        await retry.send_with_retries(backend, internal_call("tools/list"))
    await retry.send_with_retries(backend, internal_call("tools/list"))  # 8 calls: 2 tokens, one spent
    assert backend.sent == 9
    await retry.send_with_retries(backend, internal_call("tools/list"))  # 9 calls, 1.25 tokens left: spent
    assert backend.sent == 11
    backend.script = [reset(), "ok"]
    with pytest.raises(rpc.McpError):
        await retry.send_with_retries(backend, internal_call("tools/list"))  # 0.5 tokens: over budget
    assert backend.sent == 12


async def test_an_ejected_backend_is_not_retried():
    backend = ScriptedBackend([refused(), "ok"], health={"consecutive_failures": 1})
    with pytest.raises(rpc.McpError):
        await retry.send_with_retries(backend, internal_call("tools/list"), backend.health.failed)
    assert backend.sent == 1 and backend.health.ejected


async def test_a_streamed_5xx_is_never_retried():
    backend = ScriptedBackend([503, "ok"])

    async def stream():  # pragma: no cover - never iterated
        yield {}

    async def send(call: Call) -> Reply:
        backend.sent += 1
        return Reply("b", 503, stream=stream())

    backend.send = send  # type: ignore[method-assign]
    reply = await retry.send_with_retries(backend, internal_call("tools/list"))
    assert reply.status == 503 and backend.sent == 1


def test_backoff_is_jittered_exponential_and_capped():
    settings = BackendSettings(name="b", url="http://h/mcp", retry_backoff_seconds=0.1, retry_backoff_max_seconds=0.3)
    for attempt, ceiling in ((0, 0.1), (1, 0.2), (2, 0.3), (5, 0.3)):
        waits = [retry.backoff(settings, attempt) for _ in range(200)]
        assert all(0 <= w <= ceiling for w in waits)
        assert max(waits) > ceiling * 0.7  # jittered across the range, not fixed


def test_a_full_budget_says_so_and_skipping_its_deposit_keeps_the_same_balance():
    # The dispatcher skips `deposit` while `full` (dispatch.py `_send`): over deposits past the
    # bound and withdrawals below it, that must leave every balance as depositing always does.
    always, skipping = retry.RetryBudget(50, 0), retry.RetryBudget(50, 0)
    script = ["deposit"] * 230 + ["withdraw"] * 3 + ["deposit"] * 10 + ["withdraw"] * 150 + ["deposit"] * 400
    fulls = []
    for step in script:
        if step == "deposit":
            always.deposit()
            if not skipping.full:
                skipping.deposit()
        else:
            assert always.withdraw() == skipping.withdraw()
        assert always._balance == skipping._balance
        fulls.append(skipping.full)
        assert skipping.full == (skipping._balance >= retry.RetryBudget._MAX_BALANCE)
    assert True in fulls and False in fulls  # the script reaches the bound and leaves it
