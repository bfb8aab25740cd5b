"""Cache keys (gateway/cache/keys.py): requests that differ in anything that shapes the result
never share a key; requests that differ only in volatile `_meta` do."""

from __future__ import annotations

from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st

from gateway.cache.keys import VOLATILE_META, read_tag, request_keys
from gateway.protocol import meta

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12)
json_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
methods = st.sampled_from(
    [
        "tools/list",
        "prompts/list",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "server/discover",
    ]
)


@st.composite
def requests(draw: Any) -> dict[str, Any]:
    params: dict[str, Any] = draw(
        st.dictionaries(st.sampled_from(["cursor", "uri", "extra"]), json_values, max_size=3)
    )
    params["_meta"] = {
        meta.PROTOCOL_VERSION: draw(st.sampled_from(["2026-07-28", "2026-09-01"])),
        meta.CLIENT_CAPABILITIES: draw(
            st.dictionaries(
                st.sampled_from(["elicitation", "sampling", "extensions"]),
                st.fixed_dictionaries({}),
                max_size=2,
            )
        ),
    }
    return {
        "backend": draw(names),
        "method": draw(methods),
        "params": params,
        "version": draw(st.sampled_from(["2026-07-28", "2026-09-01"])),
        "fingerprint": draw(st.text(alphabet="0123456789abcdef", min_size=16, max_size=16)),
        "principal": draw(st.none() | st.text(min_size=1, max_size=20)),
    }


def keys_of(r: dict[str, Any]) -> Any:
    return request_keys(
        "mcpgw", r["backend"], r["method"], r["params"], r["version"], r["fingerprint"], r["principal"]
    )


FIELDS = [
    "backend",
    "method",
    "version",
    "fingerprint",
    "cursor",
    "uri",
    "extra",
    "capabilities",
    "meta_version",
]


@st.composite
def changed(draw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A request and a copy that differs in exactly one result-shaping field."""
    a = draw(requests())
    b = {**a, "params": {**a["params"], "_meta": dict(a["params"]["_meta"])}}
    field = draw(st.sampled_from(FIELDS))
    if field in ("backend", "method", "version", "fingerprint"):
        strategy = {
            "backend": names,
            "method": methods,
            "version": st.text(min_size=1, max_size=10),
            "fingerprint": st.text(min_size=1, max_size=16),
        }[field]
        b[field] = draw(strategy.filter(lambda v: v != a[field]))
    elif field in ("cursor", "uri", "extra"):
        # Present vs absent is a difference too: an empty-string cursor is a valid cursor.
        new = draw(st.just("<absent>") | json_values)
        assume(new != a["params"].get(field, "<absent>"))
        if new == "<absent>":
            b["params"].pop(field, None)
        else:
            b["params"][field] = new
    elif field == "capabilities":
        caps = draw(
            st.dictionaries(
                st.sampled_from(["elicitation", "sampling", "roots"]), st.fixed_dictionaries({}), max_size=3
            )
        )
        assume(caps != a["params"]["_meta"][meta.CLIENT_CAPABILITIES])
        b["params"]["_meta"][meta.CLIENT_CAPABILITIES] = caps
    else:
        b["params"]["_meta"][meta.PROTOCOL_VERSION] = "1999-01-01"
        assume(a["params"]["_meta"][meta.PROTOCOL_VERSION] != "1999-01-01")
    return a, b


@given(changed())
def test_requests_differing_in_a_result_shaping_field_never_share_a_key(pair):
    a, b = pair
    ka, kb = keys_of(a), keys_of(b)
    assert ka.base != kb.base
    assert ka.public != kb.public
    assert ka.lock != kb.lock
    if ka.private is not None and kb.private is not None:
        assert ka.private != kb.private


@given(requests(), st.text(min_size=1, max_size=20), st.text(min_size=1, max_size=20))
def test_two_principals_never_share_a_private_key(r, alice, bob):
    assume(alice != bob)
    ka = keys_of({**r, "principal": alice})
    kb = keys_of({**r, "principal": bob})
    assert ka.private != kb.private
    # The same request, so public and coalescing keys are shared; private ones never equal them.
    assert ka.public == kb.public and ka.base == kb.base
    assert ka.private not in (kb.public, ka.public)


@given(requests(), st.dictionaries(st.sampled_from(sorted(VOLATILE_META)), json_values, min_size=1))
def test_volatile_meta_does_not_change_the_key(r, volatile):
    noisy = {**r, "params": {**r["params"], "_meta": {**r["params"]["_meta"], **volatile}}}
    assert keys_of(noisy) == keys_of(r)


@given(requests())
def test_param_order_does_not_change_the_key(r):
    reordered = {**r, "params": dict(reversed(list(r["params"].items())))}
    assert keys_of(reordered) == keys_of(r)


def test_keys_name_neither_the_principal_nor_the_uri():
    secret_principal = "|credential:0123456789abcdef"
    keys = request_keys(
        "mcpgw",
        "files",
        "resources/read",
        {"uri": "file:///home/alice/secret.txt"},
        "2026-07-28",
        "f" * 16,
        secret_principal,
    )
    for key in (keys.public, keys.private, keys.lock):
        assert key is not None
        assert "alice" not in key and "credential" not in key
    assert keys.public.startswith("{mcpgw:cache:files}:pub:") and keys.private.startswith("{mcpgw:cache:files}:prv:")
    assert "alice" not in read_tag("files", "file:///home/alice/secret.txt")


def test_no_principal_means_no_private_key():
    assert request_keys("mcpgw", "b", "tools/list", {}, "2026-07-28", "f" * 16, None).private is None
