"""A configuration `check-config` accepts never crashes `serve`, whatever state its Redis is
in: with nothing listening at the standalone, Sentinel or Cluster address, the gateway starts,
answers (the cache bypassed, listen streams served by this replica alone), and its logs name
Redis without its password."""

from __future__ import annotations

import logging
import uuid

import httpx
import pytest

from tests.support import mcp_http
from tests.support.gateway import running_gateway
from tests.support.listen import ListenReader
from tests.support.procs import refused_url


def _refused_hostport() -> str:
    return refused_url().removeprefix("http://").removesuffix("/mcp")


@pytest.mark.parametrize("shape", ["redis://{a}/0", "redis+sentinel://{a},{b}/gw/0", "redis+cluster://{a},{b}"])
async def test_a_gateway_whose_redis_is_unreachable_starts_and_answers(shape, counting_backend, mutable_backend,
                                                                      caplog):
    url = shape.format(a=_refused_hostport(), b=_refused_hostport())
    caplog.set_level(logging.INFO)
    config = {"backends": [{"name": "counted", "url": counting_backend.url, "resource_prefixes": ["count://"]},
                           {"name": "m", "url": mutable_backend.url}],
              "redis": {"url": url, "password": "never-shown-7c1"},
              "cache": {"store": "redis", "redis_timeout_ms": 200}}
    async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
        response = await mcp_http.post(http, gw.url, "resources/read",
                                       {"uri": f"count://public/{uuid.uuid4().hex[:10]}"})
        assert response.status_code == 200 and response.headers["x-cache"] == "bypass"
        reader = await ListenReader(http, gw.url, {"toolsListChanged": True}).open()
        try:
            assert reader.messages and reader.messages[0]["method"] == "notifications/subscriptions/acknowledged"
            before = len(reader.notifications)
            await http.post(f"http://127.0.0.1:{mutable_backend.port}/change/tools")
            await reader.wait(lambda: len(reader.notifications) > before)
        finally:
            await reader.close()
    logged = [r.getMessage() for r in caplog.records]
    assert any(":***@" in m for m in logged), logged
    assert not [m for m in logged if "never-shown-7c1" in m]
    # One line per trouble, not the kilobytes of client reprs redis-py's Sentinel errors carry.
    assert all(len(m) < 1000 for m in logged if "redis" in m), [m for m in logged if len(m) >= 1000][:1]
