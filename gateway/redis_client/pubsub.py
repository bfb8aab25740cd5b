"""One Redis channel subscription that lives as long as its task: shared by the cache's
invalidation channel and the subscription hub's event bus, so both survive (and shut down)
the same way.

Redis pub/sub keeps nothing for absent subscribers, so after every reconnect the owner is told
(`on_subscribed(after_loss=True)`) and can resynchronize. A failure in the owner's message
handler is logged and the subscription goes on: one bad message must not silence a replica.

On Redis Cluster the channel is sharded (SSUBSCRIBE, Redis 7): it lives on the master that
owns the channel's slot, found from the cluster client's slot map. When that master is lost,
or the slot moves (the server then sends `sunsubscribe`), the subscription is lost like any
other: the slot map is read again and the new owner subscribed to, after the same backoff.
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
from redis.asyncio.cluster import RedisCluster

from gateway.redis_client.clients import AnyRedis

log = logging.getLogger("gateway.redis")

_INITIAL_DELAY = 0.1
_MAX_DELAY = 5.0


async def _maybe_await(value: Any) -> None:
    if inspect.isawaitable(value):
        await value


async def _open(client: AnyRedis, channel: str) -> tuple[Any, aioredis.Redis | None, str]:
    """A subscribed PubSub, the node client it runs on (Cluster only, closed with it) and the
    message type its deliveries carry."""
    if not isinstance(client, RedisCluster):
        pubsub = client.pubsub()
        await pubsub.subscribe(channel)
        return pubsub, None, "message"
    # A fresh slot map each time: after a failover the old owner is gone.
    await client.nodes_manager.initialize()
    node = client.get_node_from_key(channel)
    pool = aioredis.ConnectionPool(connection_class=node.connection_class,
                                   **{**node.connection_kwargs, "socket_timeout": None})
    node_client = aioredis.Redis(connection_pool=pool)
    pubsub = node_client.pubsub()
    try:
        await pubsub.ssubscribe(channel)
    except BaseException:
        with contextlib.suppress(Exception):
            await pubsub.aclose()
            await node_client.aclose()
        raise
    return pubsub, node_client, "smessage"


async def subscribe_forever(
    client: AnyRedis,
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
        pubsub: Any = None
        node_client: aioredis.Redis | None = None
        try:
            pubsub, node_client, delivery = await _open(client, channel)
            delay = _INITIAL_DELAY
            await _maybe_await(on_subscribed(lost))
            lost = False
            async for message in pubsub.listen():
                kind = message.get("type")
                if kind == "sunsubscribe":
                    raise ConnectionError("the channel's slot moved to another node")
                if kind != delivery:
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
                if pubsub is not None:
                    await pubsub.aclose()
            with contextlib.suppress(Exception):
                if node_client is not None:
                    await node_client.aclose()
        # Jittered exponential backoff: replicas that lost Redis together do not reconnect in step.
        await asyncio.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, _MAX_DELAY)


async def close_subscription(listener: asyncio.Task[None] | None, *clients: AnyRedis) -> None:
    """Stop the task running `subscribe_forever` (if it was started) and close the owner's
    clients. Never raises: a shutdown goes on whatever state Redis is in."""
    if listener is not None:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await listener
    for client in clients:
        with contextlib.suppress(Exception):
            await client.aclose()
