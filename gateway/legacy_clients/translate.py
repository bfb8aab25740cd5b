"""Between the eras, client side: a legacy request becomes the modern request a modern client
would have sent, and the modern answer becomes what a legacy client expects.

The session supplies what modern carries per request (digest §0, §h.9): the protocol version,
the client's capabilities (declared once in `initialize`), its log level (set once with
`logging/setLevel`). The synthesized request then runs the same body-phase validation as any
modern request (`parse_call`), so a legacy client can reach nothing a modern one cannot.

Pure functions: no I/O, no session mutation.
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson

from gateway.protocol import headers as h
from gateway.protocol import jsonrpc as rpc
from gateway.protocol import meta
from gateway.protocol.request import Call, parse_call
from gateway.protocol.versions import LATEST_LEGACY, LATEST_MODERN, LEGACY_VERSIONS, OLDEST_LEGACY

Message = dict[str, Any]

# Legacy methods that are modern methods too and go through the Dispatcher unchanged in
# meaning (digest §h.4 read backwards). Everything else a legacy client may send is answered
# by the gateway itself (ping, logging/setLevel, resources/(un)subscribe) or does not exist.
FORWARDED = frozenset(
    {
        "tools/list",
        "tools/call",
        "prompts/list",
        "prompts/get",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "completion/complete",
    }
)

# Result fields that only the modern revision defines (schema `Result`, `CacheableResult`).
_MODERN_RESULT_FIELDS = ("resultType", "ttlMs", "cacheScope")

# The server-to-client requests a legacy client may receive, and the capability each needs.
INPUT_METHODS = {
    "elicitation/create": "elicitation",
    "sampling/createMessage": "sampling",
    "roots/list": "roots",
}


def negotiate_version(requested: Any, *, old_transport: bool = False) -> str:
    """L-LC §Version Negotiation: echo the client's version if supported, else our latest.
    Over HTTP+SSE (sse_front.py) 2024-11-05 is supported too: it is that transport's revision,
    and its messages are a subset of the later ones."""
    supported = (*LEGACY_VERSIONS, OLDEST_LEGACY) if old_transport else LEGACY_VERSIONS
    return requested if isinstance(requested, str) and requested in supported else LATEST_LEGACY


def legacy_capabilities(fleet: dict[str, Any], *, notifications: bool) -> dict[str, Any]:
    """The `ServerCapabilities` of an `InitializeResult`, from the fleet's merged discover.

    `logging` is always offered: the gateway itself keeps the session's level and turns it
    into each request's modern `logLevel`. `subscribe` / `listChanged` need the subscription
    hub, which feeds the session's streams (`notifications` says whether it exists).
    """
    caps: dict[str, Any] = {"logging": {}}
    for key in ("tools", "prompts", "resources"):
        if isinstance(fleet.get(key), dict):
            entry: dict[str, Any] = {}
            if notifications:
                for flag in ("listChanged", "subscribe"):
                    if fleet[key].get(flag):
                        entry[flag] = True
            caps[key] = entry
    if "completions" in fleet:
        caps["completions"] = {}
    return caps


def modern_call(
    message: Message,
    *,
    request_id: rpc.RequestId,
    client_capabilities: dict[str, Any],
    client_info: dict[str, Any] | None,
    log_level: str | None,
    param_headers: tuple[h.ParamHeader, ...] = (),
    extra_params: dict[str, Any] | None = None,
) -> Call:
    """The modern request for a legacy `message`, validated like any client's (raises McpError)."""
    method = message["method"]
    params = message.get("params")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise rpc.invalid_request('"params" must be an object', message.get("id"))
    params = {**params, **(extra_params or {})}
    legacy_meta = params.get("_meta")
    modern_meta: dict[str, Any] = dict(legacy_meta) if isinstance(legacy_meta, dict) else {}
    modern_meta[meta.PROTOCOL_VERSION] = LATEST_MODERN
    modern_meta[meta.CLIENT_CAPABILITIES] = client_capabilities
    if client_info is not None:
        modern_meta[meta.CLIENT_INFO] = client_info
    if log_level is not None:
        modern_meta[meta.LOG_LEVEL] = log_level
    params["_meta"] = modern_meta
    headers = {h.PROTOCOL_VERSION: LATEST_MODERN, h.METHOD: method}
    name = params.get("uri") if method == "resources/read" else params.get("name")
    if method in ("tools/call", "prompts/get", "resources/read"):
        if not isinstance(name, str):
            field = "uri" if method == "resources/read" else "name"
            raise rpc.invalid_params(f'"params.{field}" must be a string', message.get("id"))
        headers[h.NAME] = h.encode_value(name)
    arguments = params.get("arguments")
    for annotation in param_headers:
        text = h.header_text(h.extract(arguments, annotation.path))
        if text is not None:
            headers[annotation.header] = h.encode_value(text)
    body = orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
    return parse_call(body, headers)


