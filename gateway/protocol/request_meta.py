"""The standard `_meta` fields of a request, checked at the front door (schema
`RequestMetaObject`; spec: basic/index §_meta).

A value the schema rules out at a reserved key is the client's mistake: it gets 400 -32602
naming the field, whichever method carries it. Forwarded, the same request reached every
backend of a fan-out, each refused it with -32602, and the client was told that no backend
answered (a 502 blaming a healthy fleet).

What is checked, each only when present (the two required fields are checked by
`request.parse_call` before this runs):

- `io.modelcontextprotocol/clientInfo`: an `Implementation` (`name` and `version` strings
  required; `title`, `description`, `websiteUrl` strings; `icons` an array of `Icon`).
- `progressToken`: a `ProgressToken`, a string or an integer.
- `io.modelcontextprotocol/logLevel`: a `LoggingLevel` (LOG: an unknown level SHOULD be -32602).
- `io.modelcontextprotocol/clientCapabilities`: each capability the schema names is an object
  (and its own named members too); other keys are the client's to define.
- `traceparent`, `tracestate`, `baggage`: strings (their W3C formats are the tracer's to judge:
  a traceparent it cannot parse starts a new trace, W3C Trace Context §3.2).

The common request (`clientCapabilities: {}`, a clientInfo with two strings) costs a few dict
lookups and type checks: this runs on every request (bench/README.md "`_meta` validation").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.protocol import jsonrpc as rpc
from gateway.protocol import meta

_LEVELS = frozenset(meta.LOG_LEVELS)
_THEMES = frozenset({"light", "dark"})
# ClientCapabilities members whose value the schema makes an object, and their own members
# that it makes objects too (`experimental` and `extensions` map names to objects).
_CAPABILITY_MEMBERS: dict[str, tuple[str, ...]] = {
    "elicitation": ("form", "url"),
    "sampling": ("context", "tools"),
    "roots": (),
    "experimental": (),
    "extensions": (),
}
_MAPS_TO_OBJECTS = frozenset({"experimental", "extensions"})


class _Invalid(Exception):
    """A field and what is wrong with it, turned into -32602 by `check_request_meta`."""

    def __init__(self, field: str, problem: str) -> None:
        self.field, self.problem = field, problem


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "…"


def _string(field: str, value: Any) -> None:
    if value.__class__ is not str and not isinstance(value, str):
        raise _Invalid(field, f"must be a string, not {_describe(value)}")


# Field names are built only when a check fails: the valid request pays no string formatting.


def _implementation(field: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise _Invalid(field, f'must be an Implementation object with "name" and "version" strings, '
                              f"not {_describe(value)}")
    name, version = value.get("name"), value.get("version")
    if name.__class__ is str and version.__class__ is str and len(value) == 2:
        return  # the usual {"name", "version"}: nothing optional to look at
    for required in ("name", "version"):
        if required not in value:
            raise _Invalid(f"{field}.{required}", "is required (a string)")
        if not isinstance(value[required], str):
            _string(f"{field}.{required}", value[required])
    for optional in ("title", "description", "websiteUrl"):
        if optional in value and not isinstance(value[optional], str):
            _string(f"{field}.{optional}", value[optional])
    if "icons" in value:
        icons = value["icons"]
        if not isinstance(icons, list):
            raise _Invalid(f"{field}.icons", f"must be an array of Icon objects, not {_describe(icons)}")
        for index, icon in enumerate(icons):
            _icon(f"{field}.icons[{index}]", icon)


def _icon(field: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise _Invalid(field, f'must be an Icon object with a "src" string, not {_describe(value)}')
    if "src" not in value:
        raise _Invalid(f"{field}.src", "is required (a string)")
    _string(f"{field}.src", value["src"])
    if "mimeType" in value:
        _string(f"{field}.mimeType", value["mimeType"])
    if "theme" in value and value["theme"] not in _THEMES:
        raise _Invalid(f"{field}.theme", f'must be "light" or "dark", not {_describe(value["theme"])}')
    if "sizes" in value:
        sizes = value["sizes"]
        if not isinstance(sizes, list) or not all(isinstance(s, str) for s in sizes):
            raise _Invalid(f"{field}.sizes", f"must be an array of strings, not {_describe(sizes)}")


def _progress_token(field: str, value: Any) -> None:
    # ProgressToken: "string" | "integer". JSON Schema's integer is a number with no
    # fractional part (2020-12 §6.1.1), so 1.0 is one too; a boolean is not.
    cls = value.__class__
    if cls is str or cls is int:
        return
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return
    if isinstance(value, float) and value.is_integer():
        return
    raise _Invalid(field, f"must be a string or an integer (a ProgressToken), not {_describe(value)}")


def _log_level(field: str, value: Any) -> None:
    if value.__class__ is not str or value not in _LEVELS:
        raise _Invalid(field, f"is an unknown log level {_describe(value)} (one of {', '.join(meta.LOG_LEVELS)})")


def _capabilities(field: str, value: dict[str, Any]) -> None:
    for name, capability in value.items():
        members = _CAPABILITY_MEMBERS.get(name)
        if members is None:
            continue  # not one the schema names: the client's own
        if capability.__class__ is not dict:
            if not isinstance(capability, dict):
                raise _Invalid(f"{field}.{name}", f"must be an object, not {_describe(capability)}")
        if not capability:
            continue
        keys = capability if name in _MAPS_TO_OBJECTS else members
        for key in keys:
            if key in capability and not isinstance(capability[key], dict):
                raise _Invalid(f"{field}.{name}.{key}", f"must be an object, not {_describe(capability[key])}")


def _path(key: str) -> str:
    return f"_meta[{key!r}]"


_OPTIONAL: dict[str, Callable[[str, Any], None]] = {
    meta.CLIENT_INFO: _implementation,
    meta.PROGRESS_TOKEN: _progress_token,
    meta.LOG_LEVEL: _log_level,
    "traceparent": _string,
    "tracestate": _string,
    "baggage": _string,
}


_PATHS = {key: _path(key) for key in _OPTIONAL}
_CAPABILITIES_PATH = _path(meta.CLIENT_CAPABILITIES)


def check_request_meta(meta_obj: dict[str, Any], request_id: rpc.RequestId | None) -> None:
    """Raise 400 -32602 naming the first standard `_meta` field whose value the schema rules
    out. `meta_obj` already holds both required fields (a string version, an object)."""
    try:
        capabilities = meta_obj[meta.CLIENT_CAPABILITIES]
        if capabilities:
            _capabilities(_CAPABILITIES_PATH, capabilities)
        if len(meta_obj) > 2:
            for key, value in meta_obj.items():
                check = _OPTIONAL.get(key)
                if check is not None and not (value is None and key == meta.LOG_LEVEL):
                    check(_PATHS[key], value)
    except _Invalid as bad:
        raise rpc.invalid_params(f"{bad.field} {bad.problem}", request_id, data={"field": bad.field}) from None


def check_initialize_declarations(params: dict[str, Any], request_id: rpc.RequestId | None) -> None:
    """An initialize-era client's `initialize`: the `clientInfo` and `capabilities` it declares
    become the `_meta` of every request of its session (legacy_clients), so a malformed one is
    refused here, once, naming the field, rather than on each later request. Absent ones are
    left to the caller (the session then declares none)."""
    try:
        if "clientInfo" in params and params["clientInfo"] is not None:
            _implementation("params.clientInfo", params["clientInfo"])
        capabilities = params.get("capabilities")
        if isinstance(capabilities, dict):
            _capabilities("params.capabilities", capabilities)
        elif capabilities is not None:
            raise _Invalid("params.capabilities", f"must be an object, not {_describe(capabilities)}")
    except _Invalid as bad:
        raise rpc.invalid_params(f"{bad.field} {bad.problem}", request_id, data={"field": bad.field}) from None
