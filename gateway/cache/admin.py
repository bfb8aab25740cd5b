"""Operator actions on the shared cache (`mcp-gateway cache flush`)."""

from __future__ import annotations

from gateway.cache.entry import StoreUnavailable
from gateway.cache.redis import RedisStore
from gateway.settings import CacheSettings


class NotFlushable(Exception):
    """The configured store cannot be flushed from outside the gateway processes."""


async def flush(settings: CacheSettings, backend: str | None = None) -> int:
    """Drop every entry (of one backend) from the shared store and tell every replica to drop
    its local copies. Returns how many keys were removed."""
    if settings.store != "redis":
        raise NotFlushable(
            f"cache.store is {settings.store!r}: entries live inside each gateway process "
            "(nothing shared to flush); restarting the gateway empties them"
        )
    store = RedisStore(
        settings.redis_url,
        prefix=settings.key_prefix,
        timeout_ms=max(settings.redis_timeout_ms, 5000),
        retry_seconds=0,
        compress_above=settings.compress_above_bytes,
        tag_ttl_ms=1,
    )
    try:
        return await store.flush(backend)
    finally:
        await store.aclose()


__all__ = ["NotFlushable", "StoreUnavailable", "flush"]
