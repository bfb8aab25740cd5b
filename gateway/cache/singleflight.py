"""In-process request coalescing: concurrent misses for one key run the work once.

The first caller (the leader) runs the work in its own task, so cancelling it (its client went
away) still cancels the upstream request. Callers that arrive meanwhile wait for the leader's
outcome; if the leader is cancelled they run the work themselves rather than fail. A failure
is not re-raised as the leader's own exception object: each waiter raises what `adopt` makes of
it (the cache gives every waiter an error carrying its own JSON-RPC id).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    def __init__(self) -> None:
        self._flights: dict[str, asyncio.Future[T]] = {}

    def __len__(self) -> int:
        return len(self._flights)

    async def run(
        self,
        key: str,
        work: Callable[[], Awaitable[T]],
        adopt: Callable[[BaseException], BaseException] | None = None,
    ) -> tuple[T, bool]:
        """The work's result, and whether it came from another caller's run. When another
        caller's run failed, raises `adopt(its exception)` (the same object without `adopt`)."""
        while True:
            flight = self._flights.get(key)
            if flight is None:
                return await self._lead(key, work), False
            try:
                return await asyncio.shield(flight), True
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if flight.cancelled() and (task is None or not task.cancelling()):
                    continue  # the leader was cancelled, not us: try again
                raise
            except Exception as exc:
                own = exc if adopt is None else adopt(exc)
                if own is exc:
                    raise
                raise own from exc

    async def _lead(self, key: str, work: Callable[[], Awaitable[T]]) -> T:
        flight: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._flights[key] = flight
        try:
            result = await work()
        except asyncio.CancelledError:
            flight.cancel()
            raise
        except BaseException as exc:
            flight.set_exception(exc)
            flight.exception()  # retrieved: no "exception never retrieved" noise when nobody waited
            raise
        else:
            flight.set_result(result)
            return result
        finally:
            if self._flights.get(key) is flight:
                del self._flights[key]
