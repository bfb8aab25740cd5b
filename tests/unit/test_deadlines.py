"""gateway/deadlines.py: a coarse deadline ends its block with TimeoutError within a tick, leaves
a block that finishes in time alone, and never swallows a cancellation from elsewhere."""

from __future__ import annotations

import asyncio

import pytest

from gateway.deadlines import TICK_SECONDS, within


async def test_a_block_past_its_deadline_ends_with_timeout_error_within_a_tick():
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = within(started + 0.2)
    with pytest.raises(TimeoutError):
        with deadline:
            await asyncio.sleep(5)
    elapsed = loop.time() - started
    assert deadline.expired() and 0.2 <= elapsed < 0.2 + 2 * TICK_SECONDS + 0.05, elapsed


async def test_a_block_that_finishes_in_time_is_left_alone_and_the_task_goes_on():
    loop = asyncio.get_running_loop()
    deadline = within(loop.time() + 0.2)
    with deadline:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)  # no stray cancellation after the block
    assert not deadline.expired()


async def test_a_deadline_already_past_fires_at_the_first_await():
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        with within(loop.time() - 1):
            await asyncio.sleep(1)


async def test_a_cancellation_from_elsewhere_is_not_turned_into_a_timeout():
    loop = asyncio.get_running_loop()

    async def body() -> None:
        with within(loop.time() + 10):
            await asyncio.sleep(10)

    task = asyncio.create_task(body())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_many_deadlines_each_fire_on_their_own():
    loop = asyncio.get_running_loop()
    fired: list[int] = []

    async def body(n: int, seconds: float) -> None:
        try:
            with within(loop.time() + seconds):
                await asyncio.sleep(1)
        except TimeoutError:
            fired.append(n)

    await asyncio.gather(*(body(n, 0.1 if n % 2 else 5) for n in range(20)), return_exceptions=True)
    assert sorted(fired) == list(range(1, 20, 2))
