"""Operator actions on the shared cache (`mcp-gateway cache flush`)."""

from __future__ import annotations

from gateway.cache.entry import StoreUnavailable
from gateway.cache.redis import RedisStore
from gateway.cache.factory import redis_of
from gateway.redis_client.plan import plan_of
from gateway.settings import CacheSettings, RedisSettings


class NotFlushable(Exception):
    """The configured store cannot be flushed from outside the gateway processes."""


async def flush(settings: CacheSettings, backend: str | None = None, *, redis: RedisSettings | None = None,
                known_backends: tuple[str, ...] = ()) -> int:
    """Drop every entry (of one backend) from the shared store and tell every replica to drop
    its local copies. Returns how many keys were removed. `redis`: the shared `redis:` block
    (used unless the cache names its own); `known_backends`: the configured fleet."""
    if settings.store != "redis":
        raise NotFlushable(
            f"cache.store is {settings.store!r}: entries live inside each gateway process "
            "(nothing shared to flush); restarting the gateway empties them"
        )
    store = RedisStore(
        plan_of(redis_of(settings, redis)),
        prefix=settings.key_prefix,
        timeout_ms=max(settings.redis_timeout_ms, 5000),
        retry_seconds=0,
        compress_above=settings.compress_above_bytes,
        tag_ttl_ms=1,
    )
    try:
        return await store.flush(backend, known_backends)
    finally:
        await store.aclose()


__all__ = ["NotFlushable", "StoreUnavailable", "flush"]
