"""The gateway on Redis in its production shapes: a Sentinel set (a master, a replica, three
Sentinels) and a Cluster of three masters with a replica each, real processes on free ports,
started once per shape. Two gateway processes share each, configured only through the
shared `redis:` block (the URL forms `redis+sentinel://` and `redis+cluster://`):

- a cache hit across replicas (an answer fetched through one is served by the other);
- a listen notification across replicas, through one upstream listen for both;
- an MRTR retry on the other replica (it needs no Redis, but must keep working beside it);
- a rate limit across replicas: calls alternating between both draw from buckets in Redis
  (two limits per call: one EVALSHA pipeline on Sentinel, two scripts on two slots on Cluster);
- a failover under load: the master holding the cache's keys and both channels is killed
  (-9) while tools/call and cached reads run through both replicas: no tools/call fails, the
  cache is bypassed during the outage and back in use within seconds of the promotion, and
  the listen streams stay open and hear changes made after it.

"""

from __future__ import annotations

import asyncio
import math
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml
from redis.crc import key_slot

from tests.support import legacy_venv, mcp_http
from tests.support.listen import ListenReader, eventually
from tests.support.procs import Proc, free_port, gateway_process, redis_server_binary
from tests.support.redis_shapes import RedisCluster, RedisSentinelSet, sentinel_binary

TOOLS_CHANGED = "notifications/tools/list_changed"
ELICIT = {"io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}
ASK = {"name": "old__ask_user", "arguments": {"question": "colour?"}}
# Only the rate-limit test calls this tool, so the limits leave the module's other tests alone.
LIMITED_TOOL = "counted__counted_b"
RATE_LIMITS = [
    {"id": "shapes-per-principal", "rate": "10/s", "burst": 10, "key": ["principal"],
     "methods": ["tools/call"], "names": [LIMITED_TOOL]},
    # Never reached; a second bucket (on another slot) makes each check two scripts at once.
    # A slow rate so its key (which expires once the bucket is full again) outlives the test.
    {"id": "shapes-per-name", "rate": "100/m", "burst": 1000, "key": ["name"],
     "methods": ["tools/call"], "names": [LIMITED_TOOL]},
]


class Shape:
    """One Redis deployment and how to lose its master."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.cluster: RedisCluster | None = None
        self.sentinel: RedisSentinelSet | None = None
        self.prefix = "gw"

    def start(self) -> Shape:
        if self.kind == "cluster":
            self.cluster = RedisCluster(masters=3, replicas_per_master=1).start()
            self.prefix = self._prefix_on_one_master()
        else:
            self.sentinel = RedisSentinelSet().start()
        return self

    def _prefix_on_one_master(self) -> str:
        # A prefix whose cache keys (backend "counted"), invalidation channel and listen
        # channel all live on one master: losing it takes all three away at once.
        assert self.cluster is not None
        for i in range(10_000):
            prefix = f"gw{i}"
            owners = {self.cluster.master_of(name).port for name in
                      ("{" + f"{prefix}:cache:counted" + "}", f"{prefix}:invalidate", f"{prefix}:listen:events")}
            if len(owners) == 1:
                return prefix
        raise AssertionError("no prefix maps onto a single master")

    @property
    def url(self) -> str:
        return self.cluster.url if self.cluster else self.sentinel.url  # type: ignore[union-attr]

    def master(self) -> Proc:
        if self.cluster is not None:
            return self.cluster.master_of("{" + f"{self.prefix}:cache:counted" + "}")
        assert self.sentinel is not None
        return self.sentinel.current_master()

    def wait_promoted(self, killed: Proc) -> None:
        """Blocks until a new master serves the killed one's data."""
        if self.sentinel is not None:
            self.sentinel.wait_promoted(away_from=killed.port)
            return
        assert self.cluster is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if self.master().port != killed.port and self.cluster.healthy():
                    return
            except (redis.RedisError, StopIteration):
                pass
            time.sleep(0.05)
        raise TimeoutError("no replica took the lost master's slots within 30s")

    def stop(self) -> None:
        for part in (self.cluster, self.sentinel):
            if part is not None:
                part.stop()


@pytest.fixture(scope="module", params=["sentinel", "cluster"])
def shape(request: pytest.FixtureRequest) -> Iterator[Shape]:
    if redis_server_binary() is None:
        pytest.fail("redis-server is not installed; run the tests through scripts/test.sh, which installs it")
    if request.param == "sentinel" and sentinel_binary() is None:
        pytest.skip("no redis-sentinel (scripts/test.sh installs Debian's redis-sentinel)")
    started = Shape(request.param).start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def legacy_backend() -> Iterator[Proc]:
    proc = legacy_venv.legacy_server(name="legacy-shapes").start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def replicas(shape: Shape, counting_backend: Proc, mutable_backend: Proc, legacy_backend: Proc,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, Proc]]:
    procs: list[Proc] = []
    try:
        for i in range(2):
            port = free_port()
            config = tmp_path_factory.mktemp(f"{shape.kind}-replica{i}") / "gateway.yaml"
            config.write_text(yaml.safe_dump({
                "server": {"port": port},
                "backends": [
                    {"name": "counted", "url": counting_backend.url, "resource_prefixes": ["count://"]},
                    {"name": "m", "url": mutable_backend.url},
                    {"name": "old", "url": legacy_backend.url, "era": "legacy"},
                ],
                "redis": {"url": shape.url},
                # No local layer: every hit below is a Redis hit.
                "cache": {"store": "redis", "key_prefix": shape.prefix, "local_max_entries": 0,
                          "redis_retry_seconds": 0.2},
                "subscriptions": {"redis_key_prefix": shape.prefix, "lease_seconds": 1.5,
                                  "reconnect_initial_seconds": 0.05, "reconnect_max_seconds": 0.5},
                "security": {"secret": "shared-test-secret"},
                "observability": {"log_level": "warning"},
                "rate_limits": RATE_LIMITS,
            }))
            procs.append(gateway_process(Path(config), port=port).start())
        for proc in procs:
            _until_the_cache_answers(proc)
        yield procs[0], procs[1]
    finally:
        for proc in procs:
            proc.stop()


