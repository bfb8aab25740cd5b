"""backends/concurrency.py: the limit, the bounded queue, the wait, hand-over in order, and no
slot lost when a waiter gives up just as it is handed one."""

from __future__ import annotations

import asyncio

import pytest

from gateway.backends.concurrency import CallLimiter, Slot
from gateway.protocol import jsonrpc as rpc


async def test_past_the_limit_and_the_queue_a_call_is_refused_naming_the_backend():
    limiter = CallLimiter("b", 1, max_queued=0, wait=1)
    await limiter.acquire()
    with pytest.raises(rpc.McpError) as caught:
        await limiter.acquire(3)
    assert caught.value.code == rpc.GATEWAY_OVERLOADED and caught.value.status == 503
    assert caught.value.data == {"limit": "backends[].max_concurrent_calls", "backend": "b"}
    assert caught.value.request_id == 3


async def test_waiters_are_served_in_order_and_a_newcomer_cannot_overtake():
    limiter = CallLimiter("b", 1, max_queued=5, wait=5)
    await limiter.acquire()
    order: list[int] = []

    async def waiter(n: int) -> None:
        await limiter.acquire()
        order.append(n)

    tasks = [asyncio.create_task(waiter(n)) for n in range(3)]
    await asyncio.sleep(0)
    limiter.release()
    await asyncio.sleep(0)
    # A slot freed for the queue is not free for a newcomer.
    late = asyncio.create_task(waiter(99))
    await asyncio.sleep(0)
    for _ in range(3):
        limiter.release()
        await asyncio.sleep(0)
    await asyncio.gather(*tasks, late)
    assert order == [0, 1, 2, 99]
    assert limiter.in_flight == 1


async def test_a_waiter_that_times_out_is_refused_and_leaves_the_queue():
    limiter = CallLimiter("b", 1, max_queued=5, wait=0.05)
    await limiter.acquire()
    with pytest.raises(rpc.McpError):
        await limiter.acquire()
    assert limiter.queued == 0
    limiter.release()
    assert limiter.in_flight == 0


async def test_a_cancelled_waiter_handed_a_slot_passes_it_on():
    limiter = CallLimiter("b", 1, max_queued=5, wait=5)
    await limiter.acquire()
    first = asyncio.create_task(limiter.acquire())
    second = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0)
    limiter.release()  # hands the slot to `first`...
    first.cancel()  # ...which is cancelled before it runs
    await asyncio.gather(first, return_exceptions=True)
    await asyncio.wait_for(second, 1)  # the slot went on to `second`
    assert limiter.in_flight == 1


async def test_a_slot_is_released_once_however_often_it_is_asked():
    limiter = CallLimiter("b", 2, max_queued=0, wait=0)
    await limiter.acquire()
    slot = Slot(limiter)
    slot.release()
    slot.release()
    assert limiter.in_flight == 0
