"""gateway/protocol/headers.py: the Base64 sentinel and `x-mcp-header` annotations
(digest §b.2, §b.3; the SEP-2243 conformance cases)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.protocol import headers as h

# -- decoding received values (digest §b.3) ------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "decoded"),
    [
        # The spec's own examples.
        ("=?base64?SGVsbG8sIOS4lueVjA==?=", "Hello, 世界"),
        ("=?base64?IHBhZGRlZCA=?=", " padded "),
        ("=?base64?bGluZTEKbGluZTI=?=", "line1\nline2"),
        ("=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?=", "=?base64?literal?="),
        # Plain values stay as they are.
        ("us-west1", "us-west1"),
        ("us west 1", "us west 1"),  # internal spaces stay plain
        ("", ""),  # empty string -> empty header value
        # Not a sentinel: missing prefix, missing suffix, uppercase marker -> literal value.
        ("SGVsbG8=?=", "SGVsbG8=?="),
        ("=?base64?SGVsbG8=", "=?base64?SGVsbG8="),
        ("=?BASE64?SGVsbG8=?=", "=?BASE64?SGVsbG8=?="),
        ("=?Base64?SGVsbG8=?=", "=?Base64?SGVsbG8=?="),
        # The empty sentinel encodes the empty string.
        ("=?base64??=", ""),
    ],
)
def test_decode_value(raw, decoded):
    assert h.decode_value(raw) == decoded


@pytest.mark.parametrize(
    "raw",
    [
        "=?base64?SGVsbG8?=",  # invalid padding (SEP-2243 conformance case)
        "=?base64?SGVsbG8==?=",  # too much padding
        "=?base64?SGV sbG8=?=",  # space inside the Base64
        "=?base64?SGVsbG8*?=",  # character outside the alphabet
        "=?base64?SGVsbG8-_==?=",  # base64url alphabet is not the spec's
        "=?base64?/w==?=",  # decodes to a byte that is not UTF-8
    ],
)
def test_decode_rejects_broken_sentinels(raw):
    with pytest.raises(h.HeaderValueError):
        h.decode_value(raw)


@pytest.mark.parametrize("raw", ["caf\xe9", "a\x00b", "line\nbreak", "del\x7f"])
def test_decode_rejects_characters_not_allowed_in_a_field_value(raw):
    with pytest.raises(h.HeaderValueError):
        h.decode_value(raw)


def test_decode_accepts_internal_htab_either_way():
    # Whether an internal HTAB must be encoded is unsettled (digest §b.3 [GW]): accept both.
    assert h.decode_value("a\tb") == "a\tb"
    assert h.decode_value(h.encode_value("a\tb")) == "a\tb"


# -- encoding values the gateway generates ------------------------------------------------


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        ("Hello, 世界", "=?base64?SGVsbG8sIOS4lueVjA==?="),
        (" padded ", "=?base64?IHBhZGRlZCA=?="),
        ("line1\nline2", "=?base64?bGluZTEKbGluZTI=?="),
        ("=?base64?literal?=", "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?="),  # a plain value that looks encoded
        ("\tleading-tab", "=?base64?CWxlYWRpbmctdGFi?="),  # a leading tab is encoded
        ("us west 1", "us west 1"),  # internal spaces stay plain
        ("get_weather", "get_weather"),
        ("file:///project/src/main.rs", "file:///project/src/main.rs"),
        ("", ""),
    ],
)
def test_encode_value(value, encoded):
    assert h.encode_value(value) == encoded


def test_encode_uppercase_marker_literal_stays_plain():
    # Only the exact lowercase markers form a sentinel, so this value needs no encoding.
    assert h.encode_value("=?BASE64?abc?=") == "=?BASE64?abc?="


@given(st.text())
def test_encode_then_decode_is_identity(value):
    assert h.decode_value(h.encode_value(value)) == value


@given(st.text())
def test_encoded_values_are_plain_visible_ascii(value):
    encoded = h.encode_value(value)
    assert all(0x20 <= ord(c) <= 0x7E for c in encoded)
    assert encoded == encoded.strip(" \t")  # nothing an HTTP parser would trim


# -- header text of primitive arguments and comparison ------------------------------------


@pytest.mark.parametrize(("value", "text"), [("x", "x"), (42, "42"), (-7, "-7"), (True, "true"), (False, "false"),
                                             (42.0, "42"), (None, None)])
def test_header_text(value, text):
    assert h.header_text(value) == text


@pytest.mark.parametrize(
    ("header", "body", "equal"),
    [
        ("42", 42, True),
        ("42", 42.0, True),  # integers compare numerically (SHTTP §Server Validation)
        ("42.0", 42, True),
        ("43", 42, False),
        ("forty-two", 42, False),
        ("true", True, True),
        ("True", True, False),  # booleans are lowercase on the wire
        ("false", False, True),
        ("1", True, False),  # a boolean is not a number
        ("us-west1", "us-west1", True),
        ("US-WEST1", "us-west1", False),  # values are case-sensitive
        ("x", None, False),
        ("x", ["x"], False),
    ],
)
def test_values_equal(header, body, equal):
    assert h.values_equal(header, body) is equal


# -- x-mcp-header definitions (digest §b.2) -----------------------------------------------


def _schema(**props):
    return {"type": "object", "properties": props}


def test_annotations_on_reachable_primitives_are_collected():
    schema = _schema(
        region={"type": "string", "x-mcp-header": "Region"},
        count={"type": "integer", "x-mcp-header": "Count"},
        dry={"type": "boolean", "x-mcp-header": "Dry-Run"},
        target={"type": "object", "properties": {"zone": {"type": "string", "x-mcp-header": "Zone"}}},
        plain={"type": "string"},
    )
    found = h.param_headers(schema)
    assert {(p.name, p.path) for p in found} == {
        ("Region", ("region",)),
        ("Count", ("count",)),
        ("Dry-Run", ("dry",)),
        ("Zone", ("target", "zone")),  # nested objects are fine when every step is `properties`
    }
    assert {p.header for p in found} == {"mcp-param-region", "mcp-param-count", "mcp-param-dry-run",
                                         "mcp-param-zone"}


def test_method_is_an_allowed_annotation_name():
    (ann,) = h.param_headers(_schema(m={"type": "string", "x-mcp-header": "Method"}))
    assert ann.header == "mcp-param-method"  # not confused with Mcp-Method


def test_schemas_without_annotations():
    assert h.param_headers(_schema(a={"type": "string"})) == ()
    assert h.param_headers(None) == ()
    assert h.param_headers({"type": "object"}) == ()


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        (_schema(ratio={"type": "number", "x-mcp-header": "Ratio"}), "type"),  # number is not permitted
        (_schema(tags={"type": "array", "x-mcp-header": "Tags"}), "type"),
        (_schema(obj={"type": "object", "x-mcp-header": "Obj"}), "type"),
        (_schema(untyped={"x-mcp-header": "Untyped"}), "type"),
        (_schema(a={"type": "string", "x-mcp-header": ""}), "token"),  # empty
        (_schema(a={"type": "string", "x-mcp-header": "Has Space"}), "token"),
        (_schema(a={"type": "string", "x-mcp-header": "Bad\r\nName"}), "token"),  # control characters
        (_schema(a={"type": "string", "x-mcp-header": "Ünïcode"}), "token"),
        (_schema(a={"type": "string", "x-mcp-header": 7}), "token"),
        (
            _schema(a={"type": "string", "x-mcp-header": "Region"}, b={"type": "string", "x-mcp-header": "REGION"}),
            "unique",
        ),  # case-insensitively unique
        # Not statically reachable: array items, composition, conditionals, $defs/$ref targets.
        (_schema(list={"type": "array", "items": {"type": "string", "x-mcp-header": "Item"}}), "reachable"),
        ({"type": "object", "anyOf": [_schema(a={"type": "string", "x-mcp-header": "A"})]}, "reachable"),
        ({"type": "object", "oneOf": [_schema(a={"type": "string", "x-mcp-header": "A"})]}, "reachable"),
        ({"type": "object", "allOf": [_schema(a={"type": "string", "x-mcp-header": "A"})]}, "reachable"),
        ({"type": "object", "not": _schema(a={"type": "string", "x-mcp-header": "A"})}, "reachable"),
        ({"type": "object", "if": _schema(a={"type": "string", "x-mcp-header": "A"})}, "reachable"),
        ({"type": "object", "then": _schema(a={"type": "string", "x-mcp-header": "A"})}, "reachable"),
        ({"type": "object", "else": _schema(a={"type": "string", "x-mcp-header": "A"})}, "reachable"),
        (
            {"type": "object", "$defs": {"d": {"type": "string", "x-mcp-header": "D"}},
             "properties": {"d": {"$ref": "#/$defs/d"}}},
            "reachable",
        ),
        (_schema(a={"type": "object", "additionalProperties": {"type": "string", "x-mcp-header": "A"}}), "reachable"),
        ({"type": "string", "x-mcp-header": "Root"}, "reachable"),  # the root itself is no parameter
    ],
)
def test_invalid_annotations_invalidate_the_tool(schema, reason):
    with pytest.raises(h.InvalidToolDefinition) as info:
        h.param_headers(schema)
    assert {"type": "type", "token": "token", "unique": "unique", "reachable": "reachable"}[reason] in str(info.value)


def test_property_named_like_a_keyword_is_still_a_property():
    # "items" here is a property name under `properties`, not the array keyword.
    schema = _schema(items={"type": "string", "x-mcp-header": "Items"})
    (ann,) = h.param_headers(schema)
    assert ann.path == ("items",)


@pytest.mark.parametrize(
    ("arguments", "path", "value"),
    [
        ({"a": 1}, ("a",), 1),
        ({"a": {"b": "x"}}, ("a", "b"), "x"),
        ({"a": None}, ("a",), None),  # null mirrors to no header
        ({}, ("a",), None),
        ({"a": "flat"}, ("a", "b"), None),
        (None, ("a",), None),
    ],
)
def test_extract(arguments, path, value):
    assert h.extract(arguments, path) == value


@pytest.mark.parametrize(
    ("header", "body", "equal"),
    [
        ("42", 42, True),
        ("42.0", 42, True),  # SHTTP §Server Validation: numeric comparison
        ("-7", -7, True),
        (str(2**53), 2**53 + 1, False),  # floats would call these equal
        ("nan", 1, False),
        ("inf", 10**400, False),
        ("1e2", 100, False),
        ("0x10", 16, False),
    ],
)
def test_integer_values_compare_exactly(header, body, equal):
    assert h.values_equal(header, body) is equal
