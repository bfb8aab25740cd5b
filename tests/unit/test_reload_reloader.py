"""The reloader's own rules (gateway/reload/reloader.py): a burst of requests costs at most
two reloads, refusals and no-ops are counted, and the running snapshot stays on refusal."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY

from gateway.reload.reloader import Reloader
from gateway.runtime import Runtime
from gateway.settings import ConfigError, load_settings
from tests.support.procs import refused_url


def count(result: str) -> float:
    return REGISTRY.get_sample_value("mcp_gateway_config_reloads_total", {"result": result}) or 0.0


async def test_a_burst_of_requests_costs_at_most_two_reloads():
    settings = load_settings(None, backends=[{"name": "a", "url": refused_url(), "era": "modern"}])
    runtime = Runtime(settings)
    loads = 0

    def load():
        nonlocal loads
        loads += 1
        return settings

    reloader = Reloader(runtime, load)
    before = count("unchanged")
    tasks = [reloader.request("SIGHUP") for _ in range(10)]
    results = await asyncio.gather(*tasks)
    assert set(results) == {"unchanged"} and loads <= 2
    assert count("unchanged") - before == loads
    await reloader.aclose()
    await runtime.aclose()


async def test_a_refusal_is_counted_and_changes_nothing():
    settings = load_settings(None, backends=[{"name": "a", "url": refused_url(), "era": "modern"}])
    runtime = Runtime(settings)
    snapshot = runtime.snapshot

    def load():
        raise ConfigError([("backends.0.url", "bad")])

    before = count("refused")
    assert await Reloader(runtime, load).reload("test") == "refused"
    assert count("refused") == before + 1 and runtime.snapshot is snapshot and runtime.live.snapshot is snapshot
    await runtime.aclose()
