"""How often: the `rate_limits:` section (docs/governance.md).

Each limit is a GCRA (the generic cell rate algorithm, a token bucket kept as one number: the
"theoretical arrival time" of the next request): `rate: 20/s` lets one request through every
50 ms on average, `burst` that many at once. A limit applies to the calls its `methods`,
`names` (globs, as in the authorization rules) and `backends` match, and counts per value of
its `key`: the principal, the name, the backend, the method, a claim, or a combination.

Where the counts live: in this process (`LocalBuckets`), or in Redis when the cache is
(`cache.store: redis`), so that every replica draws from the same buckets. In Redis each
bucket is one key, updated by one Lua script that reads Redis's own clock (so replicas need no
synchronized clocks) and decides atomically; every limit a request meets goes in one pipeline,
one round trip. Keys are hash-tagged per bucket (`{…}`), so each script touches one slot and
the limiter works on Redis Cluster, with buckets spread over the slots; there a request's
scripts run side by side, each on its slot's master (redis-py's cluster pipeline refuses
EVALSHA), still one round trip of wall time. Keys hold a hash of
the bucket's identity, never a principal or a tool name in clear.

Redis failing (down, slow past `cache.redis_timeout_ms`): the local buckets take over for
`cache.redis_retry_seconds` before Redis is tried again, with a warning and the metric
`mcp_gateway_rate_limit_fallbacks_total`. The limit then holds per replica: never
unlimited, and never a failed request.

The check runs in the dispatcher (`Dispatcher.dispatch`), the one place every request reaches
whatever its path: modern and initialize-era clients, the HTTP+SSE transport and views alike,
each counted once. Over a limit: HTTP 429 with `Retry-After` (RFC 6585 §4) and a JSON-RPC
error (-31004, `gateway_overloaded`) whose data names the limit and the wait in ms.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import re
import time
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from prometheus_client import Counter

from gateway.observability.record import note_rate_limit
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.methods import METHODS
from gateway.protocol.principal import ANONYMOUS, Principal

if TYPE_CHECKING:
    from gateway.settings import GatewaySettings, RateLimit

log = logging.getLogger("gateway.ratelimit")

_PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*([smh])\s*$")
# Buckets one replica keeps in memory; past it, buckets whose debt is paid go first.
_MAX_LOCAL_BUCKETS = 100_000
_WARN_EVERY_SECONDS = 10.0
_MEMO_ENTRIES = 4096

RATE_LIMITED = Counter("mcp_gateway_rate_limited_total", "Requests refused with 429 by a rate limit.", ["limit"])
RATE_LIMIT_FALLBACKS = Counter(
    "mcp_gateway_rate_limit_fallbacks_total",
    "Rate limit checks decided by this replica's local buckets because Redis failed.")


def parse_rate(rate: str) -> tuple[float, float]:
    """"20/s" → (20, 1.0): requests, per seconds."""
    match = _RATE.match(rate)
    if match is None:
        raise ValueError(f"{rate!r} is not a rate like '20/s', '100/m' or '1000/h'")
    count = float(match.group(1))
    if count <= 0:
        raise ValueError(f"{rate!r}: the rate must be above 0")
    return count, _PERIODS[match.group(2)]


@dataclass(frozen=True, slots=True)
class Limit:
    label: str
    # Seconds between two requests at the sustained rate; `burst` of them may come at once.
    interval: float
    burst: int
    key: tuple[str, ...]
    methods: frozenset[str] | None
    names: re.Pattern[str] | None
    backends: frozenset[str] | None

    @property
    def reads_caller(self) -> bool:
        """Whether the bucket depends on who calls (the principal, a claim), not only on the
        request's target."""
        return any(part == "principal" or part.startswith("claim:") for part in self.key)

    def applies(self, method: str, name: str | None, backend: str | None) -> bool:
        if self.methods is not None and method not in self.methods:
            return False
        if self.backends is not None and backend not in self.backends:
            return False
        return self.names is None or (name is not None and self.names.match(name) is not None)

    def bucket(self, principal: Principal, method: str, name: str | None, backend: str | None) -> tuple[Any, ...]:
        """The identity of the bucket this request draws from: (limit, key values...)."""
        if self.key == ("principal",):  # the usual key, without the loop
            return (self.label, principal.key)
        parts: list[Any] = [self.label]
        for part in self.key:
            if part == "principal":
                parts.append(principal.key)
            elif part == "name":
                parts.append(name)
            elif part == "backend":
                parts.append(backend)
            elif part == "method":
                parts.append(method)
            else:
                value = principal.claims.get(part[len("claim:"):])
                parts.append(value if isinstance(value, (str, int, float, bool)) or value is None
                             else orjson.dumps(value, option=orjson.OPT_SORT_KEYS))
        return tuple(parts)