def _until_the_cache_answers(gateway: Proc, timeout: float = 20.0) -> None:
    """Start-up is over: the replica reaches Redis (a lookup that is not a bypass)."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=10) as http:
        while True:
            body = mcp_http.body("resources/read", {"uri": f"count://public/warm-{uuid.uuid4().hex[:8]}"})
            response = http.post(gateway.url, json=body, headers=mcp_http.headers("resources/read", body["params"]["uri"]))
            if response.headers.get("x-cache") in ("hit", "miss"):
                return
            assert time.monotonic() < deadline, f"{gateway.url} still bypasses the cache after {timeout}s"
            time.sleep(0.1)


def _answer(response: httpx.Response) -> dict[str, Any]:
    if response.headers["content-type"].startswith("text/event-stream"):
        return mcp_http.sse_messages(response.text)[-1]
    return response.json()


async def _read(http: httpx.AsyncClient, gateway: Proc, uri: str) -> tuple[str, str | None]:
    response = await mcp_http.post(http, gateway.url, "resources/read", {"uri": uri})
    assert response.status_code == 200, response.text
    return response.json()["result"]["contents"][0]["text"], response.headers.get("x-cache")


async def _tools_listed(http: httpx.AsyncClient, gateway: Proc) -> bool:
    """Every backend discovered: their tools are all listed (every page)."""
    names: set[str] = set()
    params: dict[str, Any] = {}
    while True:
        result = (await mcp_http.post(http, gateway.url, "tools/list", params)).json()["result"]
        names |= {t["name"] for t in result["tools"]}
        if not result.get("nextCursor"):
            break
        params = {"cursor": result["nextCursor"]}
    return {"counted__counted_a", "old__ask_user"} <= names and any(n.startswith("m__") for n in names)


async def test_an_answer_fetched_through_one_replica_is_a_hit_on_the_other(replicas, counting_backend):
    one, two = replicas
    uri = f"count://public/{uuid.uuid4().hex[:10]}"
    async with httpx.AsyncClient(timeout=30) as http:
        first, outcome = await _read(http, one, uri)
        assert outcome == "miss" and first.endswith("#1")
        again, outcome = await _read(http, two, uri)
        assert (again, outcome) == (first, "hit")
        counts = (await http.get(f"http://127.0.0.1:{counting_backend.port}/counts")).json()
        assert counts[f"resources/read {uri}"] == 1


async def test_a_change_heard_by_one_replica_reaches_the_listeners_of_both(shape, replicas, mutable_backend):
    control = f"http://127.0.0.1:{mutable_backend.port}"
    async with httpx.AsyncClient(timeout=30) as http:
        readers = [await ListenReader(http, gw.url, {"toolsListChanged": True}, id=f"on-{i}").open()
                   for i, gw in enumerate(replicas)]
        try:
            # One upstream listen serves both replicas: the lease is shared through Redis.
            await eventually(lambda: _open_listens(http, control, 1))
            seen = [len(r.notifications) for r in readers]
            await http.post(f"{control}/change/tools")
            for reader, before in zip(readers, seen, strict=True):
                await reader.wait(lambda r=reader, b=before: len(r.notifications) > b)
                assert reader.notifications[-1]["method"] == TOOLS_CHANGED
            if shape.cluster is not None:
                _assert_sharded(shape.cluster, shape.prefix)
        finally:
            for reader in readers:
                await reader.close()


def _assert_sharded(cluster: RedisCluster, prefix: str) -> None:
    """Both channels are sharded (SSUBSCRIBE on the master owning the channel's slot, one
    subscriber per replica), and nothing uses the cluster-wide broadcast pub/sub."""
    for channel in (f"{prefix}:listen:events", f"{prefix}:invalidate"):
        with redis.Redis(port=cluster.master_of(channel).port) as owner:
            assert owner.pubsub_shardnumsub(channel) == [(channel.encode(), 2)]
    for node in cluster.live():
        with redis.Redis(port=node.port) as client:
            assert client.pubsub_channels() == []


async def _open_listens(http: httpx.AsyncClient, control: str, expected: int) -> bool:
    return (await http.get(f"{control}/stats")).json()["open_listens"] == expected


async def test_an_mrtr_retry_on_the_other_replica_completes_the_call(replicas):
    one, two = replicas
    async with httpx.AsyncClient(timeout=30) as http:
        await eventually(lambda: _tools_listed(http, one))
        response = await mcp_http.post(http, one.url, "tools/call", ASK, id="c1", meta=ELICIT)
        result = _answer(response)["result"]
        assert result["resultType"] == "input_required"
        ((key, _request),) = result["inputRequests"].items()
        retry = {**ASK, "inputResponses": {key: {"action": "accept", "content": {"answer": "blue"}}},
                 "requestState": result["requestState"]}
        final = _answer(await mcp_http.post(http, two.url, "tools/call", retry, id="c2", meta=ELICIT))
    assert final["result"]["content"][0]["text"] == "accept: blue"


async def test_a_rate_limit_holds_across_the_replicas(shape, replicas):
    one, two = replicas
    async with httpx.AsyncClient(timeout=30) as http:
        for gateway in replicas:
            await eventually(lambda g=gateway: _tools_listed(http, g))
        fallbacks_before = [await _fallbacks(http, gateway) for gateway in replicas]
        started = time.monotonic()
        answers = await asyncio.gather(*(
            mcp_http.post(http, replicas[i % 2].url, "tools/call", {"name": LIMITED_TOOL, "arguments": {}}, id=i)
            for i in range(40)))
        elapsed = time.monotonic() - started
        keys = _bucket_keys(shape)  # at once: the principal's bucket expires within ~1 s
        # Every decision was Redis's: no replica fell back to its own buckets.
        assert [await _fallbacks(http, gateway) for gateway in replicas] == fallbacks_before
    ok = [a for a in answers if a.status_code == 200]
    limited = [a for a in answers if a.status_code == 429]
    assert len(ok) + len(limited) == 40, [a.status_code for a in answers]
    # One shared bucket: burst 10, then one per 100 ms of the run (+1 for a refill at the
    # edge). Buckets per replica would let at least 20 through.
    assert 10 <= len(ok) <= 10 + math.floor(elapsed * 10) + 1, (len(ok), elapsed)
    assert {_answer(a)["result"]["content"][0]["text"] for a in ok} == {"counted_b"}
    for answer in limited:
        assert int(answer.headers["retry-after"]) >= 1
        assert answer.json()["error"]["data"]["limit"] == "shapes-per-principal"
    # Both buckets are keys on the shape, hash-tagged; on Cluster, on two different slots.
    assert len(keys) == 2, keys
    if shape.cluster is not None:
        assert len({key_slot(k.encode()) for k in keys}) == 2, keys


async def _fallbacks(http: httpx.AsyncClient, gateway: Proc) -> float:
    text = (await http.get(f"http://127.0.0.1:{gateway.port}/metrics")).text
    match = re.search(r"^mcp_gateway_rate_limit_fallbacks_total (\S+)$", text, re.MULTILINE)
    assert match is not None, "the replica does not export mcp_gateway_rate_limit_fallbacks_total"
    return float(match.group(1))


def _bucket_keys(shape: Shape) -> list[str]:
    if shape.cluster is not None:
        with redis.RedisCluster(host="127.0.0.1", port=shape.cluster.live()[0].port, decode_responses=True) as client:
            keys = list(client.scan_iter(f"{shape.prefix}:rl:*"))  # every master's
    else:
        with redis.Redis(port=shape.master().port, decode_responses=True) as client:
            keys = list(client.scan_iter(f"{shape.prefix}:rl:*"))
    assert all(re.fullmatch(re.escape(shape.prefix) + r":rl:\{[0-9a-f]{24}\}", k) for k in keys), keys
    return keys


async def test_a_lost_master_under_load_fails_no_call_and_everything_resumes(shape, replicas, mutable_backend):
    # Last in the module: the shape has lost a master afterwards.
    control = f"http://127.0.0.1:{mutable_backend.port}"
    outcomes: list[tuple[float, int, str | None]] = []  # (time, replica, x-cache) of each read
    failed_calls: list[str] = []
    calls = 0
    stop = asyncio.Event()

    async def worker(http: httpx.AsyncClient, n: int) -> None:
        nonlocal calls
        while not stop.is_set():
            gateway = replicas[n % 2]
            response = await mcp_http.post(http, gateway.url, "tools/call",
                                           {"name": "counted__counted_a", "arguments": {}})
            answer = _answer(response) if response.status_code == 200 else {}
            calls += 1
            if response.status_code != 200 or "error" in answer or answer["result"].get("isError"):
                failed_calls.append(f"{response.status_code} {response.text[:200]}")
            _, outcome = await _read(http, gateway, f"count://public/load-{n % 4}")
            outcomes.append((time.monotonic(), n % 2, outcome))
            n += 1

    async with httpx.AsyncClient(timeout=30) as http:
        await eventually(lambda: _tools_listed(http, replicas[0]))
        readers = [await ListenReader(http, gw.url, {"toolsListChanged": True}, id=f"fo-{i}").open()
                   for i, gw in enumerate(replicas)]
        workers = [asyncio.create_task(worker(http, n)) for n in range(6)]
        try:
            await asyncio.sleep(1.0)
            assert any(o == "hit" for _, _, o in outcomes), "the cache was not in use before the failover"
            master = shape.master()
            master.kill()
            killed_at = time.monotonic()
            await asyncio.to_thread(shape.wait_promoted, master)
            promoted_at = time.monotonic()
            # The cache is back (answers from Redis: a hit, or a miss that stores) on both
            # replicas within a few seconds of the promotion, and hits again after that.
            await eventually(lambda: all(any(t > promoted_at and r == i and o == "hit" for t, r, o in outcomes)
                                         for i in (0, 1)), timeout=10)
            # Listen streams: still open, and a change made now reaches both.
            seen = [len(r.notifications) for r in readers]
            await http.post(f"{control}/change/tools")
            for reader, before in zip(readers, seen, strict=True):
                await reader.wait(lambda r=reader, b=before: len(r.notifications) > b, timeout=15)
                assert not reader.ended
        finally:
            stop.set()
            await asyncio.gather(*workers, return_exceptions=True)
            for reader in readers:
                await reader.close()
    assert failed_calls == [], failed_calls[:3]
    assert calls > 50
    outage = [o for t, _, o in outcomes if killed_at + 0.5 < t < promoted_at]
    assert "bypass" in outage, "the cache never noticed the outage"
    back = {i: min(t for t, r, o in outcomes if t > promoted_at and r == i and o != "bypass") for i in (0, 1)}
    assert all(t - promoted_at < 5.0 for t in back.values()), (back, promoted_at)
