"""The configured response cache, from `cache:` settings."""

from __future__ import annotations

from gateway.cache import NoCache, ResponseCache
from gateway.cache.entry import Store
from gateway.cache.memory import MemoryStore
from gateway.settings import CacheSettings, RedisSettings, section_redis

# Tag sets (Redis) outlive every entry they index by this margin.
_TAG_MARGIN_MS = 60_000


def redis_of(settings: CacheSettings, shared: RedisSettings | None = None) -> RedisSettings:
    """The cache's Redis: its own block or `redis_url`, else the shared `redis:` block."""
    own = section_redis(settings.redis, settings.redis_url)
    if own is not None:
        return own
    return shared if shared is not None else RedisSettings()


def build_store(settings: CacheSettings, redis: RedisSettings | None = None) -> Store:
    if settings.store == "memory":
        return MemoryStore(max_entries=settings.max_entries, max_bytes=settings.max_bytes)
    from gateway.cache.layered import LayeredStore
    from gateway.cache.redis import RedisStore
    from gateway.redis_client.plan import plan_of

    longest = max(
        [
            settings.max_ttl_ms,
            settings.negative_ttl_ms,
            *(r.max_ttl_ms for r in settings.rules if r.max_ttl_ms is not None),
        ]
    )
    remote = RedisStore(
        plan_of(redis_of(settings, redis)),
        prefix=settings.key_prefix,
        timeout_ms=settings.redis_timeout_ms,
        retry_seconds=settings.redis_retry_seconds,
        compress_above=settings.compress_above_bytes,
        tag_ttl_ms=longest + settings.stale_if_error_ms + _TAG_MARGIN_MS,
    )
    if settings.local_max_entries == 0 or settings.local_ttl_ms == 0:
        return remote
    local = MemoryStore(max_entries=settings.local_max_entries, max_bytes=settings.max_bytes)
    return LayeredStore(remote, local, local_ttl_ms=settings.local_ttl_ms)


def build_cache(settings: CacheSettings, redis: RedisSettings | None = None) -> ResponseCache:
    """`redis`: the shared `redis:` block, used unless the cache names its own."""
    if settings.store == "none":
        return NoCache()
    from gateway.cache.service import StoreCache

    return StoreCache(build_store(settings, redis), settings)
