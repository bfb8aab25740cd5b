"""Front-door fuzz: no malformed request to the MCP endpoint gets a 5xx or an answer that is not
a JSON-RPC error (digest §a.3, §a.4, §a.5, §b).

A gateway on loopback in front of a real modern backend (the scripted fixture, which has a
tool with an `x-mcp-header` parameter) is sent well over a thousand malformed POSTs over real
HTTP: httpx for everything an HTTP client can send, raw sockets for what it cannot (framing,
whitespace, control bytes, half-sent bodies). They are generated from valid `tools/call` and
`tools/list` requests, deterministically: systematic single mutations of every body field and
request-metadata header, then compound mutations drawn with `random.Random(SEED)`.

Every answer must be: below 500 (the backend is healthy, so any 5xx is the gateway failing a
client's malformed request), a JSON-RPC 2.0 error object (`error.code` an integer of the family
its status says, `error.message` a non-empty string) or a result, with the request's own id when
a JSON parser can read one and no id otherwise. Where the spec names the status and code of a
case, the case carries them (`Want`) and they are asserted exactly. Two gateways run the
corpus: a modern-only one whose backend keeps its names, and the default dual-era one with a
prefixed backend (so the gateway rewrites the body and `Mcp-Name` it forwards, and
initialize-era claims run on every request); on the latter, an initialize-era session's
requests get the same field mutations (invariants only: that era's rules differ). Afterwards
each gateway still serves a valid request. The last tests pin, one by one, what the fuzz found.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
import pytest_asyncio

from tests.support import mcp_http
from tests.support.gateway import running_gateway
from tests.support.scripted import Scripted

pytestmark = pytest.mark.asyncio(loop_scope="module")

SEED = 20260728
V = mcp_http.VERSION
PV = "io.modelcontextprotocol/protocolVersion"
CAPS = "io.modelcontextprotocol/clientCapabilities"
LOG = "io.modelcontextprotocol/logLevel"
INFO = "io.modelcontextprotocol/clientInfo"
LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
MAX_BODY = 1 << 20
MAX_DEPTH = 254  # the nesting the gateway accepts: what its encoder can write back

# The codes a gateway answers a malformed request with, and the statuses each may travel with
# (digest §a.3; -32600 also carries the refusals of what cannot be read: 403 Origin/Host, 405,
# 408, 413, 431, and the initialize-era 404 for an unknown session, L-TR §Session Management).
STATUSES_OF_CODE: dict[int, frozenset[int]] = {
    -32700: frozenset({400}),
    -32600: frozenset({400, 403, 404, 405, 408, 413, 431}),
    -32601: frozenset({404}),
    -32602: frozenset({400}),
    -32020: frozenset({400}),
    -32021: frozenset({400}),
    -32022: frozenset({400}),
}


# -- what a case expects ----------------------------------------------------------------------

READ = "the request's id"  # Want.id: the id a JSON parser reads from the body
NO_ID = None  # Want.id: none could be read: the answer has no id (or a null one)


@dataclass(frozen=True)
class Want:
    """The exact outcome the spec names for a case. `code` None = a result (the request was
    valid after all); a set = any of these codes (the spec leaves the choice open)."""

    status: int
    code: int | frozenset[int] | None = None
    id: Any = READ


OK = Want(200)
NOTIFICATION = Want(202)
PARSE = Want(400, -32700, NO_ID)


def bad_request(id: Any = READ) -> Want:
    return Want(400, -32600, id)


def mismatch() -> Want:
    return Want(400, -32020)


def bad_params() -> Want:
    return Want(400, -32602)


@dataclass
class Case:
    label: str
    body: bytes
    headers: list[tuple[bytes, bytes]]
    want: Want | None = None  # None: only the invariants
    # Exact only on the modern-only gateway: initialize-era claims (a legacy version header,
    # a session id) take these requests elsewhere on the dual-era one.
    modern_only: bool = False
    check: Any = None  # an extra check of the answer's JSON message


# -- the corpus -------------------------------------------------------------------------------


class _Delete:
    def __repr__(self) -> str:
        return "<deleted>"


DELETE = _Delete()


@dataclass(frozen=True)
class Value:
    """A replacement for a body field: a Python value, or raw JSON text (`raw`) for what no
    encoder writes (NaN, 10,000 levels of nesting, 2**80, invalid UTF-8)."""

    label: str
    value: Any = None
    raw: bytes | None = None

    @property
    def json(self) -> Any:
        return orjson.Fragment(self.raw) if self.raw is not None else self.value

    @property
    def parses(self) -> bool:
        if self.raw is None:
            return True
        try:
            orjson.loads(self.raw)
        except orjson.JSONDecodeError:
            return False
        return True

    @property
    def parsed(self) -> Any:
        return orjson.loads(self.raw) if self.raw is not None else self.value


def _deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


VALUES: list[Value] = [
    Value("null", None), Value("true", True), Value("false", False),
    Value("zero", 0), Value("negative", -7), Value("i64-max", 2**63 - 1), Value("u64-max", 2**64 - 1),
    Value("i64-min", -(2**63)), Value("float", 1.5), Value("float-integral", 1.0),
    Value("2**80", raw=str(2**80).encode()), Value("-2**80", raw=str(-(2**80)).encode()),
    Value("minus-zero", raw=b"-0"), Value("exponent", raw=b"1E2"),
    Value("empty-string", ""), Value("string", "x"), Value("huge-string", "A" * 200_000),
    Value("nul-string", "a\u0000b"), Value("non-ascii-string", "é東京\U0001f600"),
    Value("sentinel-string", "=?base64?ZWNobw==?="), Value("crlf-string", "a\r\nb"),
    Value("empty-array", []), Value("array", [1, "a", None]), Value("empty-object", {}),
    Value("object", {"a": 1}), Value("nested-object", {"a": {"b": [{"c": None}]}}),
    Value("deep-100", raw=_deep(100)), Value("deep-300", raw=_deep(300)), Value("deep-1000", raw=_deep(1000)),
    Value("deep-object-600", raw=b'{"a":' * 600 + b"1" + b"}" * 600),
    # Not JSON at all: each makes the whole body a parse error (-32700).
    Value("deep-10000", raw=_deep(10_000)), Value("NaN", raw=b"NaN"), Value("Infinity", raw=b"Infinity"),
    Value("-Infinity", raw=b"-Infinity"), Value("1e400", raw=b"1e400"), Value("leading-zero", raw=b"01"),
    Value("lone-surrogate", raw=b'"\\ud800"'), Value("invalid-utf8", raw=b'"\xff\xfe"'),
    Value("single-quoted", raw=b"'x'"), Value("undefined", raw=b"undefined"), Value("trailing-comma", raw=b"[1,]"),
    Value("bare-word", raw=b"tools/call"),
]


def depth(value: Any) -> int:
    """How many arrays and objects deep `value` nests (0 for a scalar)."""
    deepest, level, todo = 0, 0, [(value, 1)]
    while todo:
        node, level = todo.pop()
        if isinstance(node, (list, dict)):
            deepest = max(deepest, level)
            todo += [(child, level + 1) for child in (node.values() if isinstance(node, dict) else node)]
    return deepest


def _is_id(value: Any) -> bool:
    return isinstance(value, (str, int)) and not isinstance(value, bool)


@dataclass
class Base:
    """A valid request: its body as an object, its headers, and the names the gateway sees."""

    label: str
    method: str
    body: dict[str, Any]
    headers: list[tuple[bytes, bytes]]
    paths: list[tuple[str, ...]] = field(default_factory=list)

    def mutated(self, path: tuple[str, ...], value: Any) -> bytes:
        body = _copy(self.body)
        node = body
        for step in path[:-1]:
            node = node[step]
        if value is DELETE:
            node.pop(path[-1], None)
        else:
            node[path[-1]] = value.json if isinstance(value, Value) else value
        return orjson.dumps(body)


def _copy(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_copy(v) for v in obj]
    return obj


def _headers(method: str, name: str | None = None, **extra: str) -> list[tuple[bytes, bytes]]:
    return [(k.encode(), v.encode()) for k, v in mcp_http.headers(method, name, **extra).items()]


def bases(prefix: str) -> dict[str, Base]:
    echo, regional = f"{prefix}echo", f"{prefix}regional"
    call = Base("call", "tools/call", mcp_http.body("tools/call", {"name": echo, "arguments": {"text": "fuzz"}}),
                _headers("tools/call", echo))
    call.paths = [("jsonrpc",), ("id",), ("method",), ("params",), ("params", "name"), ("params", "arguments"),
                  ("params", "arguments", "text"), ("params", "_meta"), ("params", "_meta", PV),
                  ("params", "_meta", CAPS), ("params", "_meta", LOG), ("params", "_meta", "progressToken"),
                  ("params", "_meta", CAPS, "extensions"), ("params", "_meta", INFO), ("extra",)]
    listing = Base("list", "tools/list", mcp_http.body("tools/list"), _headers("tools/list"))
    listing.paths = [("jsonrpc",), ("id",), ("method",), ("params",), ("params", "cursor"), ("params", "name"),
                     ("params", "_meta"), ("params", "_meta", PV), ("params", "_meta", CAPS), ("params", "_meta", LOG),
                     ("params", "_meta", INFO), ("params", "_meta", "progressToken")]
    region = Base("regional", "tools/call",
                  mcp_http.body("tools/call", {"name": regional, "arguments": {"region": "eu-west1"}}),
                  _headers("tools/call", regional, **{"mcp-param-region": "eu-west1"}))
    region.paths = [("params", "arguments"), ("params", "arguments", "region"), ("params", "arguments", "query")]
    return {b.label: b for b in (call, listing, region)}


def want_for_field(base: Base, path: tuple[str, ...], value: Value | _Delete) -> Want | None:
    """What the spec says a body with this one field changed gets (digest §a.3, in the order of
    §a.5), or None where it names nothing more than the invariants."""
    if isinstance(value, Value) and not value.parses:
        return PARSE
    v = DELETE if value is DELETE else value.parsed  # type: ignore[union-attr]
    if len(path) + depth(v) > MAX_DEPTH:
        # Deeper than the gateway writes back (RFC 8259 §9 lets it limit nesting): refused
        # whole, before any field is read, so wherever it sits.
        return bad_request()
    head = path[0]
    if head == "jsonrpc":
        return bad_request()
    if head == "id":
        if v is DELETE:
            return NOTIFICATION  # accepted: SHTTP "Notification accepted" → 202
        return OK if _is_id(v) else bad_request(NO_ID)
    if head == "method":
        if not isinstance(v, str):
            return bad_request()
        return OK if v == base.method else mismatch()  # Mcp-Method still names the original
    if head == "extra":
        return OK  # an unknown top-level member is ignored
    # params and below
    if path == ("params",):
        if v is DELETE:
            return bad_params()  # no _meta (and, for tools/call, no name)
        if not isinstance(v, dict):
            return Want(400, frozenset({-32600, -32602}))  # invalid Request or invalid params
        return bad_params()  # an object without _meta
    if path == ("params", "_meta"):
        return bad_params()  # never an object with both required fields
    if path == ("params", "_meta", PV):
        if v is DELETE or v is None:
            return bad_params()  # required _meta field missing (BASIC §_meta)
        return OK if v == V else mismatch()  # ≠ MCP-Protocol-Version header
    if path == ("params", "_meta", CAPS):
        return OK if isinstance(v, dict) else bad_params()
    if path == ("params", "_meta", LOG):
        return OK if v is DELETE or v is None or v in LEVELS else bad_params()  # LOG: unknown level → -32602
    if path == ("params", "_meta", "progressToken"):
        # ProgressToken: a string or an integer (JSON Schema: no fractional part) → else -32602.
        integral = isinstance(v, float) and v.is_integer()
        return OK if v is DELETE or isinstance(v, str) or _is_id(v) or integral else bad_params()
    if path == ("params", "_meta", INFO):
        return OK if v is DELETE else bad_params()  # no VALUES entry is an Implementation
    if path == ("params", "_meta", CAPS, "extensions"):
        # A map of extension name → settings object; the values here hold no such map.
        objects = isinstance(v, dict) and all(isinstance(x, dict) for x in v.values())
        return OK if v is DELETE or objects else bad_params()
    if base.label == "list":
        if path == ("params", "cursor"):
            return OK if v is DELETE else bad_params()  # PAGE: invalid cursor → -32602
        if path == ("params", "name"):
            return OK
    if base.label == "call":
        if path == ("params", "name"):
            if isinstance(v, str):
                return OK if v == base.body["params"]["name"] else mismatch()  # ≠ Mcp-Name
            return bad_params()  # TOOLS: malformed tools/call → -32602
        if path == ("params", "arguments"):
            # CallToolRequestParams.arguments is an object (SCHEMA); absent or null = none.
            return OK if v is DELETE or v is None or isinstance(v, dict) else bad_params()
        if path == ("params", "arguments", "text"):
            return OK
    if base.label == "regional":
        if path == ("params", "arguments"):
            # Mcp-Param-Region is sent; the argument it mirrors is not in the body (§b.2).
            if v is DELETE or v is None or isinstance(v, dict):
                return mismatch()
            return bad_params()
        if path == ("params", "arguments", "region"):
            return OK if v == "eu-west1" else mismatch()  # decoded header ≠ body value
        if path == ("params", "arguments", "query"):
            return OK  # not annotated
    return None


def field_cases(base: Base) -> Iterator[Case]:
    for path in base.paths:
        for value in [DELETE, *VALUES]:
            label = f"{base.label}: {'.'.join(path)} = {value.label if isinstance(value, Value) else 'deleted'}"
            yield Case(label, base.mutated(path, value), base.headers, want_for_field(base, path, value))


def _set(headers: list[tuple[bytes, bytes]], name: str, value: bytes | None) -> list[tuple[bytes, bytes]]:
    """`headers` with every `name` field removed and, unless value is None, one set to value."""
    out = [(k, v) for k, v in headers if k.lower() != name.encode()]
    if value is not None:
        out.append((name.encode(), value))
    return out


def _b64(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return b"=?base64?" + base64.b64encode(raw) + b"?="


def header_cases(b: dict[str, Base]) -> Iterator[Case]:
    call, listing, region = b["call"], b["list"], b["regional"]
    body, hs = orjson.dumps(call.body), call.headers
    name = call.body["params"]["name"]
    # Required headers missing (SHTTP §Server Validation) → 400 -32020.
    for h in ("mcp-protocol-version", "mcp-method", "mcp-name"):
        yield Case(f"header {h} missing", body, _set(hs, h, None), mismatch())
    yield Case("list: header mcp-protocol-version missing", orjson.dumps(listing.body),
               _set(listing.headers, "mcp-protocol-version", None), mismatch())
    yield Case("list: header mcp-method missing", orjson.dumps(listing.body),
               _set(listing.headers, "mcp-method", None), mismatch())
    # Not required for tools/list: an Mcp-Name there is ignored.
    yield Case("list: stray mcp-name", orjson.dumps(listing.body), listing.headers + [(b"mcp-name", b"x")], OK)
    # Duplicated: RFC 9110 §5.3 combines them ("v, v"), which never equals the body value.
    for h in ("mcp-protocol-version", "mcp-method", "mcp-name"):
        value = dict(hs)[h.encode()]
        yield Case(f"header {h} duplicated", body, hs + [(h.encode(), value)], mismatch(), modern_only=True)
        yield Case(f"header {h} duplicated, other value", body, hs + [(h.encode(), b"other")], mismatch(),
                   modern_only=True)
    for h in ("content-type", "accept"):
        yield Case(f"header {h} duplicated", body, hs + [(h.encode(), dict(hs)[h.encode()])])
    # Names are case-insensitive, values case-sensitive (§b.1).
    yield Case("header names upper-case", body, [(k.upper(), v) for k, v in hs], OK)
    yield Case("header names mixed case", body, [(k.title(), v) for k, v in hs], OK)
    yield Case("mcp-method value upper-case", body, _set(hs, "mcp-method", b"TOOLS/CALL"), mismatch())
    yield Case("mcp-name value upper-case", body, _set(hs, "mcp-name", name.upper().encode()), mismatch())
    yield Case("mcp-method empty", body, _set(hs, "mcp-method", b""), mismatch())
    yield Case("mcp-name empty", body, _set(hs, "mcp-name", b""), mismatch())
    yield Case("mcp-protocol-version empty", body, _set(hs, "mcp-protocol-version", b""), mismatch(),
               modern_only=True)
    # Non-ASCII bytes (obs-text): never equal to the body's value.
    for h, value in (("mcp-method", b"tools/call\xe9"), ("mcp-name", name.encode() + b"\xc3\xa9"),
                     ("mcp-protocol-version", V.encode() + b"\xff"), ("mcp-name", b"\xff" * 3)):
        yield Case(f"{h} non-ASCII {value[-3:]!r}", body, _set(hs, h, value), mismatch(), modern_only=True)
    for h, value in (("content-type", b"application/json\xe9"), ("accept", b"\xc3\xa9/*")):
        yield Case(f"{h} non-ASCII", body, _set(hs, h, value))
    # The Base64 sentinel (§b.3).
    sentinels = [
        (_b64(name), OK),  # the right value, encoded
        (b"=?base64?" + base64.b64encode(name.encode()).rstrip(b"=") + b"?=", mismatch()),  # bad padding
        (b"=?base64?!!!!?=", mismatch()),  # bad alphabet
        (b"=?base64?" + base64.urlsafe_b64encode(b"\xfb\xff") + b"?=", mismatch()),  # URL-safe alphabet
        (_b64(b"\xff\xfe"), mismatch()),  # not UTF-8 inside
        (_b64(b"\xed\xa0\x80"), mismatch()),  # an encoded surrogate: not UTF-8 either
        (_b64(name.encode() + b"\x00"), mismatch()),
        (b"=?base64??=", mismatch()),  # empty: "" ≠ the name
        (b"=?BASE64?" + base64.b64encode(name.encode()) + b"?=", mismatch()),  # literal: markers are lower-case
        (b"=?base64?" + base64.b64encode(name.encode()), mismatch()),  # no suffix: literal
        (b"=?base64?" + b"A" * 40_000 + b"?=", mismatch()),
    ]
    for value, want in sentinels:
        yield Case(f"mcp-name sentinel {value[:24]!r}", body, _set(hs, "mcp-name", value), want)
    yield Case("mcp-method in the sentinel", body, _set(hs, "mcp-method", _b64("tools/call")), mismatch())
    # Unsupported version, consistently in header and body → -32022 with data (§a.3).
    unsupported = mcp_http.body("tools/call", call.body["params"], meta={PV: "1900-01-01"})
    unsupported["params"]["_meta"][PV] = "1900-01-01"

    def supported_listed(msg: dict[str, Any]) -> str | None:
        data = msg["error"].get("data")
        if data != {"supported": [V], "requested": "1900-01-01"}:
            return f"-32022 data {data!r}"
        return None

    yield Case("unsupported version", orjson.dumps(unsupported), _set(hs, "mcp-protocol-version", b"1900-01-01"),
               Want(400, -32022), check=supported_listed)
    yield Case("unsupported version in the header only", body, _set(hs, "mcp-protocol-version", b"1900-01-01"),
               mismatch())
    yield Case("legacy version header", body, _set(hs, "mcp-protocol-version", b"2025-11-25"), mismatch(),
               modern_only=True)
    yield Case("session id", body, hs + [(b"mcp-session-id", b"\xff not a session")], OK, modern_only=True)
    yield Case("session id and garbage", b"{garbage", hs + [(b"mcp-session-id", b"s")], PARSE, modern_only=True)
    # Mcp-Param-* headers for parameters the tool does not declare: forwarded, ignored (§b.2).
    for value in (b"x y", b"", b"=?base64?!!?=", _b64(b"\xff"), b"\xe9t\xe9", b"a" * 8000):
        yield Case(f"undeclared mcp-param {value[:16]!r}", body, hs + [(b"mcp-param-whatever", value)], OK)
    yield Case("mcp-param-region on a tool without it", body, hs + [(b"Mcp-Param-Region", b"=?base64?x?=")], OK)
    # A declared one (regional's `region`): must be present, decode, and equal the argument.
    rbody, rhs = orjson.dumps(region.body), region.headers
    for value, want in ((None, mismatch()), (b"=?base64?ZXUtd2VzdDE=?=", OK), (b"=?base64?ZXUtd2VzdDE?=", mismatch()),
                        (b"eu-west1\xe9", mismatch()), (b"EU-WEST1", mismatch()), (_b64(b"\xff"), mismatch()),
                        (b"=?base64?" + b"A" * 40_000 + b"?=", mismatch())):
        yield Case(f"mcp-param-region {value!r:.30}", rbody, _set(rhs, "mcp-param-region", value), want)
    yield Case("mcp-param-region duplicated", rbody, rhs + [(b"mcp-param-region", b"eu-west1")], mismatch())
    yield Case("mcp-param-region name upper-case", rbody,
               _set(rhs, "mcp-param-region", None) + [(b"MCP-PARAM-REGION", b"eu-west1")], OK)
    # Content negotiation: the spec asks clients for these but names no server outcome.
    for h, value in (("content-type", None), ("content-type", b"text/plain"),
                     ("content-type", b"application/json; charset=utf-16"), ("content-type", b""),
                     ("accept", b"text/html"), ("accept", b"application/json"), ("accept", b"text/event-stream"),
                     ("accept", b"")):
        yield Case(f"{h}: {value!r}", body, _set(hs, h, value))
    # Origin (§a.2): present and foreign → 403, no id.
    for value in (b"https://evil.example", b"null", b"http://\xe9vil.example", b"http://127.0.0.1:1@evil.example"):
        yield Case(f"origin {value!r}", body, hs + [(b"origin", value)], Want(403, -32600, NO_ID))


def whole_body_cases(b: dict[str, Base]) -> Iterator[Case]:
    call = b["call"]
    body, hs = orjson.dumps(call.body), call.headers
    for cut in sorted({1, 2, len(body) // 3, len(body) // 2, len(body) - 2, len(body) - 1}):
        yield Case(f"truncated at {cut}", body[:cut], hs, PARSE)
    for label, data in (("empty", b""), ("whitespace", b" \r\n\t"), ("BOM", b"\xef\xbb\xbf" + body),
                        ("UTF-16", body.decode().encode("utf-16")), ("trailing garbage", body + b" x"),
                        ("trailing object", body + body), ("trailing NUL", body + b"\x00"),
                        ("invalid UTF-8 in a string", body.replace(b'"fuzz"', b'"fu\xc0\xafzz"')),
                        ("latin-1 in a string", body.replace(b'"fuzz"', b'"f\xfczz"')),
                        ("lone surrogate escape", body.replace(b'"fuzz"', b'"\\udfff"')),
                        ("unquoted key", body.replace(b'"jsonrpc"', b"jsonrpc")),
                        ("single quotes", body.replace(b'"', b"'")), ("NaN", b"NaN"),
                        ("10,000 levels", _deep(10_000)), ("10,000 objects", b'{"a":' * 10_000 + b"1" + b"}" * 10_000)):
        yield Case(f"body {label}", data, hs, PARSE)
    # A single message only: no batches, no scalars (§a.1; digest §a.5 step 4).
    for label, data in (("batch", orjson.dumps([call.body])), ("batch of two", orjson.dumps([call.body, call.body])),
                        ("empty batch", b"[]"), ("null", b"null"), ("number", b"1"), ("string", b'"tools/call"'),
                        ("true", b"true"), ("nested batch", orjson.dumps([[call.body]]))):
        yield Case(f"body {label}", data, hs, bad_request(NO_ID))
    # A response is no request; the id is readable, so it is echoed.
    yield Case("body is a response", orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": {}}), hs, bad_request())
    yield Case("body is an error response", orjson.dumps({"jsonrpc": "2.0", "id": 1, "error": {"code": 1}}), hs,
               bad_request())
    # Duplicate keys: one reading (the last) for the whole gateway.
    yield Case("duplicate id", body.replace(b'"id":1', b'"id":1,"id":"two"'), hs, OK)
    yield Case("duplicate method", body.replace(b'"method":"tools/call"', b'"method":"tools/list","method":"tools/call"'),
               hs, OK)
    yield Case("duplicate method, wrong last", body.replace(b'"method":"tools/call"',
                                                            b'"method":"tools/call","method":"tools/list"'),
               hs, mismatch())
    yield Case("duplicate params", body.replace(b'"params":', b'"params":7,"params":'), hs, OK)
    yield Case("over the body cap", body.replace(b'"fuzz"', b'"' + b"x" * MAX_BODY + b'"'), hs,
               Want(413, -32600, NO_ID))


def compound_cases(b: dict[str, Base], rng: random.Random, count: int) -> Iterator[Case]:
    """Two to four mutations at once, of body fields and headers: only the invariants."""
    header_ops: list[tuple[str, Any]] = [
        ("drop", "mcp-protocol-version"), ("drop", "mcp-method"), ("drop", "mcp-name"), ("drop", "content-type"),
        ("dup", "mcp-method"), ("dup", "mcp-name"), ("set", ("mcp-name", b"=?base64?\xff?=")),
        ("set", ("mcp-protocol-version", b"1900-01-01")), ("set", ("mcp-protocol-version", b"2025-06-18")),
        ("set", ("mcp-session-id", b"abc")), ("set", ("mcp-method", b"initialize")),
        ("set", ("mcp-param-region", b"=?base64?====?=")), ("set", ("mcp-name", b"\xf0\x9f")),
    ]
    labels = list(b)
    for i in range(count):
        base = b[rng.choice(labels)]
        body = _copy(base.body)
        headers = list(base.headers)
        steps = []
        for _ in range(rng.randint(2, 4)):
            if rng.random() < 0.6:
                path = rng.choice(base.paths + [("params", "name"), ("method",), ("id",)])
                value = rng.choice([DELETE, *[v for v in VALUES if v.parses and len(v.raw or b"") < 2000]])
                node = body
                for step in path[:-1]:
                    node = node.get(step) if isinstance(node, dict) else None
                if not isinstance(node, dict):
                    continue
                if value is DELETE:
                    node.pop(path[-1], None)
                else:
                    node[path[-1]] = value.json
                steps.append(f"{'.'.join(path)}={value.label if isinstance(value, Value) else 'del'}")
            else:
                op, arg = rng.choice(header_ops)
                if op == "drop":
                    headers = _set(headers, arg, None)
                elif op == "dup":
                    headers = headers + [(arg.encode(), b"x")]
                else:
                    headers = _set(headers, arg[0], arg[1])
                steps.append(f"{op} {arg if isinstance(arg, str) else arg[0]}")
        yield Case(f"compound #{i} {base.label}: {', '.join(steps)}", orjson.dumps(body), headers)


def corpus(prefix: str) -> list[Case]:
    b = bases(prefix)
    cases: list[Case] = []
    for base in b.values():
        cases += field_cases(base)
    cases += header_cases(b)
    cases += whole_body_cases(b)
    cases += compound_cases(b, random.Random(SEED), 300)
    return cases


# -- judging an answer ------------------------------------------------------------------------


def readable_id(body: bytes) -> Any:
    """The id a JSON parser reads from the request, or NO_ID."""
    try:
        msg = orjson.loads(body)
    except orjson.JSONDecodeError:
        return NO_ID
    if isinstance(msg, dict) and _is_id(msg.get("id")):
        return msg["id"]
    return NO_ID


def judge(case: Case, status: int, content_type: str, payload: bytes, *, exact: bool,
          legacy: bool = False) -> list[str]:
    """What is wrong with this answer to `case` (empty: nothing). `legacy`: an initialize-era
    session's answer, whose results have no resultType and whose errors may travel in a 200
    event stream (L-TR)."""
    problems: list[str] = []
    if status >= 500:
        problems.append(f"status {status}")
    want = case.want if exact or not case.modern_only else None
    if want is not None and status != want.status:
        problems.append(f"status {status}, want {want.status}")
    if status == 202:
        if payload:
            problems.append("202 with a body")
        if not (want is not None and want.status == 202):
            try:
                msg = orjson.loads(case.body)
            except orjson.JSONDecodeError:
                msg = None
            if not (isinstance(msg, dict) and "id" not in msg):
                problems.append("202 for a request that is not a notification")
        return problems
    if content_type.split(";")[0].strip() == "text/event-stream":
        # The messages of the stream; an event without data (an initialize-era priming event,
        # L-TR §Resumability) carries none.
        blocks = payload.decode("utf-8", "replace").replace("\r\n", "\n").split("\n\n")
        datas = ["\n".join(line[5:].lstrip() for line in block.split("\n") if line.startswith("data:"))
                 for block in blocks]
        try:
            messages = [orjson.loads(d) for d in datas if d]
        except orjson.JSONDecodeError:
            return [*problems, f"an event that is not JSON: {payload[:200]!r}"]
        if not messages:
            return [*problems, "an empty event stream"]
        msg: Any = messages[-1]
    else:
        if content_type.split(";")[0].strip() != "application/json":
            problems.append(f"content-type {content_type!r}")
        try:
            msg = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return [*problems, f"not JSON: {payload[:120]!r}"]
    if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
        return [*problems, f"not a JSON-RPC 2.0 message: {payload[:120]!r}"]
    error = msg.get("error")
    if ("result" in msg) == ("error" in msg):
        problems.append("not exactly one of result and error")
    if "error" in msg:
        if not isinstance(error, dict):
            return [*problems, f"error is {error!r:.80}"]
        code, message = error.get("code"), error.get("message")
        if not isinstance(code, int) or isinstance(code, bool):
            problems.append(f"error.code {code!r}")
        elif code == -32603 or -31999 <= code <= -31000:
            # An internal error, or the gateway blaming the (healthy) backend, in whatever
            # status it travels (an initialize-era stream answers with 200).
            problems.append(f"code {code} ({message!r:.160})")
        elif status >= 400:
            if code not in STATUSES_OF_CODE:
                problems.append(f"code {code} outside the family of a malformed request")
            elif status not in STATUSES_OF_CODE[code]:
                problems.append(f"code {code} with status {status}")
        elif code in STATUSES_OF_CODE and not legacy:
            problems.append(f"code {code} with status {status}")
        if not isinstance(message, str) or not message:
            problems.append(f"error.message {message!r:.80}")
        if want is not None:
            if want.code is None:
                problems.append(f"error {code} {message!r:.200}, want a result")
            elif code != want.code and not (isinstance(want.code, frozenset) and code in want.code):
                problems.append(f"code {code} ({message!r:.160}), want {want.code}")
    else:
        result = msg.get("result")
        if status != 200:
            problems.append(f"a result with status {status}")
        if not isinstance(result, dict) or ("resultType" not in result and not legacy):
            problems.append(f"result {result!r:.80}")
        if want is not None and want.code is not None:
            problems.append(f"a result, want error {want.code}")
    # The id: the request's own when it could be read (basic/index §Responses), else none.
    expected = readable_id(case.body) if status not in (403, 405, 408, 413, 431) else NO_ID
    if want is not None and want.id is NO_ID:
        expected = NO_ID
    if legacy and expected is not NO_ID and "error" in msg and msg.get("id") is None:
        # Without a method it reads as the client's answer to a server request: refused with
        # an error that has no id (L-TR §Sending Messages to the Server 4).
        request = orjson.loads(case.body)
        if not isinstance(request.get("method"), str):
            expected = NO_ID
    if expected is NO_ID:
        if msg.get("id") is not None:
            problems.append(f"id {msg['id']!r:.40}, want none")
    elif msg.get("id") != expected or type(msg.get("id")) is not type(expected):
        problems.append(f"id {msg.get('id')!r:.40}, want {expected!r:.40}")
    if case.check is not None and "error" in msg and not problems:
        extra = case.check(msg)
        if extra:
            problems.append(extra)
    return problems


# -- the gateways -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def backend() -> Iterator[Scripted]:
    with Scripted("solo") as server:
        yield server


CONFIGS = {
    # Modern only, the backend's names as they are: the body is forwarded byte for byte.
    "modern": ({"server": {"max_body_bytes": MAX_BODY, "legacy_clients": False}}, ""),
    # The defaults (initialize-era clients served too) and a prefix: the gateway rewrites
    # the body and Mcp-Name for the backend.
    "dual-era": ({"server": {"max_body_bytes": MAX_BODY}}, "s__"),
}


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=list(CONFIGS))
async def gw(request, backend):
    settings, prefix = CONFIGS[request.param]
    backends = [{"name": "solo", "url": backend.url, **({"prefix": prefix} if prefix else {})}]
    async with running_gateway({**settings, "backends": backends}) as gw:
        gw.kind, gw.prefix = request.param, prefix
        yield gw


async def assert_still_serving(client: httpx.AsyncClient, gw: Any) -> None:
    response = await mcp_http.post(client, gw.url, "tools/call",
                                   {"name": f"{gw.prefix}echo", "arguments": {"text": "still here"}}, id="after")
    assert response.status_code == 200, response.text
    assert response.json() == {"jsonrpc": "2.0", "id": "after", "result": {
        "resultType": "complete", "content": [{"type": "text", "text": "solo: still here"}], "isError": False}}


async def test_no_malformed_request_gets_a_5xx_or_a_non_json_rpc_answer(gw):
    cases = corpus(gw.prefix)
    assert len(cases) > 1000
    exact = gw.kind == "modern"  # where initialize-era claims do not change the outcome
    failures: list[str] = []
    # One keep-alive client for all: an error answer must leave the connection usable.
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        for case in cases:
            response = await client.post(gw.url, content=case.body, headers=case.headers)
            problems = judge(case, response.status_code, response.headers.get("content-type", ""),
                             response.content, exact=exact)
            if problems:
                failures.append(f"{case.label}: {'; '.join(problems)}")
        await assert_still_serving(client, gw)
    assert not failures, f"{len(failures)} of {len(cases)} answers are wrong:\n" + "\n".join(failures[:80])


# -- byte level: what an HTTP client library will not send -------------------------------------


async def exchange(gw: Any, data: bytes, *, half_close: bool = False) -> bytes:
    """Write `data` on a fresh connection (optionally then shut the write side), return every
    byte the gateway sends until it closes (or stays quiet for 2 s)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    try:
        writer.write(data)
        await writer.drain()
        if half_close:
            writer.write_eof()
        chunks = []
        with contextlib.suppress(TimeoutError, ConnectionError):
            while True:
                chunk = await asyncio.wait_for(reader.read(65536), 2)
                if not chunk:
                    break
                chunks.append(chunk)
        return b"".join(chunks)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def responses(data: bytes) -> list[tuple[int, dict[bytes, bytes], bytes]]:
    """The HTTP/1.1 responses in `data`: status, headers (lower-case names), decoded body."""
    out = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        assert sep, f"an incomplete response: {data[:200]!r}"
        status_line, *lines = head.split(b"\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines)}
        if b"content-length" in headers:
            n = int(headers[b"content-length"])
            body, data = rest[:n], rest[n:]
        elif headers.get(b"transfer-encoding") == b"chunked":
            body = b""
            while True:
                size_line, _, rest = rest.partition(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                body, rest = body + rest[:size], rest[size + 2:]
                if size == 0:
                    break
            data = rest
        else:
            body, data = rest, b""
        out.append((int(status_line.split(b" ")[1]), headers, body))
    return out


def request(gw: Any, body: bytes, *, headers: list[bytes] | None = None, length: bytes | None = None,
            chunked: list[bytes] | None = None, close: bool = True) -> bytes:
    """A POST to the MCP endpoint as bytes: the valid call's headers unless `headers` replaces
    them, then Content-Length (`length`, or the body's) or a chunked body."""
    echo = f"{gw.prefix}echo".encode()
    lines = [b"POST " + gw.app.settings.server.path.encode() + b" HTTP/1.1", b"host: 127.0.0.1:%d" % gw.port]
    lines += headers if headers is not None else [
        b"content-type: application/json", b"accept: application/json, text/event-stream",
        b"mcp-protocol-version: " + V.encode(), b"mcp-method: tools/call", b"mcp-name: " + echo]
    if close:
        lines.append(b"connection: close")
    if chunked is not None:
        lines.append(b"transfer-encoding: chunked")
        payload = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunked) + b"0\r\n\r\n"
    else:
        lines.append(b"content-length: " + (length if length is not None else str(len(body)).encode()))
        payload = body
    return b"\r\n".join(lines) + b"\r\n\r\n" + payload


def valid_body(gw: Any, text: str = "raw") -> bytes:
    return orjson.dumps(mcp_http.body("tools/call", {"name": f"{gw.prefix}echo", "arguments": {"text": text}}))


def judge_raw(label: str, data: bytes, wants: list[Want | None], *, body: bytes = b"") -> list[str]:
    """The responses in `data`, exactly one per Want, each judged against it (None: the
    invariants only). No Want: the gateway must close without answering."""
    try:
        answers = responses(data)
    except (AssertionError, ValueError, IndexError) as exc:
        return [f"{label}: unreadable answer ({exc}): {data[:200]!r}"]
    problems = []
    if len(answers) != len(wants):
        problems.append(f"{label}: {len(answers)} answers {[a[0] for a in answers]}, want {len(wants)}")
    for i, (status, headers, payload) in enumerate(answers[:len(wants)]):
        case = Case(label, body, [], wants[i])
        for p in judge(case, status, headers.get(b"content-type", b"").decode("latin-1"), payload, exact=True):
            problems.append(f"{label} (answer {i + 1}): {p}")
    return problems


async def test_byte_level_malformed_requests(gw):
    body = valid_body(gw)
    std = [b"content-type: application/json", b"accept: application/json, text/event-stream",
           b"mcp-protocol-version: " + V.encode(), b"mcp-method: tools/call",
           b"mcp-name: " + f"{gw.prefix}echo".encode()]
    # A message HTTP cannot frame: refused with 400 (-32600, like the gateway's other refusals
    # of what it cannot read), no id, and the connection closed; the requests read before it
    # on the connection are answered first, in order (RFC 9112 §9.3).
    http_error = Want(400, -32600, NO_ID)
    failures: list[str] = []

    async def case(label: str, data: bytes, wants: list[Want | None], *, half_close: bool = False,
                   sent_body: bytes = b"") -> None:
        failures.extend(judge_raw(label, await exchange(gw, data, half_close=half_close), wants, body=sent_body))

    # Content-Length mismatches. Longer than the body: the client gave up (EOF), nothing to say.
    await case("content-length larger than the body, then EOF",
               request(gw, body, length=str(len(body) + 10).encode()), [], half_close=True)
    short = len(body) - 5
    # Shorter: the message it frames is answered; what follows is a message that cannot be read,
    # refused, unless the client asked to close after the first (then it is never read).
    for close in (True, False):
        keep = "" if close else ", keep-alive"
        rest = [] if close else [http_error]
        await case(f"content-length shorter than the body{keep}",
                   request(gw, body, length=str(short).encode(), close=close), [PARSE, *rest])
        await case(f"content-length 0 with a body{keep}", request(gw, body, length=b"0", close=close),
                   [PARSE, *rest])
        no_length = request(gw, body, close=close).replace(b"content-length: %d\r\n" % len(body), b"")
        await case(f"body without content-length{keep}", no_length, [PARSE, *rest])
    for value in (b"abc", b"-1", b"1e3", b"0x10", b" ", b"99999999999999999999999"):
        await case(f"content-length {value!r}", request(gw, body, length=value), [http_error])
    await case("two different content-lengths", request(gw, body, headers=std + [b"content-length: 3"]),
               [http_error])
    await case("content-length and chunked",
               request(gw, body, headers=std + [b"content-length: 5"], chunked=[body]), [http_error])
    # Chunked bodies.
    pieces = [body[:7], body[7:40], body[40:]]
    chunked = request(gw, b"", chunked=pieces)
    await case("chunked, valid", chunked, [OK], sent_body=body)
    await case("chunked, truncated JSON", request(gw, b"", chunked=pieces[:2]), [PARSE])
    await case("chunked, NUL byte in the JSON", request(gw, b"", chunked=[body[:9], b"\x00", body[9:]]), [PARSE])
    bad_size = chunked.replace(b"\r\n7\r\n", b"\r\nzz\r\n", 1)
    await case("chunked, invalid chunk size", bad_size, [http_error])
    await case("chunked, invalid chunk size after a valid request",
               request(gw, body, close=False) + bad_size, [OK, http_error], sent_body=body)
    await case("chunked, chunk size past the next chunk's framing",
               chunked.replace(b"\r\n7\r\n", b"\r\n70\r\n", 1), [http_error])
    await case("chunked, chunk size past all the data, then EOF",
               chunked.replace(b"\r\n7\r\n", b"\r\nfffff\r\n", 1), [], half_close=True)
    await case("chunked, with a trailer naming another method",
               chunked[:-2] + b"mcp-method: prompts/list\r\n\r\n", [OK], sent_body=body)
    await case("chunked, with a chunk extension", chunked.replace(b"\r\n7\r\n", b"\r\n7;name=value\r\n", 1),
               [OK], sent_body=body)
    await case("chunked, never finished, then EOF", chunked[:-5], [], half_close=True)
    # Header bytes httpx refuses to send.
    await case("header values padded with whitespace",
               request(gw, body, headers=[b"content-type:  application/json ", b"accept: */*",
                                          b"mcp-protocol-version:\t" + V.encode() + b" ",
                                          b"mcp-method:   tools/call\t",
                                          b"mcp-name: \t" + f"{gw.prefix}echo".encode() + b"  "]), [OK], sent_body=body)
    for label, line in (("control byte in mcp-name", b"mcp-name: ec\x01ho"), ("NUL in mcp-method", b"mcp-method: to\x00"),
                        ("DEL in mcp-name", b"mcp-name: ec\x7fho"), ("CR alone in a value", b"mcp-name: a\rb"),
                        ("space in a header name", b"mcp method: tools/call"),
                        ("non-ASCII header name", b"mcp-n\xe4me: echo"), ("no colon", b"mcp-name echo"),
                        ("obs-fold", b"mcp-name: a\r\n  folded")):
        await case(label, request(gw, body, headers=std + [line]), [http_error])
        await case(f"{label}, after a valid request", request(gw, body, close=False) + request(
            gw, body, headers=std + [line]), [OK, http_error], sent_body=body)
    # Expect: 100-continue, answered before any body byte is needed.
    raw_answer = await exchange(gw, request(gw, body, headers=std + [b"expect: 100-continue"]))
    failures.extend(judge_raw("expect 100-continue", raw_answer.removeprefix(b"HTTP/1.1 100 Continue\r\n\r\n"),
                              [OK], body=body))
    # Pipelined: a malformed request between two valid ones on one connection.
    await case("pipelined valid, malformed, valid",
               request(gw, body, close=False) + request(gw, b"{oops", close=False) + request(gw, body),
               [OK, PARSE, OK], sent_body=body)
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        await assert_still_serving(client, gw)
    assert not failures, "\n".join(failures)


# -- the same endpoint, initialize-era clients (dual-era gateway) -------------------------------


@pytest.mark.parametrize("gw", ["dual-era"], indirect=True)  # the one serving such clients
async def test_initialize_era_session_requests_never_get_a_5xx(gw):
    """A legacy client's session requests, every field mutated: the dual-era gateway claims them
    before modern validation (digest §h.9), so they take a path of their own to the backend."""
    legacy = "2025-11-25"
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        init = await client.post(gw.url, json={
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": legacy, "capabilities": {}, "clientInfo": {"name": "fuzz", "version": "1"}}},
            headers={"accept": "application/json, text/event-stream"})
        assert init.status_code == 200, init.text
        session = init.headers["mcp-session-id"]
        hs = [(b"content-type", b"application/json"), (b"accept", b"application/json, text/event-stream"),
              (b"mcp-protocol-version", legacy.encode()), (b"mcp-session-id", session.encode())]
        base = Base("legacy", "tools/call", {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                             "params": {"name": f"{gw.prefix}echo", "arguments": {"text": "x"}, "_meta": {}}}, hs)
        base.paths = [("jsonrpc",), ("id",), ("method",), ("params",), ("params", "name"), ("params", "arguments"),
                      ("params", "arguments", "text"), ("params", "_meta"), ("params", "_meta", "progressToken")]
        failures = []
        cases = list(field_cases(base))
        cases += [Case(f"legacy: {c.label}", c.body, hs) for c in whole_body_cases(bases(gw.prefix))]
        for case in cases:
            case.want = None  # the initialize-era rules differ; the invariants hold all the same
            response = await client.post(gw.url, content=case.body, headers=case.headers)
            problems = judge(case, response.status_code, response.headers.get("content-type", ""),
                             response.content, exact=True, legacy=True)
            if problems:
                failures.append(f"{case.label}: {'; '.join(problems)}")
        await assert_still_serving(client, gw)
    assert not failures, f"{len(failures)} of {len(cases)} answers are wrong:\n" + "\n".join(failures[:60])


# -- the fixes the fuzz found, one by one ------------------------------------------------------


@pytest.mark.parametrize(("method", "arguments"), [
    ("tools/call", []), ("tools/call", "text"), ("tools/call", 0), ("tools/call", False),
    ("prompts/get", ["a"]), ("prompts/get", 7),
])
async def test_arguments_that_are_not_an_object_are_invalid_params(gw, method, arguments):
    # Forwarded, they reached the backend as something no tool takes (the scripted one failed
    # with a 500, so the client got a 502), or passed the x-mcp-header check unexamined.
    name = f"{gw.prefix}{'echo' if method == 'tools/call' else 'greet'}"
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        response = await mcp_http.post(client, gw.url, method, {"name": name, "arguments": arguments}, id="args")
    case = Case("arguments", orjson.dumps({"id": "args"}), [], bad_params())
    assert judge(case, response.status_code, response.headers["content-type"], response.content, exact=True) == []
    assert "arguments" in response.json()["error"]["message"]


@pytest.mark.parametrize("where", ["_meta", "arguments", "progressToken"])
async def test_nesting_deeper_than_the_gateway_encodes_is_invalid_request(gw, where):
    # Prefixed (the body rewritten), or quoted in an error message, it was a 500.
    body = mcp_http.body("tools/call", {"name": f"{gw.prefix}regional", "arguments": {"region": "x"}})
    deep = orjson.Fragment(_deep(MAX_DEPTH))
    if where == "_meta":
        body["params"]["_meta"][PV] = deep
    elif where == "arguments":
        body["params"]["arguments"]["region"] = deep
    else:
        body["params"]["_meta"]["progressToken"] = deep
    headers = _headers("tools/call", f"{gw.prefix}regional", **{"mcp-param-region": "x"})
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        response = await client.post(gw.url, content=orjson.dumps(body), headers=headers)
    assert response.status_code == 400, response.text
    assert response.json()["id"] == 1 and response.json()["error"]["code"] == -32600
    assert f"deeper than {MAX_DEPTH} levels" in response.json()["error"]["message"]


@pytest.mark.parametrize("gw", ["dual-era"], indirect=True)  # the one serving such clients
async def test_initialize_era_errors_keep_a_readable_id_and_refuse_deep_nesting(gw):
    hs = {"accept": "application/json, text/event-stream", "content-type": "application/json",
          "mcp-protocol-version": "2025-11-25"}
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        init = await client.post(gw.url, headers=hs, json={
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
        hs["mcp-session-id"] = init.headers["mcp-session-id"]
        # "jsonrpc" wrong: the id could be read, so the error carries it (L-BASIC §Responses).
        wrong = await client.post(gw.url, headers=hs, json={"jsonrpc": "1.0", "id": "v1", "method": "tools/list"})
        assert wrong.status_code == 400 and wrong.json()["id"] == "v1"
        assert wrong.json()["error"]["code"] == -32600
        # Nested deeper than the gateway encodes: refused before its translation (was a 500).
        call = {"jsonrpc": "2.0", "id": "deep", "method": "tools/call",
                "params": {"name": f"{gw.prefix}echo", "arguments": {"text": orjson.Fragment(_deep(MAX_DEPTH))}}}
        deep = await client.post(gw.url, headers=hs, content=orjson.dumps(call))
        assert deep.status_code == 400, deep.text
        assert deep.json()["id"] == "deep" and deep.json()["error"]["code"] == -32600


# The malformed standard `_meta` values an independent fuzzer sent to the list methods: each
# reached every backend, each backend refused it with -32602, and the client was told that no
# backend answered (502 -31001). Now the front door refuses them, naming the field.
MALFORMED_META = [
    (INFO, " ", INFO), (INFO, 42, INFO), (INFO, {"name": 5, "version": []}, f"{INFO}'].name"),
    (INFO, {"a": 1}, f"{INFO}'].name"), ("progressToken", {"a": 1}, "progressToken"),
    ("progressToken", {}, "progressToken"),
]
LIST_AND_CALL = ["tools/list", "prompts/list", "resources/list", "resources/templates/list", "tools/call"]


@pytest.mark.parametrize("method", LIST_AND_CALL)
@pytest.mark.parametrize(("key", "value", "named"), MALFORMED_META,
                         ids=[f"{k.rsplit('/', 1)[-1]}={v!r}" for k, v, _ in MALFORMED_META])
async def test_malformed_standard_meta_is_the_clients_invalid_params(gw, backend, method, key, value, named):
    name = f"{gw.prefix}echo" if method == "tools/call" else None
    params = {"name": name, "arguments": {"text": "x"}} if name else {}
    # A modern HTTP backend sees the client's id unchanged: one no other request uses tells
    # this request apart from background work (readiness checks, index refreshes).
    request_id = f"meta-check-{method}-{key}-{value!r}"
    body = mcp_http.body(method, params, id=request_id)
    body["params"]["_meta"][key] = value
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        response = await client.post(gw.url, content=orjson.dumps(body), headers=_headers(method, name))
    case = Case(f"{method} {key}", orjson.dumps(body), [], bad_params())
    assert judge(case, response.status_code, response.headers["content-type"], response.content, exact=True) == []
    error = response.json()["error"]
    assert named in error["message"] and named in error["data"]["field"], error
    # Refused at the front door: no backend saw it.
    assert [c for c in await backend.calls() if c["id"] == request_id] == []


@pytest.mark.parametrize("gw", ["dual-era"], indirect=True)  # the one serving such clients
@pytest.mark.parametrize(("params", "field"), [
    ({"clientInfo": {"name": 5, "version": []}, "capabilities": {}}, "params.clientInfo.name"),
    ({"clientInfo": 42, "capabilities": {}}, "params.clientInfo"),
    ({"clientInfo": {"name": "c", "version": "1"}, "capabilities": {"sampling": True}},
     "params.capabilities.sampling"),
])
async def test_an_initialize_era_client_declaring_malformed_meta_is_refused_once(gw, params, field):
    # What it declares becomes every later request's _meta: refused at initialize, naming the
    # field, instead of failing each request of the session.
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        response = await client.post(gw.url, headers={"accept": "application/json, text/event-stream"}, json={
            "jsonrpc": "2.0", "id": "init", "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", **params}})
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["id"] == "init" and body["error"]["code"] == -32602
    assert body["error"]["data"] == {"field": field}
    assert "mcp-session-id" not in response.headers
