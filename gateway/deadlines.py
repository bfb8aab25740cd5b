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
from types import TracebackType

TICK_SECONDS = 0.05


class _Wheel:
    __slots__ = ("loop", "pending", "ticker", "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: dict[Deadline, None] = {}
        self.ticker: asyncio.Task[None] | None = None

    def add(self, deadline: Deadline) -> None:
        self.pending[deadline] = None
        if self.ticker is None:
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
_last: tuple[asyncio.AbstractEventLoop | None, _Wheel | None] = (None, None)


def _wheel_of(loop: asyncio.AbstractEventLoop) -> _Wheel:
    global _last
    last_loop, wheel = _last
    if last_loop is loop and wheel is not None:
        return wheel
    wheel = _wheels.get(loop)
    if wheel is None:
        wheel = _wheels[loop] = _Wheel(loop)
    _last = (loop, wheel)
    return wheel


class Deadline:
    """One `with` block (in a task) bounded by loop time `when`."""

    __slots__ = ("when", "_task", "_fired", "_wheel", "_cancelling", "__weakref__")

    def __init__(self, when: float) -> None:
        self.when = when
        self._task: asyncio.Task[object] | None = None
        self._fired = False
        self._wheel: _Wheel | None = None
        self._cancelling = 0

    def expired(self) -> bool:
        return self._fired

    def fire(self) -> None:
        if self._task is not None and not self._task.done():
            self._fired = True
            self._task.cancel()

    def __enter__(self) -> Deadline:
        loop = asyncio.get_running_loop()
        wheel = _wheel_of(loop)
        self._task = task = asyncio.current_task(loop)
        self._cancelling = task.cancelling() if task is not None else 0
        self._wheel = wheel
        if self.when <= loop.time():
            self.fire()
        else:
            wheel.add(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        assert self._wheel is not None
        self._wheel.pending.pop(self, None)
        if self._fired and self._task is not None:
            # Take our cancellation back; another one (the client left) still stands.
            if self._task.uncancel() <= self._cancelling and kind is asyncio.CancelledError:
                raise TimeoutError from exc
        return False


def within(when: float) -> Deadline:
    return Deadline(when)
