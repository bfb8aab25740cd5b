"""The configured response cache, from `cache:` settings."""

from __future__ import annotations

from gateway.cache import NoCache, ResponseCache
from gateway.cache.entry import Store
from gateway.cache.memory import MemoryStore
from gateway.settings import CacheSettings

# Tag sets (Redis) outlive every entry they index by this margin.
_TAG_MARGIN_MS = 60_000


def build_store(settings: CacheSettings) -> Store:
    if settings.store == "memory":
        return MemoryStore(max_entries=settings.max_entries, max_bytes=settings.max_bytes)
    from gateway.cache.layered import LayeredStore
    from gateway.cache.redis import RedisStore

    longest = max(
        [
            settings.max_ttl_ms,
            settings.negative_ttl_ms,
            *(r.max_ttl_ms for r in settings.rules if r.max_ttl_ms is not None),
        ]
    )
    remote = RedisStore(
        settings.redis_url,
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


def build_cache(settings: CacheSettings) -> ResponseCache:
    if settings.store == "none":
        return NoCache()
    from gateway.cache.service import StoreCache

    return StoreCache(build_store(settings), settings)
