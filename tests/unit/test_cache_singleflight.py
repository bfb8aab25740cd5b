"""SingleFlight (gateway/cache/singleflight.py), the in-process coalescing under the cache,
when the callers sharing one run go away: a waiting caller that is cancelled (its client
disconnected) leaves the run and the other callers alone, a waiter cancelled at the same
moment as its leader stays cancelled instead of starting the work again, and no finished
run stays behind. (A leader cancelled on its own, with waiters that carry on, is in
tests/unit/test_cache_service.py.)"""

from __future__ import annotations

import asyncio

from gateway.cache.singleflight import SingleFlight


class Work:
    """The shared work: the first run waits for `gate`, later runs answer at once."""

    def __init__(self) -> None:
        self.runs = 0
        self.gate = asyncio.Event()

    async def __call__(self) -> int:
        self.runs += 1
        n = self.runs
        if n == 1:
            await self.gate.wait()
        return n

    async def started(self) -> None:
        while self.runs == 0:
            await asyncio.sleep(0.001)


async def test_a_cancelled_waiter_leaves_the_run_and_the_other_callers_alone():
    flights: SingleFlight[int] = SingleFlight()
    work = Work()
    leader = asyncio.create_task(flights.run("k", work))
    await work.started()
    leaving = asyncio.create_task(flights.run("k", work))
    staying = asyncio.create_task(flights.run("k", work))
    await asyncio.sleep(0.01)
    leaving.cancel()
    await asyncio.wait({leaving}, timeout=10)  # (never waits this long unless it ignored the cancel)
    assert leaving.cancelled()
    assert not leader.done() and len(flights) == 1
    work.gate.set()
    assert await leader == (1, False)
    assert await staying == (1, True)
    assert work.runs == 1 and len(flights) == 0


async def test_a_waiter_cancelled_together_with_its_leader_stays_cancelled():
    # Both callers' clients went away at once: neither may start the work again, and
    # neither may swallow its own cancellation.
    flights: SingleFlight[int] = SingleFlight()
    work = Work()
    leader = asyncio.create_task(flights.run("k", work))
    await work.started()
    waiter = asyncio.create_task(flights.run("k", work))
    await asyncio.sleep(0.01)
    leader.cancel()
    waiter.cancel()
    await asyncio.wait({leader, waiter}, timeout=10)
    assert leader.cancelled() and waiter.cancelled()
    assert work.runs == 1 and len(flights) == 0


async def test_without_adopt_every_waiter_gets_the_leaders_failure():
    flights: SingleFlight[int] = SingleFlight()
    gate = asyncio.Event()
    failure = LookupError("backend answered nonsense")

    async def failing() -> int:
        await gate.wait()
        raise failure

    tasks = [asyncio.create_task(flights.run("k", failing)) for _ in range(3)]
    await asyncio.sleep(0.01)
    gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert results == [failure, failure, failure]
    assert len(flights) == 0
