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

__all__ = ["SubscriptionHub", "build_hub"]


def build_hub(settings: GatewaySettings, table: RouteTable, cache: ResponseCache) -> SubscriptionHub:
    s = settings.subscriptions
    redis = settings.bus_redis()  # its own, else the shared block (GatewaySettings.bus_redis)
    bus: Bus
    if redis is not None:
        from gateway.redis_client.plan import plan_of

        bus = RedisBus(plan_of(redis), prefix=s.redis_key_prefix, lease_seconds=s.lease_seconds)
    else:
        bus = LocalBus(tick_seconds=min(0.25, s.linger_seconds or 0.25))
    return SubscriptionHub(s, table, cache=cache, bus=bus)
