"""The gateway's logs as an operator reads them (docs/observability.md "Logs"): a real gateway
process with `log_format: json` and the access log on, under a scripted workload. Every line
of its output is one JSON object (its own logs and uvicorn's); every MCP request has one
access line whose every field is checked; a request with `X-Request-Id: abc` finds `abc` in
the answer, in the backend's request and in every log line of that request."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from gateway.observability.logs import AccessLog
from gateway.observability.record import RequestRecord, request_id_from
from tests.support import mcp_http
from tests.support.procs import free_port, gateway_process
from tests.support.scripted import Scripted

LEGACY = "2025-06-18"
ACCEPT = "application/json, text/event-stream"
FIELDS = {"time", "level", "logger", "message", "request_id", "trace_id", "method", "name", "backend", "status",
          "jsonrpc_code", "duration_ms", "cache", "subject", "era"}


@pytest.fixture(scope="module")
def backend() -> Iterator[Scripted]:
    with Scripted("logged") as scripted:
        yield scripted


async def _workload(url: str) -> dict[str, httpx.Response]:
    """One request of each kind; returns the answers by label."""
    out: dict[str, httpx.Response] = {}
    async with httpx.AsyncClient(trust_env=False, timeout=20) as client:
        out["echo"] = await mcp_http.post(client, url, "tools/call", {"name": "m__echo", "arguments": {"text": "x"}},
                                          id=1, extra_headers={"x-request-id": "abc"})
        out["fail"] = await mcp_http.post(client, url, "tools/call",
                                          {"name": "m__fail", "arguments": {"code": -32602, "message": "bad"}}, id=2)
        out["is_error"] = await mcp_http.post(client, url, "tools/call", {"name": "m__is_error", "arguments": {}}, id=3)
        out["read_miss"] = await mcp_http.post(client, url, "resources/read", {"uri": "scripted://logged/doc-1"}, id=4)
        out["read_hit"] = await mcp_http.post(client, url, "resources/read", {"uri": "scripted://logged/doc-1"}, id=5)
        out["refused"] = await mcp_http.post(client, url, "tools/call", {"name": "m__echo", "arguments": {}}, id=6,
                                             extra_headers={"origin": "https://evil.example"})
        # A backend that is down is left out of server/discover with a warning logged while
        # the request runs: that line must carry the request's id.
        out["discover"] = await mcp_http.post(client, url, "server/discover", id=7,
                                              extra_headers={"x-request-id": "disc-1"})
        out["bad_id"] = await mcp_http.post(client, url, "tools/list", id=8,
                                            extra_headers={"x-request-id": "not a plain id"})
        init = await client.post(url, content=orjson.dumps({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}),
            headers={"content-type": "application/json", "accept": ACCEPT})
        out["legacy_init"] = init
        session = init.headers["mcp-session-id"]
        legacy = {"content-type": "application/json", "accept": ACCEPT, "mcp-session-id": session,
                  "mcp-protocol-version": LEGACY}
        out["legacy_ack"] = await client.post(url, content=orjson.dumps(
            {"jsonrpc": "2.0", "method": "notifications/initialized"}), headers=legacy)
        out["legacy_call"] = await client.post(url, content=orjson.dumps({
            "jsonrpc": "2.0", "id": 9, "method": "tools/call",
            "params": {"name": "m__echo", "arguments": {"text": "old"}}}), headers=legacy)
    return out


async def test_json_logs_and_access_lines_of_a_scripted_workload(backend, tmp_path: Path):
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "backends": [{"name": "m", "url": backend.url, "era": "modern"},
                     {"name": "dead", "url": f"http://127.0.0.1:{free_port()}/mcp", "era": "modern"}],
        "observability": {"log_format": "json", "access_log": True},
    }))
    gateway = gateway_process(config).start()
    try:
        answers = await _workload(gateway.url)
        time.sleep(0.2)  # the last access lines are written at the end of their loop pass
    finally:
        gateway.stop()
    lines = gateway.output().splitlines()
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all(isinstance(r, dict) and {"time", "level", "logger", "message"} <= r.keys() for r in records)
    # uvicorn's own lines are in the same format, once each.
    assert sum("Started server process" in r["message"] for r in records) == 1
    assert any(r["logger"] == "uvicorn.error" and "Application startup complete" in r["message"] for r in records)

    access = [r for r in records if r["logger"] == "gateway.access"]
    assert all(set(r) == FIELDS for r in access), [set(r) ^ FIELDS for r in access]
    by_id = {r["request_id"]: r for r in access}
    assert len(by_id) == len(access) == len(answers)

    echo = by_id["abc"]
    assert answers["echo"].headers["x-request-id"] == "abc"
    assert echo == {**echo, "method": "tools/call", "name": "m__echo", "backend": "m", "status": 200,
                    "jsonrpc_code": None, "cache": None, "subject": None, "era": "modern", "trace_id": None,
                    "level": "info", "message": "mcp request"}
    assert 0 < echo["duration_ms"] < 10_000
    [received] = [c for c in await backend.calls("tools/call") if c["id"] == 1]
    assert received["x-request-id"] == "abc"

    def line_of(label: str) -> dict[str, Any]:
        return by_id[answers[label].headers["x-request-id"]]

    assert line_of("fail")["jsonrpc_code"] == -32602 and line_of("fail")["status"] == answers["fail"].status_code
    assert line_of("is_error")["jsonrpc_code"] == "tool_error" and line_of("is_error")["status"] == 200
    assert (line_of("read_miss")["cache"], line_of("read_hit")["cache"]) == ("miss", "hit")
    assert line_of("read_hit")["name"] == "scripted://logged/doc-1" and line_of("read_hit")["backend"] == "m"
    refused = line_of("refused")
    assert (refused["status"], refused["jsonrpc_code"], refused["backend"]) == (403, -32600, None)
    assert line_of("discover")["method"] == "server/discover"
    generated = answers["bad_id"].headers["x-request-id"]
    assert generated != "not a plain id" and generated in by_id
    for label, method in (("legacy_init", "initialize"), ("legacy_ack", "notifications/initialized"),
                          ("legacy_call", "tools/call")):
        assert (line_of(label)["method"], line_of(label)["era"]) == (method, "legacy"), label
    assert line_of("legacy_ack")["status"] == 202 and line_of("legacy_call")["name"] == "m__echo"
    assert line_of("legacy_call")["backend"] == "m"

    # Every field of every line, against the answer the line is about: (method, name, backend,
    # jsonrpc_code, cache, era); status and request id from the answer itself.
    expected = {
        "echo": ("tools/call", "m__echo", "m", None, None, "modern"),
        "fail": ("tools/call", "m__fail", "m", -32602, None, "modern"),
        "is_error": ("tools/call", "m__is_error", "m", "tool_error", None, "modern"),
        "read_miss": ("resources/read", "scripted://logged/doc-1", "m", None, "miss", "modern"),
        "read_hit": ("resources/read", "scripted://logged/doc-1", "m", None, "hit", "modern"),
        "refused": ("tools/call", None, None, -32600, None, "modern"),
        "discover": ("server/discover", None, "gateway", None, None, "modern"),  # the gateway's own answer
        "bad_id": ("tools/list", None, "m", None, "miss", "modern"),  # the one backend that answered
        "legacy_init": ("initialize", None, "gateway", None, None, "legacy"),  # the gateway's session
        "legacy_ack": ("notifications/initialized", None, None, None, None, "legacy"),
        "legacy_call": ("tools/call", "m__echo", "m", None, None, "legacy"),
    }
    assert expected.keys() == answers.keys()
    timestamp = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
    for label, (method, name, backend_name, code, cache, era) in expected.items():
        line = line_of(label)
        assert line == {
            "time": line["time"], "level": "info", "logger": "gateway.access", "message": "mcp request",
            "request_id": answers[label].headers["x-request-id"], "trace_id": None,  # tracing is off
            "method": method, "name": name, "backend": backend_name, "status": answers[label].status_code,
            "jsonrpc_code": code, "duration_ms": line["duration_ms"], "cache": cache, "subject": None,  # no auth
            "era": era}, label
        assert timestamp.fullmatch(line["time"]), line["time"]
        assert isinstance(line["duration_ms"], float) and 0 < line["duration_ms"] < 10_000, label

    # Every line logged while the discover request ran carries its id: the warning about the
    # backend left out, and the access line.
    tagged = [r for r in records if r.get("request_id") == "disc-1"]
    assert {r["logger"] for r in tagged} == {"gateway.dispatch", "gateway.access"}
    warning = next(r for r in tagged if r["logger"] == "gateway.dispatch")
    assert "dead" in warning["message"] and warning["level"] == "warning"
    untagged_warnings = [r for r in records if "left out" in r["message"] and r.get("request_id") is None]
    assert untagged_warnings == []
    # No credential or token anywhere (the workload sent none; the access line has no header).
    assert "authorization" not in gateway.output().lower()


def test_access_log_sampling_keeps_every_error(tmp_path: Path):
    read, write = os.pipe()
    log = AccessLog(log_format="json", sample=0.0, fd=write)
    ok = RequestRecord("ok-1", 0.0, "modern", {})
    ok.status, ok.method = 200, "tools/call"
    failed = RequestRecord("err-1", 0.0, "modern", {})
    failed.status, failed.code = 400, -32602
    tool_error = RequestRecord("tool-1", 0.0, "modern", {})
    tool_error.status, tool_error.tool_error = 200, True
    for record in (ok, failed, tool_error):
        if log.wants(record):
            log.log(record, 0.001, None)
    log.flush()
    os.close(write)
    lines = os.read(read, 65536).decode().splitlines()
    os.close(read)
    assert [json.loads(line)["request_id"] for line in lines] == ["err-1", "tool-1"]


def test_request_ids_are_taken_when_plain_and_bounded():
    assert request_id_from("abc") == "abc"
    assert request_id_from("0af7651916cd43dd-1:2/x+y=") == "0af7651916cd43dd-1:2/x+y="
    for bad in ("has space", "quote\"", "x" * 129, "", "line\nbreak", "ünicode"):
        made = request_id_from(bad)
        assert made != bad and request_id_from(made) == made
    assert request_id_from(None) != request_id_from(None)


async def test_one_request_id_in_the_answer_the_backend_the_span_and_every_log_line(backend, tmp_path: Path):
    """Issue 21's proof in one request: `X-Request-Id: abc` on a read the backend answers 503
    the first time, so that the gateway logs its retry while the request runs, through a real
    gateway process with JSON logs, the access log and tracing on (console exporter: span lines
    on stderr, which this process's output file shares). `abc` is in the answer, in both
    requests the backend received, on the SERVER span, and on every log line of the request,
    whose trace id is the span's."""
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "backends": [{"name": "m", "url": backend.url, "era": "modern", "resource_prefixes": ["scripted://logged/"]}],
        "observability": {"log_format": "json", "access_log": True, "tracing": True, "tracing_exporter": "console"},
    }))
    gateway = gateway_process(config, env={"OTEL_BSP_SCHEDULE_DELAY": "50"}).start()
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=20) as client:
            answer = await mcp_http.post(client, gateway.url, "resources/read", {"uri": "scripted://logged/flaky/abc"},
                                         id=7, extra_headers={"x-request-id": "abc"})
        time.sleep(0.5)  # the access line's batch and the span exporter's
    finally:
        gateway.stop()
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-request-id"] == "abc"
    received = [c for c in await backend.calls("resources/read") if c["name"] == "scripted://logged/flaky/abc"]
    assert [c["x-request-id"] for c in received] == ["abc", "abc"]  # the 503'd attempt and the retry

    lines = [json.loads(line) for line in gateway.output().splitlines()]  # logs and spans: JSON each
    spans = [line for line in lines if "span_id" in line]
    logs = [line for line in lines if "span_id" not in line]
    [server] = [s for s in spans if s["kind"] == "SERVER" and s["attributes"].get("mcp.gateway.request_id") == "abc"]
    assert server["name"] == "resources/read"
    # The backend's requests continued the SERVER span's trace.
    assert [c["traceparent"].split("-")[1] for c in received] == [server["trace_id"]] * 2
    of_request = [r for r in logs if r.get("request_id") == "abc"]
    assert {r["logger"] for r in of_request} == {"gateway.backends.retry", "gateway.access"}, of_request
    assert any("retrying resources/read on m" in r["message"] for r in of_request)
    assert all(r["trace_id"] == server["trace_id"] for r in of_request), of_request
    # No line of that trace lacks the id: every log line of the request carries it.
    assert [r for r in logs if r.get("trace_id") == server["trace_id"] and r.get("request_id") != "abc"] == []
