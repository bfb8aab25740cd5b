"""Authorization and rate-limit decisions on the SERVER span (docs/observability.md "The
mcp.gateway.* convention"): `mcp.gateway.authorization.decision` / `.rule` and
`mcp.gateway.rate_limit.decision` / `.limit`, for allowed and refused requests, decided in the
header phase and in the body phase. Real RS256 tokens against a JWKS on loopback, a real
scripted backend, the SDK's in-memory span exporter."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.support import mcp_http
from tests.support.gateway import running_gateway
from tests.support.oauth import AUDIENCE, ISSUER, Issuer, JwksEndpoint, ServedApp, rsa_key
from tests.support.scripted import Scripted
from tests.support.spans import spans  # noqa: F401  (the module's fixture)

pytestmark = pytest.mark.asyncio(loop_scope="module")

RULES = {
    "default": "deny",
    "rules": [
        {"id": "no-failing", "effect": "deny", "names": ["*__fail"]},
        {"id": "finance", "effect": "allow", "methods": ["tools/call", "tools/list", "completion/complete"],
         "backends": ["ledger"], "when": {"claims": {"groups": "finance"}}},
    ],
}
# A burst of 2 a minute per principal for tools/call, and one for everything that counts all.
LIMITS = [{"id": "calls-per-principal", "rate": "1/m", "burst": 2, "key": ["principal"], "methods": ["tools/call"]},
          {"rate": "1000/s", "burst": 1000}]


@pytest.fixture(scope="module")
def ledger() -> Iterator[Scripted]:
    with Scripted("ledger") as server:
        yield server


@pytest.fixture(scope="module")
def issuer() -> Issuer:
    return Issuer(keys=[rsa_key("k1")])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(ledger, issuer, spans) -> AsyncIterator[Any]:
    served = ServedApp(JwksEndpoint(issuer))
    await served.start()
    settings = {
        "backends": [{"name": "ledger", "url": ledger.url, "era": "modern"},
                     {"name": "other", "url": ledger.url, "era": "modern"}],
        "auth": {"mode": "jwt", "issuer": ISSUER, "audience": AUDIENCE, "jwks_url": f"{served.base}/jwks",
                 "authorization_servers": [ISSUER], "claims": ["groups"]},
        "authorization": RULES,
        "rate_limits": LIMITS,
    }
    try:
        async with running_gateway(settings) as gw:
            yield gw
    finally:
        await served.stop()


async def _server_span(spans: InMemorySpanExporter, http: httpx.AsyncClient, url: str, token: str, method: str,
                       params: dict[str, Any], status: int) -> ReadableSpan:
    spans.clear()
    response = await mcp_http.post(http, url, method, params, extra_headers={"authorization": f"Bearer {token}"})
    assert response.status_code == status, response.text
    [server] = [s for s in spans.get_finished_spans() if s.kind is SpanKind.SERVER]
    return server


def _governance(span: ReadableSpan) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in span.attributes.items()
            if k.startswith(("mcp.gateway.authorization.", "mcp.gateway.rate_limit."))}


async def test_an_allowed_call_says_which_rule_allowed_it_and_which_limits_counted_it(gw, issuer, spans):
    token = issuer.token("fiona", groups=["finance"])
    async with httpx.AsyncClient(trust_env=False, timeout=20) as http:
        server = await _server_span(spans, http, gw.url, token, "tools/call",
                                    {"name": "ledger__echo", "arguments": {"text": "x"}}, 200)
    assert _governance(server) == {
        "mcp.gateway.authorization.decision": "allow", "mcp.gateway.authorization.rule": "finance",
        "mcp.gateway.rate_limit.decision": "allow",
        # Labels from the configuration (its id, else its index), never the caller's values.
        "mcp.gateway.rate_limit.limit": ["calls-per-principal", "rate_limits.1"]}


async def test_a_call_refused_in_the_header_phase_names_its_rule(gw, issuer, spans):
    engineer = issuer.token("eric", groups=["engineering"])
    finance = issuer.token("fiona", groups=["finance"])
    async with httpx.AsyncClient(trust_env=False, timeout=20) as http:
        by_default = await _server_span(spans, http, gw.url, engineer, "tools/call",
                                        {"name": "ledger__echo", "arguments": {"text": "x"}}, 403)
        by_rule = await _server_span(spans, http, gw.url, finance, "tools/call",
                                     {"name": "ledger__fail", "arguments": {"code": 1, "message": "x"}}, 403)
    # Refused before the rate limits were asked: no rate-limit decision.
    assert _governance(by_default) == {"mcp.gateway.authorization.decision": "deny",
                                       "mcp.gateway.authorization.rule": "default"}
    assert _governance(by_rule) == {"mcp.gateway.authorization.decision": "deny",
                                    "mcp.gateway.authorization.rule": "no-failing"}


async def test_a_completion_is_decided_in_the_body_phase_both_ways(gw, issuer, spans):
    engineer = issuer.token("eric", groups=["engineering"])
    finance = issuer.token("fiona", groups=["finance"])
    params = {"ref": {"type": "ref/prompt", "name": "ledger__greet"}, "argument": {"name": "who", "value": "a"}}
    async with httpx.AsyncClient(trust_env=False, timeout=20) as http:
        denied = await _server_span(spans, http, gw.url, engineer, "completion/complete", params, 403)
        allowed = await _server_span(spans, http, gw.url, finance, "completion/complete", params, 200)
    assert _governance(denied) == {"mcp.gateway.authorization.decision": "deny",
                                   "mcp.gateway.authorization.rule": "default"}
    assert _governance(allowed) == {
        "mcp.gateway.authorization.decision": "allow", "mcp.gateway.authorization.rule": "finance",
        "mcp.gateway.rate_limit.decision": "allow", "mcp.gateway.rate_limit.limit": ["rate_limits.1"]}


async def test_a_call_over_its_rate_limit_names_the_limit(gw, issuer, spans):
    token = issuer.token("frank", groups=["finance"])
    params = {"name": "ledger__echo", "arguments": {"text": "x"}}
    async with httpx.AsyncClient(trust_env=False, timeout=20) as http:
        for _ in range(2):  # the burst
            await _server_span(spans, http, gw.url, token, "tools/call", params, 200)
        refused = await _server_span(spans, http, gw.url, token, "tools/call", params, 429)
    assert _governance(refused) == {
        "mcp.gateway.authorization.decision": "allow", "mcp.gateway.authorization.rule": "finance",
        "mcp.gateway.rate_limit.decision": "deny", "mcp.gateway.rate_limit.limit": ["calls-per-principal"]}


async def test_without_governance_there_are_no_decision_attributes(ledger, spans):
    async with running_gateway({"backends": [{"name": "ledger", "url": ledger.url, "era": "modern"}]}) as gw, \
            httpx.AsyncClient(trust_env=False, timeout=20) as http:
        spans.clear()
        response = await mcp_http.post(http, gw.url, "tools/call", {"name": "echo", "arguments": {"text": "x"}})
        assert response.status_code == 200, response.text
    [server] = [s for s in spans.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert _governance(server) == {}
