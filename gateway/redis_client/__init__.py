"""Redis for every part of the gateway that shares state across replicas, in every shape
(standalone, Sentinel, Cluster), built in one place (docs/scale.md).

    plan.py     `redis:` settings → RedisPlan (pure: the settings model validates with it)
    clients.py  RedisPlan → redis-py clients; PUBLISH/SPUBLISH; Cluster hash tags
    pubsub.py   one channel subscription that reconnects (sharded on Cluster)
"""

from __future__ import annotations

from gateway.redis_client.plan import RedisPlan, plan_of, redacted

__all__ = ["RedisPlan", "plan_of", "redacted"]
