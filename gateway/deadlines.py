"""Coarse deadlines for the request path: `with within(when):` (inside a coroutine) bounds the
block like `async with asyncio.timeout_at(when):`, without a timer per use.

`asyncio.timeout_at` arms and cancels one loop timer per use; measured on this machine that
is several times the cost of the rest of the call's budget bookkeeping, paid by every
pass-through call for a deadline that almost never fires (bench/README.md "Resilience"). Here a
use is a dict insert and delete; one ticker task per event loop wakes every `TICK_SECONDS`
while deadlines are pending and cancels the tasks whose deadline has passed, which then leave
their block with TimeoutError exactly as with asyncio.timeout (the cancellation is taken back
with `Task.uncancel`, so a cancellation from elsewhere still propagates). A deadline fires up
to one tick late: fine for budgets measured in seconds, wrong for sub-tick ones (use
asyncio.timeout there).
"""

from __future__ import annotations

import asyncio
import weakref
from asyncio import current_task, get_running_loop
from types import TracebackType

TICK_SECONDS = 0.05


class _Wheel:
    __slots__ = ("loop", "pending", "ticker", "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: dict[Deadline, None] = {}
        self.ticker: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.ticker = self.loop.create_task(self._tick(), name="deadlines")

    async def _tick(self) -> None:
        try:
            while self.pending:
                await asyncio.sleep(TICK_SECONDS)
                now = self.loop.time()
                for deadline in [d for d in self.pending if d.when <= now]:
                    self.pending.pop(deadline, None)
                    deadline.fire()
        finally:
            self.ticker = None


_wheels: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Wheel] = weakref.WeakKeyDictionary()
# The last loop's wheel: a process serves from one loop, and the weak mapping costs a lookup.
# (None: no loop yet; a running loop is never None, so the pair is replaced at the first use.)
_last: tuple[asyncio.AbstractEventLoop | None, _Wheel] = (None, None)  # type: ignore[assignment]


def _wheel_of(loop: asyncio.AbstractEventLoop) -> _Wheel:
    global _last
    wheel = _wheels.get(loop)
    if wheel is None:
        wheel = _wheels[loop] = _Wheel(loop)
    _last = (loop, wheel)
    return wheel


class Deadline:
    """One `with` block (in a task) bounded by loop time `when`.

    Entering and leaving are on every pass-through call's path, so they are written for it:
    the fields only `__enter__` needs are set there (not in `__init__` as well), the last
    loop's wheel is probed inline (`_wheel_of` only for another loop), and a pending deadline
    is a dict insert, the ticker started only when none runs."""

    __slots__ = ("when", "_task", "_fired", "_wheel", "_cancelling", "__weakref__")

    def __init__(self, when: float) -> None:
        self.when = when
        self._fired = False

    def expired(self) -> bool:
        return self._fired

    def fire(self) -> None:
        # Only a deadline that was entered fires (the wheel holds entered ones only).
        if self._task is not None and not self._task.done():
            self._fired = True
            self._task.cancel()

    def __enter__(self) -> Deadline:
        loop = get_running_loop()
        last_loop, wheel = _last
        if last_loop is not loop:
            wheel = _wheel_of(loop)
        self._wheel = wheel
        self._task = task = current_task(loop)
        # What was asked of the task before this block: `__exit__` tells our cancellation
        # from another one by it (as asyncio.timeout does).
        self._cancelling = task.cancelling() if task is not None else 0
        if self.when <= loop.time():
            self.fire()
        else:
            wheel.pending[self] = None
            if wheel.ticker is None:
                wheel.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        self._wheel.pending.pop(self, None)
        if self._fired:
            # Take our cancellation back; another one (the client left) still stands.
            if self._task.uncancel() <= self._cancelling and kind is asyncio.CancelledError:  # type: ignore[union-attr]
                raise TimeoutError from exc
        return False


def within(when: float) -> Deadline:
    return Deadline(when)
