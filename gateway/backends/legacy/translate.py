"""Modern ⇄ legacy mapping of requests, results and errors (digest §h.4, §h.7, §h.8, §g).

Pure functions: no I/O, so every rule is unit-tested on its own.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.protocol import jsonrpc as rpc
from gateway.protocol import meta
from gateway.protocol.methods import METHODS
from gateway.protocol.versions import MODERN_VERSIONS

Message = dict[str, Any]

# Legacy server-to-client requests that MRTR can carry, and the client capability each needs
# (digest §f: InputRequest = elicitation | sampling | roots).
INPUT_METHODS: dict[str, str] = {
    "elicitation/create": "elicitation",
    "sampling/createMessage": "sampling",
    "roots/list": "roots",
}
_MODERN_META_PREFIX = "io.modelcontextprotocol/"
# Legacy URLElicitationRequiredError (2025-11-25 client/elicitation §URL mode); no modern code.
URL_ELICITATION_REQUIRED = -32042
# Server capabilities that mean the same in both eras (digest §g); legacy `tasks` and
# `experimental` are not advertised to modern clients.
_KEPT_CAPABILITIES = ("tools", "prompts", "resources", "completions", "logging")


# The sub-capabilities a legacy server is bound by (2025-11-25 client/sampling: no
# tool-enabled sampling without `sampling.tools`, no `includeContext` other than "none"
# without `sampling.context`; client/elicitation: the modes).
_SAMPLING_FLAGS = ("context", "tools")
_ELICITATION_MODES = ("form", "url")


def session_capabilities(client_capabilities: dict[str, Any]) -> dict[str, Any]:
    """The legacy ClientCapabilities a session declares for clients with these modern ones.

    Only what MRTR can carry back to the client is declared (§h.5 strategy B), so a backend
    never asks for input the client could not give. The result is reduced to the few facts
    that change what a legacy server may send — sampling (and its `context`/`tools` flags),
    the elicitation modes, roots yes/no — and nothing else the client wrote, because it keys
    the session pool: copied verbatim, every distinct client object would cost a backend
    session and an initialize and evict other callers' warm sessions. At most 5 × 4 × 2
    sets exist. `roots.listChanged` is never declared: modern clients have no
    roots/list_changed notification (CL major).
    """
    declared: dict[str, Any] = {}
    sampling = client_capabilities.get("sampling")
    if isinstance(sampling, dict):
        declared["sampling"] = {flag: {} for flag in _SAMPLING_FLAGS if flag in sampling}
    elicitation = client_capabilities.get("elicitation")
    if isinstance(elicitation, dict):
        # ELICIT: `{}` means form only, in both eras, so it is declared as `{"form": {}}`.
        modes = [mode for mode in _ELICITATION_MODES if mode in elicitation] or ["form"]
        declared["elicitation"] = {mode: {} for mode in modes}
    if isinstance(client_capabilities.get("roots"), dict):
        declared["roots"] = {}
    return declared


def pool_key(capabilities: dict[str, Any]) -> str:
    return orjson.dumps(capabilities, option=orjson.OPT_SORT_KEYS).decode()


def legacy_params(params: dict[str, Any]) -> dict[str, Any]:
    """Params for the backend: the modern `_meta` keys and the MRTR fields removed (§h.4).
    `progressToken` is re-minted by the session; trace context and user keys stay."""
    out = {k: v for k, v in params.items() if k not in ("inputResponses", "requestState", "_meta")}
    meta_in = params.get("_meta")
    if isinstance(meta_in, dict):
        kept = {k: v for k, v in meta_in.items()
                if not k.startswith(_MODERN_META_PREFIX) and k != meta.PROGRESS_TOKEN}
        if kept:
            out["_meta"] = kept
    return out


def result_for_client(message: Message, request_id: Any, method: str, *, backend: str,
                      server_info: dict[str, Any] | None, ttl_ms: int, cache_scope: str) -> Message:
    """A legacy final response made modern: the client's id, `resultType`, caching hints on
    cacheable methods (legacy backends send none; §e says they are required), serverInfo in
    `_meta`, and -32002 turned into -32602 (§h.7)."""
    result = message.get("result")
    if isinstance(result, dict):
        out = dict(result)
        out["resultType"] = "complete"
        spec = METHODS.get(method)
        if spec is not None and spec.cacheable:
            out.setdefault("ttlMs", ttl_ms)
            out.setdefault("cacheScope", cache_scope)
        if server_info is not None:
            meta_out = dict(out.get("_meta") or {})
            meta_out.setdefault(meta.SERVER_INFO, server_info)
            out["_meta"] = meta_out
        return {"jsonrpc": "2.0", "id": request_id, "result": out}
    error = message.get("error")
    if isinstance(error, dict):
        error = dict(error)
        if error.get("code") == rpc.LEGACY_RESOURCE_NOT_FOUND:
            error["code"] = rpc.INVALID_PARAMS
        elif error.get("code") == URL_ELICITATION_REQUIRED:
            # URLElicitationRequiredError has no modern form without MRTR (BASIC); say it plainly.
            error = {"code": rpc.INTERNAL_ERROR,
                     "message": f"Backend requires a URL elicitation: {error.get('message', '')}".rstrip(": ")}
        return {"jsonrpc": "2.0", "id": request_id, "error": error}
    # `result: "text"`, `error: "text"`, neither: not a JSON-RPC response the client can use.
    return rpc.backend_protocol_error(
        backend, f"its response to {method} has neither a result object nor an error object", request_id
    ).to_message()


def modern_capabilities(legacy: dict[str, Any]) -> dict[str, Any]:
    caps: dict[str, Any] = {}
    for key in _KEPT_CAPABILITIES:
        value = legacy.get(key)
        if isinstance(value, dict):
            caps[key] = {flag: v for flag, v in value.items() if flag in ("listChanged", "subscribe") and v} \
                if key in ("tools", "prompts", "resources") else {}
    return caps


def discover_result(initialize_result: dict[str, Any], *, ttl_ms: int, cache_scope: str) -> dict[str, Any]:
    """A DiscoverResult synthesized from the session's InitializeResult (digest §g)."""
    result: dict[str, Any] = {
        "supportedVersions": list(MODERN_VERSIONS),
        "capabilities": modern_capabilities(initialize_result.get("capabilities") or {}),
        "resultType": "complete",
        "ttlMs": ttl_ms,
        "cacheScope": cache_scope,
    }
    if isinstance(initialize_result.get("instructions"), str):
        result["instructions"] = initialize_result["instructions"]
    if isinstance(initialize_result.get("serverInfo"), dict):
        result["_meta"] = {meta.SERVER_INFO: initialize_result["serverInfo"]}
    return result


