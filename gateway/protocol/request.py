"""The body phase: turn one POSTed body plus its headers into a validated `Call`.

The checks run in the order of digest §a.5 so that each failure maps to exactly one row of the
outcome table (§a.3): parse → single message → header presence → header/body equality →
version → required `_meta` → method exists. Origin and authentication run earlier, as ASGI
policies, because they need no body.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import orjson

from gateway.protocol import headers as h
from gateway.protocol import jsonrpc as rpc
from gateway.protocol import meta
from gateway.protocol.methods import METHODS, MethodSpec
from gateway.protocol.principal import ANONYMOUS, Principal
from gateway.protocol.request_meta import check_request_meta
from gateway.protocol.versions import MODERN_VERSIONS

Headers = dict[str, str]
"""Request headers, names lower-cased, values with surrounding whitespace trimmed."""

# A body this short cannot nest deeper than the gateway encodes (rpc.too_deep): the usual
# request pays one length comparison for that check.
_SHALLOW = 2 * rpc.MAX_DEPTH


@dataclass(slots=True)
class Call:
    """One validated client request (or notification) on its way to a backend."""

    id: rpc.RequestId | None
    method: str
    params: dict[str, Any]
    version: str
    spec: MethodSpec | None
    # The decoded `Mcp-Name` (== params.name or params.uri) for the three name methods.
    name: str | None
    # The body exactly as received (what an MRTR retry forwarded to another replica carries;
    # backends get `wire_body()`).
    body: bytes
    headers: Headers
    # Who is calling: the authentication policy's verdict (`scope["auth"]`), from parsing on.
    # Every consumer reads its keys (protocol/principal.py); nothing derives the caller again.
    principal: Principal = ANONYMOUS

    @property
    def is_notification(self) -> bool:
        return self.id is None

    @property
    def stream_only(self) -> bool:
        """Whether the answer is a stream that stays open (`MethodSpec.stream_only`)."""
        return self.spec is not None and self.spec.stream_only

    @property
    def meta(self) -> dict[str, Any]:
        m = self.params.get("_meta")
        return m if isinstance(m, dict) else {}

    @property
    def client_capabilities(self) -> dict[str, Any]:
        caps = self.meta.get(meta.CLIENT_CAPABILITIES)
        return caps if isinstance(caps, dict) else {}

    def declares_extension(self, name: str) -> bool:
        """Whether the client declared extension `name` (`capabilities.extensions`). The value is
        the client's own: only an object declares anything (`in` on a number raises, on a
        string it matches by substring)."""
        extensions = self.client_capabilities.get("extensions")
        return isinstance(extensions, dict) and name in extensions

    @property
    def log_level(self) -> str | None:
        return self.meta.get(meta.LOG_LEVEL)

    def with_name(self, name: str) -> Call:
        """The same call addressed to `name` (tool/prompt name or URI) on the backend."""
        assert self.spec is not None and self.spec.name_field is not None
        if name == self.name:
            return self
        params = dict(self.params)
        params[self.spec.name_field] = name
        return replace(self, params=params, name=name)

    def with_params(self, params: dict[str, Any]) -> Call:
        return replace(self, params=params)

    def wire_body(self) -> bytes:
        """The JSON-RPC body to send upstream: the message the gateway validated, encoded again,
        never the client's bytes. A body can say a thing two ways (a key twice, `"method"` and
        `"\\u006dethod"`): orjson keeps the last, a first-wins parser upstream the first, and the
        backend would act on another method or name than the one the gateway checked against
        `Mcp-Method`/`Mcp-Name`, its routes and the token's scopes. Encoding again is cheap
        beside the request (bench/README.md "Profile")."""
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": self.method, "params": self.params}
        if self.id is not None:
            msg["id"] = self.id
        return orjson.dumps(msg)

    def param_header_values(self) -> dict[str, str]:
        """The `Mcp-Param-*` headers sent by the client, keyed by lower-cased header name."""
        return {k: v for k, v in self.headers.items() if k.startswith(h.PARAM_PREFIX)}


def parse_call(body: bytes, headers: Headers, principal: Principal = ANONYMOUS) -> Call:
    """Validate a POSTed body against its headers (digest §a.5 steps 3–9), as sent by
    `principal`."""
    # 3. JSON parse.
    try:
        msg = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise rpc.parse_error(str(exc)) from None

    # 4. A single request or notification; no batches, no responses.
    if isinstance(msg, list):
        raise rpc.invalid_request("batches are not supported; send one JSON-RPC message per POST")
    if not isinstance(msg, dict):
        raise rpc.invalid_request("the body must be a JSON-RPC request object")
    raw_id = msg.get("id")
    request_id = raw_id if isinstance(raw_id, (str, int)) and not isinstance(raw_id, bool) else None
    if len(body) > _SHALLOW and rpc.too_deep(body, msg):
        raise rpc.invalid_request(f"the message nests deeper than {rpc.MAX_DEPTH} levels", request_id)
    if msg.get("jsonrpc") != "2.0":
        raise rpc.invalid_request('"jsonrpc" must be "2.0"', request_id)
    method = msg.get("method")
    if not isinstance(method, str):
        if "result" in msg or "error" in msg:
            raise rpc.invalid_request("clients must not send JSON-RPC responses", request_id)
        raise rpc.invalid_request('"method" must be a string', request_id)
    if "id" in msg and request_id is None:
        raise rpc.invalid_request('"id" must be a string or an integer, never null', None)
    params = msg.get("params", {})
    if not isinstance(params, dict):
        raise rpc.invalid_request('"params" must be an object', request_id)

    spec = METHODS.get(method)
    if request_id is None:
        # Notifications: the revision defines none from client to server over HTTP and the
        # header rules for them are undefined (SHTTP); accept and let the endpoint say 202.
        return Call(None, method, params, headers.get(h.PROTOCOL_VERSION, ""), spec, None, body, headers,
                    principal)

    # 5. Required headers present.
    version_header = headers.get(h.PROTOCOL_VERSION)
    if version_header is None:
        raise rpc.header_mismatch("required header MCP-Protocol-Version is missing", request_id, "MCP-Protocol-Version")
    method_header = headers.get(h.METHOD)
    if method_header is None:
        raise rpc.header_mismatch("required header Mcp-Method is missing", request_id, "Mcp-Method")
    name_header = None
    if spec is not None and spec.name_field is not None:
        name_header = headers.get(h.NAME)
        if name_header is None:
            raise rpc.header_mismatch(f"required header Mcp-Name is missing for {method}", request_id, "Mcp-Name")

    # 6. Header values equal body values.
    if method_header != method:
        raise rpc.header_mismatch(
            f"Mcp-Method header value {method_header!r} does not match body method {method!r}", request_id, "Mcp-Method"
        )
    meta_obj = params.get("_meta")
    meta_obj = meta_obj if isinstance(meta_obj, dict) else {}
    body_version = meta_obj.get(meta.PROTOCOL_VERSION)
    if body_version is not None and body_version != version_header:
        raise rpc.header_mismatch(
            f"MCP-Protocol-Version header value {version_header!r} does not match "
            f"_meta[{meta.PROTOCOL_VERSION!r}] {body_version!r}",
            request_id,
            "MCP-Protocol-Version",
        )
    name = None
    if name_header is not None and spec is not None and spec.name_field is not None:
        try:
            decoded = h.decode_value(name_header)
        except h.HeaderValueError as exc:
            raise rpc.header_mismatch(f"Mcp-Name header {exc}", request_id, "Mcp-Name") from None
        body_name = params.get(spec.name_field)
        if not isinstance(body_name, str):
            raise rpc.invalid_params(f'"params.{spec.name_field}" must be a string', request_id)
        if decoded != body_name:
            raise rpc.header_mismatch(
                f"Mcp-Name header value {decoded!r} does not match body value {body_name!r}", request_id, "Mcp-Name"
            )
        name = body_name

    # 7. A version the gateway implements.
    if version_header not in MODERN_VERSIONS:
        raise rpc.unsupported_version(version_header, list(MODERN_VERSIONS), request_id)

    # 8. Required `_meta` fields (basic/index §_meta).
    if body_version is None:
        raise rpc.invalid_params(f'missing required "_meta[{meta.PROTOCOL_VERSION!r}]"', request_id)
    if not isinstance(meta_obj.get(meta.CLIENT_CAPABILITIES), dict):
        raise rpc.invalid_params(f'missing required "_meta[{meta.CLIENT_CAPABILITIES!r}]" object', request_id)
    # The other standard fields, when present, hold what the schema says (400 -32602 naming
    # the field): the client's mistake, never forwarded for a fleet to refuse.
    check_request_meta(meta_obj, request_id)

    # 9. The method exists. (Capability gating needs the fleet and happens at routing.)
    if spec is None:
        raise rpc.method_not_found(method, request_id)

    return Call(request_id, method, params, version_header, spec, name, body, headers, principal)


def check_param_headers(call: Call, annotations: tuple[h.ParamHeader, ...]) -> None:
    """Validate the `Mcp-Param-*` headers of a `tools/call` against the tool's annotations
    (SHTTP §Server Behavior for Custom Headers): a recognized header must decode and equal the
    argument; an argument present in the body requires its header."""
    arguments = call.params.get("arguments") or {}
    for ann in annotations:
        raw = call.headers.get(ann.header)
        value = h.extract(arguments, ann.path)
        if raw is None:
            if value is not None:
                raise rpc.header_mismatch(
                    f"header Mcp-Param-{ann.name} is required: argument {'.'.join(ann.path)!r} is present in the body",
                    call.id,
                    f"Mcp-Param-{ann.name}",
                )
            continue
        try:
            decoded = h.decode_value(raw)
        except h.HeaderValueError as exc:
            raise rpc.header_mismatch(f"Mcp-Param-{ann.name} header {exc}", call.id, f"Mcp-Param-{ann.name}") from None
        if value is None or not h.values_equal(decoded, value):
            raise rpc.header_mismatch(
                f"Mcp-Param-{ann.name} header value {decoded!r} does not match argument "
                f"{'.'.join(ann.path)!r} value {value!r}",
                call.id,
                f"Mcp-Param-{ann.name}",
            )
