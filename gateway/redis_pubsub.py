"""One Redis channel subscription that lives as long as its task: shared by the cache's
invalidation channel and the subscription hub's event bus, so both survive (and shut down)
the same way.

Redis pub/sub keeps nothing for absent subscribers, so after every reconnect the owner is told
(`on_subscribed(after_loss=True)`) and can resynchronize. A failure in the owner's message
handler is logged and the subscription goes on: one bad message must not silence a replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis

log = logging.getLogger("gateway.redis")

_INITIAL_DELAY = 0.1
_MAX_DELAY = 5.0


async def _maybe_await(value: Any) -> None:
    if inspect.isawaitable(value):
        await value


async def subscribe_forever(
    client: aioredis.Redis,
    channel: str,
    *,
    on_message: Callable[[Any], Awaitable[None] | None],
    on_subscribed: Callable[[bool], Awaitable[None] | None],
    on_error: Callable[[BaseException], None],
) -> None:
    """Run until cancelled. `on_message(data)` gets each message's payload;
    `on_subscribed(after_loss)` runs after each successful (re)subscription; `on_error(exc)`
    reports a lost connection (the caller rate-limits its own warnings and metrics)."""
    delay = _INITIAL_DELAY
    lost = False
    while True:
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe(channel)
            delay = _INITIAL_DELAY
            await _maybe_await(on_subscribed(lost))
            lost = False
            async for message in pubsub.listen():
                if message.get("type") != "message":
                    continue
                try:
                    await _maybe_await(on_message(message.get("data")))
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("handling a message from Redis channel %s failed; dropped", channel)
            raise ConnectionError("subscription ended")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure of the connection means: reconnect later
            lost = True
            on_error(exc)
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()
        # Jittered exponential backoff: replicas that lost Redis together do not reconnect in step.
        await asyncio.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, _MAX_DELAY)


async def close_subscription(listener: asyncio.Task[None] | None, *clients: aioredis.Redis) -> None:
    """Stop the task running `subscribe_forever` (if it was started) and close the owner's
    clients. Never raises: a shutdown goes on whatever state Redis is in."""
    if listener is not None:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await listener
    for client in clients:
        with contextlib.suppress(Exception):
            await client.aclose()