def bucket_hash(bucket: tuple[Any, ...]) -> str:
    """A bucket's identity as a Redis key part: a hash, so no principal or name is in clear."""
    return hashlib.blake2b(orjson.dumps(bucket, default=str), digest_size=12).hexdigest()


def compile_limit(index: int, limit: RateLimit) -> Limit:
    from gateway.policies.authorization import compile_globs

    count, period = parse_rate(limit.rate)
    return Limit(
        label=limit.id or f"rate_limits.{index}",
        interval=period / count,
        burst=limit.burst if limit.burst is not None else max(1, math.ceil(count)),
        key=limit.key,
        methods=frozenset(limit.methods) if limit.methods is not None else None,
        names=compile_globs(limit.names) if limit.names is not None else None,
        backends=frozenset(limit.backends) if limit.backends is not None else None,
    )


_SLACK_SECONDS = 1e-9


@dataclass(frozen=True, slots=True)
class LimitPlan:
    """The limits one target (method, name, backend) meets, worked out once for every caller
    (`RateLimits.plan`): what a request still does is one GCRA step per limit."""

    # The limits that apply, in configured order (noted on the request's record).
    limits: tuple[Limit, ...]
    # Per limit: its bucket when the target alone decides it (a key of name, backend, method:
    # built once here, not per request; else None: `Limit.bucket` per request), and its GCRA
    # interval and tolerance ((burst - 1) × interval), for the in-memory step.
    draws: tuple[tuple[Limit, tuple[Any, ...] | None, float, float], ...]


class LocalBuckets:
    """GCRA buckets in this process: bucket → theoretical arrival time (monotonic seconds)."""

    def __init__(self, max_buckets: int = _MAX_LOCAL_BUCKETS, clock: Any = time.monotonic) -> None:
        # Read and written by `take`, and by `RateLimits.check_plan`'s copy of its step.
        self.tats: dict[Any, float] = {}
        self.max_buckets = max_buckets
        self._clock = clock

    def now(self) -> float:
        return self._clock()

    def take(self, bucket: Any, interval: float, burst: int, now: float | None = None) -> float:
        """Take one request from `bucket`: 0 if it may pass, else the seconds to wait."""
        if now is None:
            now = self._clock()
        tat = self.tats.get(bucket, now)
        if tat < now:
            tat = now
        # Compared with a nanosecond of slack: in floats, `tat + interval - burst * interval
        # - now` lands a hair above 0 for about one clock value in 150 where it is 0 in exact
        # arithmetic, and refused a fresh bucket's first call with "retry in 1 ms".
        wait = (tat - now) - (burst - 1) * interval
        if wait > _SLACK_SECONDS:
            return wait
        if len(self.tats) >= self.max_buckets and bucket not in self.tats:
            self.make_room(now)
        self.tats[bucket] = tat + interval
        return 0.0

    def make_room(self, now: float) -> None:
        """Below the bound again: buckets whose debt is paid go first, then the oldest."""
        paid = [b for b, t in self.tats.items() if t <= now]
        for b in paid:
            del self.tats[b]
        while len(self.tats) >= self.max_buckets:
            del self.tats[next(iter(self.tats))]

    def __len__(self) -> int:
        return len(self.tats)


class SharedBuckets(Protocol):
    """Buckets every replica shares. `take` takes one request from each bucket, in one round
    trip, and answers the wait in seconds per bucket (0: passed); raises on any failure."""

    async def take(self, requests: list[tuple[Any, float, int]]) -> list[float]: ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


