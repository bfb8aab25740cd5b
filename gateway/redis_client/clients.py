"""redis-py clients for a plan, the same way for every user (the cache, the listen bus, the
cache admin commands; later the rate limiter).

- standalone: `redis.asyncio.Redis` on a TCP host or a unix socket.
- Sentinel: `Sentinel(...).master_for(service_name)`. Its pool asks the Sentinels for the
  master on every new connection, so after a failover the next connection reaches the
  promoted master (and a demoted one answering READONLY is dropped), with no restart.
- Cluster: `RedisCluster` from the seed nodes; it follows MOVED/ASK, re-reads the slot map
  when a node is lost, and a master's promoted replica takes its slots.

Callers choose the timeouts and the retries: the cache wants none (a slow Redis is a bypass,
not a wait), the bus a few.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import RedisClusterException, RedisError

from gateway.redis_client.plan import RedisPlan

AnyRedis = aioredis.Redis | RedisCluster
# Everything a Redis command can fail with. redis-py raises its client-side Cluster errors
# (CROSSSLOT keys, no node for a slot) as RedisClusterException, outside RedisError.
FAILURES: tuple[type[BaseException], ...] = (RedisError, RedisClusterException, OSError)


def brief(exc: BaseException) -> str:
    """An error for one log line: redis-py's Sentinel errors embed the repr of every client
    they tried (kilobytes, credentials already redacted); the first line is what matters."""
    text = str(exc) or type(exc).__name__
    cut = text.find(" : <")  # MasterNotFoundError: "No master found for 'x' : <redis...>"
    text = text[:cut] if cut > 0 else text
    return text if len(text) <= 300 else text[:300] + "…"


# A subscriber waits for messages without a read timeout, so a master that vanishes without
# closing the connection (a host or network lost, not a process) is noticed by TCP keep-alive
# only: probe after 10 s idle, every 5 s, give up after 3 misses (~25 s, not Linux's 2 h).
_KEEPALIVE = {getattr(socket, name): value for name, value in
              (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)) if hasattr(socket, name)}


def _retry(retries: int) -> Retry:
    return Retry(NoBackoff(), 0) if retries <= 0 else Retry(ExponentialBackoff(cap=0.5, base=0.02), retries)


def _tls_options(plan: RedisPlan) -> dict[str, Any]:
    if not plan.tls:
        return {}
    return {"ssl": True, "ssl_ca_certs": plan.ca_file, "ssl_certfile": plan.cert_file,
            "ssl_keyfile": plan.key_file, "ssl_cert_reqs": "required", "ssl_check_hostname": True}


def client_for(plan: RedisPlan, *, timeout: float | None, connect_timeout: float, retries: int = 0,
               keepalive: bool = False) -> AnyRedis:
    """A client for commands (`timeout` per command; None: wait as long as it takes, for a
    subscriber). Nothing connects until the first command."""
    common: dict[str, Any] = {
        "username": plan.username, "password": plan.password,
        "socket_timeout": timeout, "socket_connect_timeout": connect_timeout,
        "socket_keepalive": keepalive, "retry": _retry(retries),
    }
    if keepalive and _KEEPALIVE:
        common["socket_keepalive_options"] = _KEEPALIVE
    if plan.shape == "cluster":
        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in plan.hosts],
            # The slots of a lost master are uncovered until its replica takes over: the
            # client keeps serving the other slots meanwhile instead of refusing them all.
            require_full_coverage=False,
            **common, **_tls_options(plan),
        )
    if plan.shape == "sentinel":
        # Asking the Sentinels is bounded like the rest: redis-py's default retries with
        # backoff of up to seconds per Sentinel would hold a request (and a shutdown) that long.
        sentinel_options: dict[str, Any] = {
            "socket_timeout": connect_timeout, "socket_connect_timeout": connect_timeout, "retry": _retry(0),
            "username": plan.sentinel_username, "password": plan.sentinel_password, **_tls_options(plan),
        }
        sentinel = Sentinel(list(plan.hosts), sentinel_kwargs=sentinel_options, **_tls_options(plan))
        return sentinel.master_for(plan.service_name or "", db=plan.db, **common)
    if plan.unix_path is not None:
        return aioredis.Redis(unix_socket_path=plan.unix_path, db=plan.db, **common)
    (host, port), = plan.hosts
    return aioredis.Redis(host=host, port=port, db=plan.db, **common, **_tls_options(plan))


async def warm_up(client: AnyRedis, timeout: float = 5.0) -> None:
    """Connect before the first request needs it, with more time than a request's budget: on
    Cluster the first command reads the slot map and connects to every master, which can take
    longer than a cache lookup may wait (that lookup would bypass the cache). Concurrent
    commands wait for this discovery rather than start their own. Never raises: a Redis that
    is down is the requests' business (they bypass it)."""
    with contextlib.suppress(*FAILURES, TimeoutError):
        async with asyncio.timeout(timeout):
            if isinstance(client, RedisCluster):
                await client.initialize()
            else:
                await client.ping()


async def publish(client: AnyRedis, channel: str, data: bytes | str) -> int:
    """PUBLISH, or SPUBLISH on Cluster: sharded pub/sub keeps a channel's messages on the shard
    that owns its slot instead of broadcasting every message to every node (Redis 7)."""
    if isinstance(client, RedisCluster):
        return int(await client.spublish(channel, data))
    return int(await client.publish(channel, data))


def slot_tag(*parts: str) -> str:
    """A Redis Cluster hash tag: keys that start with the same `{...}` share one slot, so a
    multi-key command or a script over them works on Cluster (and costs nothing elsewhere)."""
    return "{" + ":".join(parts) + "}"
