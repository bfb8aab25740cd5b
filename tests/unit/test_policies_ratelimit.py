"""GCRA buckets (local, on a hand-moved clock; shared, in a real redis-server), limit matching
and keys, the 429 refusal, the fallback when Redis fails, and check-config's refusals."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.policies.ratelimit import (
    RATE_LIMIT_FALLBACKS,
    LocalBuckets,
    RateLimits,
    RedisBuckets,
    compile_limit,
    parse_rate,
)
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.principal import ANONYMOUS, Principal
from gateway.settings import ConfigError, RateLimit, load_settings
from tests.support.clock import ManualClock

BACKENDS = [{"name": "ledger", "url": "http://127.0.0.1:1/mcp"}, {"name": "github", "url": "http://127.0.0.1:2/mcp"}]
ALICE = Principal("alice", "https://idp.test", authenticated=True, claims={"tenant": "acme"})
BOB = Principal("bob", "https://idp.test", authenticated=True, claims={"tenant": "acme"})


def limit(**fields: Any):
    return compile_limit(0, RateLimit(**fields))


def test_parse_rate():
    assert parse_rate("20/s") == (20, 1.0)
    assert parse_rate(" 100 / m ") == (100, 60.0)
    assert parse_rate("1.5/h") == (1.5, 3600.0)
    with pytest.raises(ValueError):
        parse_rate("0/s")


def test_burst_at_once_then_the_sustained_rate():
    clock = ManualClock(0)
    buckets = LocalBuckets(clock=clock)
    # 10/s, burst 3: three at once, then one every 100 ms.
    assert [buckets.take("k", 0.1, 3) for _ in range(3)] == [0, 0, 0]
    wait = buckets.take("k", 0.1, 3)
    assert wait == pytest.approx(0.1)
    clock.now = 0.05
    assert buckets.take("k", 0.1, 3) == pytest.approx(0.05)
    clock.now = 0.1
    assert buckets.take("k", 0.1, 3) == 0
    assert buckets.take("k", 0.1, 3) > 0
    clock.now = 10  # a long pause refills to the burst, never beyond it
    assert [buckets.take("k", 0.1, 3) for _ in range(4)].count(0) == 3


def test_a_fresh_bucket_always_lets_its_first_request_through():
    # Clock values where `now + interval - interval - now` rounds above zero: the first call
    # of a 1/h bucket was refused with "retry in 1 ms" about once in 150 start times.
    rounding = [now for now in (1234.5678 + i * 0.37 for i in range(2000))
                if (now + 3600.0) - 3600.0 - now > 0]
    assert rounding, "no start time here shows the rounding; pick others"
    for now in rounding:
        buckets = LocalBuckets(clock=ManualClock(now))
        assert buckets.take("b", 3600.0, 1) == 0.0
        assert buckets.take("b", 3600.0, 1) > 3599


def test_local_buckets_are_bounded():
    clock = ManualClock(0)
    buckets = LocalBuckets(max_buckets=10, clock=clock)
    for i in range(50):
        buckets.take(f"k{i}", 1.0, 5)
    assert len(buckets) <= 10


def test_matching_by_method_name_and_backend_and_keys():
    by_name = limit(rate="1/s", methods=["tools/call"], names=["ledger__*"], key=["principal", "name"])
    assert by_name.applies("tools/call", "ledger__x", "ledger")
    assert not by_name.applies("tools/call", "github__x", "github")
    assert not by_name.applies("tools/list", None, None)
    assert by_name.bucket(ALICE, "tools/call", "ledger__x", "ledger") != by_name.bucket(BOB, "tools/call",
                                                                                        "ledger__x", "ledger")
    assert by_name.bucket(ALICE, "tools/call", "ledger__x", "ledger") != by_name.bucket(ALICE, "tools/call",
                                                                                        "ledger__y", "ledger")
    by_tenant = limit(rate="1/s", key=["claim:tenant"])
    assert by_tenant.bucket(ALICE, "tools/call", "a", None) == by_tenant.bucket(BOB, "tools/call", "b", None)
    # No name or principal in clear in a bucket id (it becomes a Redis key).
    from gateway.policies.ratelimit import bucket_hash

    assert "alice" not in bucket_hash(by_name.bucket(ALICE, "tools/call", "ledger__x", "ledger"))


KEY_PARTS = ["principal", "name", "backend", "method", "claim:tenant"]
TARGETS = [("tools/call", "ledger__x", "ledger"), ("tools/call", "github__y", "github"), ("prompts/get", "p", None),
           ("tools/list", None, None), ("resources/read", "file:///a", "ledger")]
CALLERS = [ALICE, BOB, ANONYMOUS, Principal("carol", "https://idp.test", authenticated=True,
                                            claims={"tenant": ["other", "acme"]})]


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.lists(st.sampled_from(KEY_PARTS), min_size=1, max_size=3, unique=True), min_size=1,
                     max_size=3))
def test_fuzz_a_planned_bucket_is_the_one_every_caller_draws_from(keys):
    """A target's plan builds the buckets that read nothing of the caller once: they must be
    the very buckets `Limit.bucket` names for every caller (and so the same Redis keys)."""
    limits = RateLimits(tuple(compile_limit(i, RateLimit(rate="5/s", key=key)) for i, key in enumerate(keys)))
    for method, name, backend in TARGETS:
        plan = limits.plan(method, name, backend)
        assert plan.limits == tuple(limit for limit, *_ in plan.draws) == limits.limits
        for principal in CALLERS:
            for limit, bucket, *_ in plan.draws:
                expected = limit.bucket(principal, method, name, backend)
                assert bucket is None or bucket == expected, (limit.key, principal)
                assert (bucket is None) == any(p == "principal" or p.startswith("claim:") for p in limit.key)


@settings(max_examples=300, deadline=None)
@given(configured=st.lists(st.tuples(st.sampled_from(["1/s", "3/s", "2/m", "10/h"]), st.integers(1, 3),
                                     st.lists(st.sampled_from(KEY_PARTS), min_size=1, max_size=2, unique=True)),
                           min_size=1, max_size=3),
       steps=st.lists(st.tuples(st.sampled_from([0.0, 0.0, 0.1, 0.35, 1.0, 30.0]), st.sampled_from(CALLERS),
                                st.sampled_from(TARGETS)), max_size=40),
       bound=st.sampled_from([2, 5, 100_000]))
def test_fuzz_the_in_memory_step_decides_what_local_buckets_take_decides(configured, steps, bound):
    """`check_plan` writes the GCRA step out for the in-memory path; whatever the limits, callers
    and timing, it refuses exactly when one `LocalBuckets.take` per limit would (the same limit,
    the same wait) and leaves the same buckets behind, eviction under a small bound included."""
    clock = ManualClock(1000)
    compiled = tuple(compile_limit(i, RateLimit(rate=rate, burst=burst, key=key))
                     for i, (rate, burst, key) in enumerate(configured))
    fast = RateLimits(compiled, local=LocalBuckets(max_buckets=bound, clock=clock))
    reference = LocalBuckets(max_buckets=bound, clock=clock)
    for advance, principal, (method, name, backend) in steps:
        clock.now += advance
        expected = None
        for limit in fast.matching(method, name, backend):  # the loop as it was before the plan
            wait = reference.take(limit.bucket(principal, method, name, backend), limit.interval, limit.burst)
            if wait and expected is None:
                expected = (limit.label, max(1, math.ceil(wait * 1000)))
        try:
            fast.check(principal, method, name, backend)
            got = None
        except rpc.McpError as refused:
            got = (refused.data["limit"], refused.data["retryAfterMs"])
        assert got == expected
    assert fast.local.tats == reference.tats


def test_a_bucket_planned_once_is_shared_by_callers_only_when_its_key_says_so():
    clock = ManualClock(0)
    limits = RateLimits((compile_limit(0, RateLimit(rate="1/s", burst=1, id="per-backend", key=["backend"])),
                         compile_limit(1, RateLimit(rate="1/m", burst=1, id="per-caller", key=["principal", "name"]))),
                        local=LocalBuckets(clock=clock))
    assert limits.check(ALICE, "tools/call", "ledger__x", "ledger") is None
    with pytest.raises(rpc.McpError) as refused:  # Bob draws from the same backend bucket
        limits.check(BOB, "tools/call", "ledger__y", "ledger")
    assert refused.value.data["limit"] == "per-backend"
    assert limits.check(BOB, "tools/call", "github__x", "github") is None
    clock.now = 1.0
    with pytest.raises(rpc.McpError) as refused:  # Bob's own bucket for ledger__y was charged above
        limits.check(BOB, "tools/call", "ledger__y", "ledger")
    assert refused.value.data["limit"] == "per-caller"
    clock.now = 2.0
    assert limits.check(ALICE, "tools/call", "ledger__y", "ledger") is None  # Alice's is her own


async def test_over_the_limit_is_429_naming_the_limit_and_the_wait():
    limits = RateLimits((compile_limit(0, RateLimit(rate="2/s", burst=2, id="calls")),))
    assert limits.check(ALICE, "tools/call", "x", None) is None  # decided at once, no await
    limits.check(ALICE, "tools/call", "x", None)
    with pytest.raises(rpc.McpError) as refused:
        limits.check(ALICE, "tools/call", "x", None)
    error = refused.value
    assert error.status == 429 and error.code == rpc.GATEWAY_OVERLOADED
    assert error.headers["Retry-After"] == "1"
    assert error.data["limit"] == "calls" and 0 < error.data["retryAfterMs"] <= 500
    assert "rate limit calls (2/s, burst 2)" in error.message
    limits.check(BOB, "tools/call", "x", None)  # Bob has his own bucket


async def test_redis_buckets_are_shared_and_atomic(redis_server):
    one = RedisBuckets.from_url(redis_server.url, prefix="t", timeout_seconds=1.0)
    two = RedisBuckets.from_url(redis_server.url, prefix="t", timeout_seconds=1.0)
    try:
        # 60 concurrent takes from two clients of a burst-10 bucket at 1/s: exactly 10 pass.
        waits = await asyncio.gather(*(c.take([("b", 1.0, 10)]) for c in [one, two] * 30))
        assert sum(1 for [w] in waits if w == 0) == 10
        assert all(0 < w <= 1.0 for [w] in waits if w)
        # Several buckets in one pipeline, each decided on its own.
        assert await one.take([("x", 1.0, 1), ("y", 1.0, 1)]) == [0, 0]
        first, second = await one.take([("x", 1.0, 1), ("z", 1.0, 1)])
        assert first > 0 and second == 0
        assert one.key("b") == "t:rl:{b}"  # hash-tagged: one slot per bucket on Cluster
        assert one.key(("limit", "alice")).startswith("t:rl:{") and "alice" not in one.key(("limit", "alice"))
    finally:
        await one.aclose()
        await two.aclose()


class BrokenBuckets:
    def __init__(self) -> None:
        self.calls = 0

    async def take(self, requests: list[tuple[Any, float, int]]) -> list[float]:
        self.calls += 1
        raise ConnectionError("redis is down")

    async def start(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


async def test_redis_failing_falls_back_to_local_buckets_never_unlimited(caplog):
    broken = BrokenBuckets()
    limits = RateLimits((compile_limit(0, RateLimit(rate="1/s", burst=3)),), shared=broken, retry_seconds=60)
    before = RATE_LIMIT_FALLBACKS._value.get()
    await limits.check(ALICE, "tools/call", "x", None)  # Redis asked, failed: decided locally
    for _ in range(2):
        assert limits.check(ALICE, "tools/call", "x", None) is None  # Redis skipped for now
    with pytest.raises(rpc.McpError) as refused:
        limits.check(ALICE, "tools/call", "x", None)
    assert refused.value.status == 429
    assert broken.calls == 1  # then skipped for retry_seconds, not paid per request
    assert RATE_LIMIT_FALLBACKS._value.get() - before == 4
    assert "local buckets apply" in caplog.text


@pytest.mark.parametrize(("entry", "problem"), [
    ({"rate": "10/s", "backends": ["nope"]}, "no backend is named 'nope'"),
    ({"rate": "10/s", "methods": ["tools/cal"]}, "not an MCP method"),
    ({"rate": "10/s", "methods": ["tools/list"], "names": ["x"]}, "names can never match"),
    ({"rate": "10/s", "key": ["claim:tenant"]}, "add 'tenant' to auth.claims"),
    ({"rate": "10/s", "key": ["user"]}, "is not principal, name, backend, method or claim"),
    ({"rate": "ten per second"}, "String should match pattern"),
])
def test_check_config_refuses_limits_that_cannot_work(entry, problem):
    with pytest.raises(ConfigError) as refused:
        load_settings(None, backends=BACKENDS, rate_limits=[entry])
    assert problem in str(refused.value)


def test_limit_ids_are_unique():
    with pytest.raises(ConfigError, match="ids must be unique"):
        load_settings(None, backends=BACKENDS, rate_limits=[{"rate": "1/s", "id": "a"}, {"rate": "2/s", "id": "a"}])
