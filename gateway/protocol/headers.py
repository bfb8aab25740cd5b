"""The request-metadata headers of the modern HTTP transport (digest §b).

`MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` mirror body fields so that intermediaries
can route before parsing; `Mcp-Param-{Name}` mirrors tool arguments annotated with
`x-mcp-header`. Values that are not plain ASCII travel in the Base64 sentinel `=?base64?…?=`.
"""

from __future__ import annotations

import base64
import binascii
import re
from decimal import Decimal, InvalidOperation
from dataclasses import dataclass
from typing import Any

PROTOCOL_VERSION = "mcp-protocol-version"
METHOD = "mcp-method"
NAME = "mcp-name"
PARAM_PREFIX = "mcp-param-"

_SENTINEL_PREFIX = "=?base64?"
_SENTINEL_SUFFIX = "?="

# RFC 9110 field-value characters: visible ASCII, SP and HTAB.
_PLAIN_VALUE = re.compile(r"[\x20-\x7e\t]*")
# Plain values a *sender* may emit without encoding: no leading/trailing whitespace, no HTAB
# (HTAB's status inside values is unsettled, digest §b.3, so we encode it when we generate).
_SAFE_PLAIN = re.compile(r"(?:[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?)?")
# RFC 9110 token: the syntax an `x-mcp-header` name must have.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_STRICT_BASE64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")

MAX_SAFE_INTEGER = 2**53 - 1
_DECIMAL = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")


class HeaderValueError(ValueError):
    """A header value that cannot be decoded: invalid characters or a broken sentinel."""


def decode_value(raw: str) -> str:
    """Decode a received `Mcp-Name` / `Mcp-Param-*` value (digest §b.3).

    The markers are case-sensitive: `=?BASE64?…?=` and half-sentinels are literal values.
    A sentinel with invalid Base64 (bad padding, bad alphabet) or non-UTF-8 bytes is an error.
    """
    if not _PLAIN_VALUE.fullmatch(raw):
        raise HeaderValueError("contains characters not allowed in a header value")
    if len(raw) >= len(_SENTINEL_PREFIX) + len(_SENTINEL_SUFFIX) and raw.startswith(_SENTINEL_PREFIX) and raw.endswith(
        _SENTINEL_SUFFIX
    ):
        encoded = raw[len(_SENTINEL_PREFIX) : -len(_SENTINEL_SUFFIX)]
        if not _STRICT_BASE64.fullmatch(encoded):
            raise HeaderValueError("invalid Base64 in =?base64?…?= value")
        try:
            return base64.b64decode(encoded, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise HeaderValueError(f"invalid Base64 in =?base64?…?= value: {exc}") from None
    return raw


def encode_value(value: str) -> str:
    """Encode a value for a header the gateway generates (e.g. a rewritten `Mcp-Name`)."""
    if _SAFE_PLAIN.fullmatch(value) and not (value.startswith(_SENTINEL_PREFIX) and value.endswith(_SENTINEL_SUFFIX)):
        return value
    return _SENTINEL_PREFIX + base64.b64encode(value.encode("utf-8")).decode("ascii") + _SENTINEL_SUFFIX


def header_text(value: Any) -> str | None:
    """The header form of a primitive argument value (string as-is, integer decimal, boolean
    lowercase), or None when the value mirrors to no header (null)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def values_equal(header_value: str, body_value: Any) -> bool:
    """Compare a decoded header value with the body value; integers compare numerically
    (`42.0` equals `42`, SHTTP §Server Validation)."""
    if isinstance(body_value, bool):
        return header_value == ("true" if body_value else "false")
    if isinstance(body_value, (int, float)):
        # Exact decimal arithmetic: floats would call 2**53 + 1 equal to 2**53, and accept
        # "nan", "inf" or "1e2" as numbers a header never legitimately carries.
        if not _DECIMAL.fullmatch(header_value):
            return False
        try:
            return Decimal(header_value) == Decimal(repr(body_value) if isinstance(body_value, float) else body_value)
        except InvalidOperation:
            return False
    if isinstance(body_value, str):
        return header_value == body_value
    return False


# -- x-mcp-header annotations -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ParamHeader:
    """One `x-mcp-header` annotation: header `Mcp-Param-{name}` mirrors arguments at `path`."""

    name: str
    path: tuple[str, ...]

    @property
    def header(self) -> str:
        return PARAM_PREFIX + self.name.lower()


class InvalidToolDefinition(ValueError):
    pass


def param_headers(input_schema: Any) -> tuple[ParamHeader, ...]:
    """The `x-mcp-header` annotations of a tool's `inputSchema`, validated (digest §b.2).

    Raises InvalidToolDefinition when an annotation breaks a constraint: the spec says the
    whole tool definition is then invalid.
    """
    found: list[ParamHeader] = []
    if not isinstance(input_schema, dict):
        return ()

    def walk(node: Any, path: tuple[str, ...], reachable: bool) -> None:
        if isinstance(node, dict):
            if "x-mcp-header" in node:
                _check_annotation(node, path, reachable)
                found.append(ParamHeader(node["x-mcp-header"], path))
            for key, child in node.items():
                if key == "properties" and isinstance(child, dict):
                    for prop, sub in child.items():
                        walk(sub, path + (prop,), reachable)
                elif key != "x-mcp-header" and isinstance(child, (dict, list)):
                    # Anything reached through a non-`properties` keyword is not statically
                    # reachable; an annotation there invalidates the tool.
                    walk(child, path, False)
        elif isinstance(node, list):
            for item in node:
                walk(item, path, False)

    walk(input_schema, (), True)
    seen: set[str] = set()
    for ph in found:
        if ph.name.lower() in seen:
            raise InvalidToolDefinition(f"x-mcp-header {ph.name!r} is not unique (case-insensitively)")
        seen.add(ph.name.lower())
    return tuple(found)


def _check_annotation(node: dict[str, Any], path: tuple[str, ...], reachable: bool) -> None:
    name = node["x-mcp-header"]
    if not reachable or not path:
        raise InvalidToolDefinition(f"x-mcp-header {name!r} is not on a statically reachable property")
    if not isinstance(name, str) or not name or not _TOKEN.fullmatch(name):
        raise InvalidToolDefinition(f"x-mcp-header {name!r} is not an HTTP token")
    if node.get("type") not in ("string", "integer", "boolean"):
        raise InvalidToolDefinition(
            f"x-mcp-header {name!r} is on a property of type {node.get('type')!r}; only string, integer, boolean"
        )


def extract(arguments: Any, path: tuple[str, ...]) -> Any:
    """The instance value at an annotation's property path, or None when absent."""
    node = arguments
    for step in path:
        if not isinstance(node, dict) or step not in node:
            return None
        node = node[step]
    return node
