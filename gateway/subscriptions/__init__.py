"""The subscriptions/listen fan-out hub (docs/subscriptions.md).

    hub.py       client streams: plan, attach, acknowledge, fan out, limits, shutdown
    upstream.py  one shared upstream listen per stream key: lease, reconnect, gaps
    poll.py      listen by polling, for backends that cannot (run by the stream's holder)
    bus.py       events between replicas (Redis pub/sub) and the lease election
    filters.py   SubscriptionFilter values: parse, union, intersection, URI matching
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.subscriptions.bus import Bus, LocalBus, RedisBus
from gateway.subscriptions.hub import SubscriptionHub

if TYPE_CHECKING:
    from gateway.cache import ResponseCache
    from gateway.routing.table import RouteTable
    from gateway.settings import GatewaySettings

__all__ = ["SubscriptionHub", "build_hub", "redis_url_of"]


def redis_url_of(settings: GatewaySettings) -> str | None:
    """Redis for the hub: its own setting, else the cache's Redis when the cache uses one."""
    if settings.subscriptions.redis_url:
        return settings.subscriptions.redis_url
    if settings.cache.store == "redis":
        return settings.cache.redis_url
    return None


def build_hub(settings: GatewaySettings, table: RouteTable, cache: ResponseCache) -> SubscriptionHub:
    s = settings.subscriptions
    url = redis_url_of(settings)
    bus: Bus = (RedisBus(url, prefix=s.redis_key_prefix, lease_seconds=s.lease_seconds) if url
                else LocalBus(tick_seconds=min(0.25, s.linger_seconds or 0.25)))
    return SubscriptionHub(s, table, cache=cache, bus=bus)