# KEYS[1] the bucket; ARGV: interval µs, burst. Redis's clock, so replicas need not agree on
# time; '%.0f' because Lua's own number formatting would round a µs timestamp (%.14g).
_GCRA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local new_tat = tat + interval
local wait = new_tat - burst * interval - now
if wait > 0 then return wait end
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', math.ceil((new_tat - now) / 1000) + 1)
return 0
"""


class RedisBuckets:
    """`SharedBuckets` in Redis: one GCRA script per bucket, all of a request's in one
    pipeline. The seam to the shared Redis client is the `client` argument (anything with
    redis-py's asyncio `register_script` and `pipeline`)."""

    def __init__(self, client: Any, *, prefix: str, timeout_seconds: float) -> None:
        self.client = client
        self.prefix = prefix
        self.timeout = timeout_seconds
        self._script = client.register_script(_GCRA)
        from redis.asyncio.cluster import RedisCluster
        from redis.exceptions import NoScriptError

        self._no_script = NoScriptError
        # redis-py's ClusterPipeline blocks EVALSHA (a pipeline's keys may span slots): on
        # Cluster each bucket's script goes on its own, concurrently, to its slot's master.
        self._on_cluster = isinstance(client, RedisCluster)
        self._warming: asyncio.Task[None] | None = None

    @classmethod
    def from_url(cls, url: str, *, prefix: str, timeout_seconds: float) -> RedisBuckets:
        from gateway.redis_client.clients import client_for
        from gateway.redis_client.plan import plan_of
        from gateway.settings import RedisSettings

        client = client_for(plan_of(RedisSettings(url=url)), timeout=timeout_seconds, connect_timeout=timeout_seconds)
        return cls(client, prefix=prefix, timeout_seconds=timeout_seconds)

    def key(self, bucket: Any) -> str:
        # The hash tag is the bucket: one slot per bucket on Cluster, buckets spread over slots.
        ident = bucket if isinstance(bucket, str) else bucket_hash(bucket)
        return f"{self.prefix}:rl:{{{ident}}}"

    async def take(self, requests: list[tuple[Any, float, int]]) -> list[float]:
        async with asyncio.timeout(self.timeout):
            if len(requests) == 1:
                bucket, interval, burst = requests[0]
                waits = [await self._script(keys=[self.key(bucket)], args=[round(interval * 1e6), burst])]
            elif self._on_cluster:
                # The Script object loads the script on NOSCRIPT (Redis restarted, a
                # replica promoted) and retries, per bucket.
                waits = await asyncio.gather(*(
                    self._script(keys=[self.key(bucket)], args=[round(interval * 1e6), burst])
                    for bucket, interval, burst in requests))
            else:
                # EVALSHA straight into the pipeline: redis-py's Script in a pipeline would ask
                # SCRIPT EXISTS first on every execute (a second round trip).
                pipe = self.client.pipeline(transaction=False)
                for bucket, interval, burst in requests:
                    pipe.evalsha(self._script.sha, 1, self.key(bucket), round(interval * 1e6), burst)
                try:
                    waits = await pipe.execute()
                except self._no_script:
                    await self.client.script_load(_GCRA)  # Redis restarted or flushed its scripts
                    return await self.take(requests)
        return [int(w) / 1e6 for w in waits]

    async def start(self) -> None:
        # Connect (on Cluster: read the slot map) before the first request: a burst of first
        # requests on a cold RedisCluster client fails some with "Connection closed by server"
        # while the client replaces its start-up nodes, and they would fall back to the
        # local buckets.
        from gateway.redis_client.clients import warm_up

        self._warming = asyncio.create_task(warm_up(self.client), name="rate-limits-redis-warm-up")

    async def aclose(self) -> None:
        if self._warming is not None and not self._warming.done():
            self._warming.cancel()
        await self.client.aclose()


class RateLimits:
    """The compiled `rate_limits` section and the buckets it draws from."""

    def __init__(self, limits: tuple[Limit, ...], *, shared: SharedBuckets | None = None,
                 retry_seconds: float = 1.0, local: LocalBuckets | None = None) -> None:
        self.limits = limits
        for limit in limits:  # each limit's series exists before its first refusal (rate())
            RATE_LIMITED.labels(limit.label)
        self.shared = shared
        self.local = local if local is not None else LocalBuckets()  # an empty one is falsy (__len__)
        self.retry_seconds = retry_seconds
        self._shared_down_until = float("-inf")
        self._warned_at = float("-inf")
        # (method, name, backend) → its `LimitPlan`: caller-independent, memoized (bounded:
        # names come from clients).
        self._memo: dict[tuple[str, str | None, str | None], LimitPlan] = {}

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> RateLimits | None:
        if not settings.rate_limits:
            return None
        limits = tuple(compile_limit(i, limit) for i, limit in enumerate(settings.rate_limits))
        cache = settings.cache
        shared = None
        if cache.store == "redis":
            # The cache's Redis, through the shared client module (standalone, Sentinel,
            # Cluster: docs/scale.md); the bucket keys are hash-tagged for Cluster.
            from gateway.cache.factory import redis_of
            from gateway.redis_client.clients import client_for
            from gateway.redis_client.plan import plan_of

            timeout = cache.redis_timeout_ms / 1000
            client = client_for(plan_of(redis_of(cache, settings.redis)), timeout=timeout, connect_timeout=timeout)
            shared = RedisBuckets(client, prefix=cache.key_prefix, timeout_seconds=timeout)
        return cls(limits, shared=shared, retry_seconds=cache.redis_retry_seconds)

    def matching(self, method: str, name: str | None, backend: str | None) -> tuple[Limit, ...]:
        return self.plan(method, name, backend).limits

    def plan(self, method: str, name: str | None, backend: str | None) -> LimitPlan:
        """The limits this target meets and, where the target alone decides it, each one's
        bucket. Memoized: the limits never change while the process runs."""
        key = (method, name, backend)
        found = self._memo.get(key)
        if found is None:
            limits = tuple(limit for limit in self.limits if limit.applies(method, name, backend))
            draws = tuple((limit, None if limit.reads_caller else limit.bucket(ANONYMOUS, method, name, backend),
                           limit.interval, (limit.burst - 1) * limit.interval) for limit in limits)
            found = LimitPlan(limits, draws)
            if len(self._memo) >= _MEMO_ENTRIES:
                self._memo.clear()
            self._memo[key] = found
        return found

    def check(self, principal: Principal, method: str, name: str | None,
              backend: str | None) -> Awaitable[None] | None:
        """Raise the 429 refusal when the request is over any limit it meets. Decided at
        once (None) from the local buckets; a coroutine to await when Redis decides."""
        return self.check_plan(self.plan(method, name, backend), principal, method, name, backend)

    def check_plan(self, plan: LimitPlan, principal: Principal, method: str, name: str | None,
                   backend: str | None) -> Awaitable[None] | None:
        """`check`, with the target's plan (`plan(method, name, backend)`) already at hand."""
        if not plan.limits:
            return None
        if self.shared is None:
            # In memory: every bucket with room is charged, then the first one over refuses, as
            # with Redis. This is the pass-through budget's path (bench/README.md "The governance
            # budget, counted"), so `LocalBuckets.take`'s GCRA step is written out here, with the
            # plan's interval and tolerance: a method call per limit was a quarter of what the
            # limits cost. Same arithmetic, slack and bound as `take`; a hypothesis test holds
            # the two together (tests/unit/test_policies_ratelimit.py).
            local = self.local
            tats = local.tats
            now = local.now()
            over = None
            for limit, bucket, interval, tolerance in plan.draws:
                if bucket is None:
                    bucket = limit.bucket(principal, method, name, backend)
                tat = tats.get(bucket, now)
                if tat < now:
                    tat = now
                wait = (tat - now) - tolerance
                if wait > _SLACK_SECONDS:
                    if over is None:
                        over = (limit, wait)
                    continue
                if len(tats) >= local.max_buckets and bucket not in tats:
                    local.make_room(now)
                tats[bucket] = tat + interval
            if over is not None:
                self._refuse(*over)
            note_rate_limit(True, plan.limits)
            return None
        matched = plan.limits
        requests = [(bucket if bucket is not None else limit.bucket(principal, method, name, backend), interval,
                     limit.burst) for limit, bucket, interval, _ in plan.draws]
        if time.monotonic() >= self._shared_down_until:
            return self._check_shared(matched, requests)
        local = self.local
        now = local.now()
        self._refuse_over(matched, [local.take(bucket, interval, burst, now) for bucket, interval, burst in requests],
                          fallback=True)
        return None

    async def _check_shared(self, matched: tuple[Limit, ...], requests: list[tuple[Any, float, int]]) -> None:
        assert self.shared is not None
        try:
            waits = await self.shared.take(requests)
        except Exception as exc:  # any Redis failure: the local buckets decide, never none
            self._shared_failed(exc)
            self._refuse_over(matched, [self.local.take(*request) for request in requests], fallback=True)
            return
        self._refuse_over(matched, waits, fallback=False)

    def _shared_failed(self, exc: BaseException) -> None:
        now = time.monotonic()
        self._shared_down_until = now + self.retry_seconds
        if now - self._warned_at >= _WARN_EVERY_SECONDS:
            self._warned_at = now
            log.warning("rate limits: Redis failed (%s: %s); this replica's local buckets apply "
                        "(limits hold per replica) for %gs", type(exc).__name__, exc, self.retry_seconds)

    def _refuse_over(self, matched: tuple[Limit, ...], waits: list[float], *, fallback: bool) -> None:
        if fallback:
            RATE_LIMIT_FALLBACKS.inc()
        for limit, wait in zip(matched, waits, strict=True):
            if wait and wait > 0:
                self._refuse(limit, wait)
        note_rate_limit(True, matched)

    @staticmethod
    def _refuse(limit: Limit, wait: float) -> None:
        note_rate_limit(False, (limit,))
        RATE_LIMITED.labels(limit.label).inc()
        retry_ms = max(1, math.ceil(wait * 1000))
        raise rpc.gateway_overloaded(
            f"Too Many Requests: rate limit {limit.label} ({_describe(limit)}) reached; retry in {retry_ms} ms",
            limit=limit.label, status=429, retry_after=wait, data={"retryAfterMs": retry_ms})

    async def start(self) -> None:
        if self.shared is not None:
            await self.shared.start()

    async def aclose(self) -> None:
        if self.shared is not None:
            await self.shared.aclose()


def _describe(limit: Limit) -> str:
    per_second = 1 / limit.interval
    for unit, seconds in (("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        count = per_second * seconds
        if count >= 1 and abs(count - round(count)) < 1e-9:
            return f"{round(count)}/{unit}, burst {limit.burst}"
    return f"{per_second:g}/s, burst {limit.burst}"


# -- check-config --------------------------------------------------------------------------


def check_rate_limits(settings: GatewaySettings) -> None:
    problems = limit_problems(settings)
    if problems:
        raise ValueError("; ".join(problems))


def limit_problems(settings: GatewaySettings) -> list[str]:
    from gateway.policies.authorization import target_problems

    problems: list[str] = []
    backends: Mapping[str, str] = {b.name: settings.prefix_of(b) for b in settings.backends}
    named: Iterable[str] = ("tools/call", "prompts/get", "resources/read", "completion/complete")
    labels: list[str] = []
    for i, limit in enumerate(settings.rate_limits):
        where = f"rate_limits.{i}" + (f" ({limit.id})" if limit.id else "")
        labels.append(limit.id or f"rate_limits.{i}")
        problems += [f"{where}: {p}" for p in target_problems(
            limit.methods, limit.backends, limit.names, None, backends, named_methods=frozenset(named),
            uri_methods=frozenset(), allowed_methods=frozenset(METHODS))]
        for part in limit.key:
            if part.startswith("claim:"):
                claim = part[len("claim:"):]
                if settings.auth.mode != "jwt" or claim not in settings.auth.claims:
                    problems.append(f"{where}: key {part!r}: add {claim!r} to auth.claims (auth.mode: jwt) "
                                    f"so the principal carries it")
    dupes = sorted({label for label in labels if labels.count(label) > 1})
    if dupes:
        problems.append(f"rate_limits: ids must be unique; repeated: {', '.join(dupes)}")
    return problems