def input_request(message: Message) -> dict[str, Any]:
    """A legacy backend request as a modern InputRequest: `{method, params}`, without the
    fields modern dropped (URL-mode `elicitationId`, CL minor 11; the legacy `task` field)."""
    params = dict(message.get("params") or {})
    params.pop("elicitationId", None)
    params.pop("task", None)
    return {"method": message["method"], "params": params}


def url_elicitations(error: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The URL elicitations of a legacy -32042 error as modern InputRequests, keyed `url<i>`:
    `{mode: "url", message, url}`, without the legacy `elicitationId` (CL minor 11). Entries
    without a URL are skipped: there is nothing a client could open."""
    data = error.get("data")
    items = data.get("elicitations") if isinstance(data, dict) else None
    requests: dict[str, dict[str, Any]] = {}
    for index, item in enumerate(items if isinstance(items, list) else ()):
        if not isinstance(item, dict) or not isinstance(item.get("url"), str):
            continue
        message = item.get("message") if isinstance(item.get("message"), str) else "Please open this URL"
        requests[f"url{index}"] = {"method": "elicitation/create",
                                   "params": {"mode": "url", "message": message, "url": item["url"]}}
    return requests


def missing_capability(message: Message, client_capabilities: dict[str, Any]) -> dict[str, Any] | None:
    """The capability this client lacks for this backend request, in the shape of
    `data.requiredCapabilities`; None when the client can answer it (digest §f)."""
    method = message.get("method")
    capability = INPUT_METHODS.get(method) if isinstance(method, str) else None
    if capability is None:
        return {"experimental": {}}
    declared = client_capabilities.get(capability)
    if not isinstance(declared, dict):
        if capability == "elicitation" and _elicitation_mode(message) == "url":
            return {"elicitation": {"url": {}}}
        return {capability: {}}
    if capability == "elicitation":
        mode = _elicitation_mode(message)
        # ELICIT: `elicitation: {}` means form only.
        supported = {m for m in ("form", "url") if m in declared} or {"form"}
        if mode not in supported:
            return {"elicitation": {mode: {}}}
    return None


def _elicitation_mode(message: Message) -> str:
    mode = (message.get("params") or {}).get("mode")
    return mode if isinstance(mode, str) else "form"


def log_level_passes(level: Any, threshold: str) -> bool:
    """LOG: emit at or above the requested level."""
    try:
        return meta.LOG_LEVELS.index(level) >= meta.LOG_LEVELS.index(threshold)
    except ValueError:
        return False