def legacy_result(result: dict[str, Any]) -> dict[str, Any]:
    """A modern result without the fields the legacy schemas do not have."""
    out = {k: v for k, v in result.items() if k not in _MODERN_RESULT_FIELDS}
    result_meta = out.get("_meta")
    if isinstance(result_meta, dict) and meta.SERVER_INFO in result_meta:
        rest = {k: v for k, v in result_meta.items() if k != meta.SERVER_INFO}
        if rest:
            out["_meta"] = rest
        else:
            del out["_meta"]
    return out


def legacy_response(message: Message, legacy_id: rpc.RequestId) -> Message:
    """The final modern response, re-addressed to the legacy request id.

    Errors pass unchanged: resource-not-found stays -32602, which 2025-11-25 clients accept
    (L-RES recommends -32002 but clients treat any error as the failure), and the gateway's
    own -31xxx codes name the failing backend in either era.
    """
    result = message.get("result")
    if isinstance(result, dict):
        return rpc.result_message(legacy_id, legacy_result(result))
    error = message.get("error")
    if not isinstance(error, dict):
        error = {"code": rpc.INTERNAL_ERROR, "message": "Malformed response from the gateway's dispatcher"}
    return {"jsonrpc": "2.0", "id": legacy_id, "error": error}


def legacy_input_request(
    method: str, params: Any, *, protocol_version: str, client_capabilities: dict[str, Any]
) -> dict[str, Any]:
    """The params of the server-to-client request that asks a legacy client for one modern
    `InputRequest` (digest §h.5 read backwards). Raises McpError when the client did not
    declare what the request needs: the gateway never sends an unnegotiated request (L-LC)."""
    capability = INPUT_METHODS.get(method)
    if capability is None:
        raise rpc.McpError(rpc.INTERNAL_ERROR, f"The backend asked for unknown input {method!r}")
    if not isinstance(client_capabilities.get(capability), dict):
        raise rpc.missing_capability({capability: {}})
    out = dict(params) if isinstance(params, dict) else {}
    if method == "elicitation/create":
        mode = out.get("mode", "form")
        if mode == "url":
            elicitation = client_capabilities["elicitation"]
            if protocol_version != "2025-11-25" or not isinstance(elicitation.get("url"), dict):
                raise rpc.missing_capability({"elicitation": {"url": {}}})
            # 2025-11-25 URL elicitation requires an id; modern dropped it (digest §0).
            out.setdefault("elicitationId", secrets.token_urlsafe(16))
        elif protocol_version != "2025-11-25":
            out.pop("mode", None)  # 2025-06-18 elicitation has no mode: form is all there is
    return out


def input_response(method: str, answer: Message) -> Any:
    """The modern `inputResponses` entry for the client's answer to one request: its result.
    An error from the client ends the call with that error (there is no modern way to say
    "the client refused"), except for elicitation, whose refusal is a result."""
    if "result" in answer:
        return answer["result"]
    error = answer.get("error") if isinstance(answer.get("error"), dict) else {}
    if method == "elicitation/create":
        return {"action": "cancel"}
    raise rpc.McpError(
        int(error.get("code", rpc.INTERNAL_ERROR)),
        f"The client refused {method}: {error.get('message', 'no reason given')}",
        data=error.get("data"),
    )
