"""SubscriptionFilter: parsing the client's filter, combining filters, admitting notifications."""

from __future__ import annotations

import pytest

from gateway.protocol import jsonrpc as rpc
from gateway.subscriptions.filters import (
    SubscriptionFilter,
    covers,
    deliverable,
    parse_request,
    union,
)

TOOLS = "notifications/tools/list_changed"
UPDATED = "notifications/resources/updated"


def updated(uri: str) -> dict:
    return {"jsonrpc": "2.0", "method": UPDATED, "params": {"uri": uri}}


def test_parse_keeps_only_true_flags_and_the_uris():
    f, tasks = parse_request({"notifications": {"toolsListChanged": True, "promptsListChanged": False,
                                                "resourceSubscriptions": ["a://1", "a://1", "b://2"]}}, 1)
    assert f == SubscriptionFilter(frozenset({"toolsListChanged"}), frozenset({"a://1", "b://2"}))
    assert tasks is False
    assert f.to_wire() == {"toolsListChanged": True, "resourceSubscriptions": ["a://1", "b://2"]}


@pytest.mark.parametrize("params, field", [
    ({}, "params.notifications"),
    ({"notifications": []}, "params.notifications"),
    ({"notifications": {"toolsListChanged": "yes"}}, "toolsListChanged"),
    ({"notifications": {"resourceSubscriptions": "a://1"}}, "resourceSubscriptions"),
    ({"notifications": {"resourceSubscriptions": [1]}}, "resourceSubscriptions"),
    ({"notifications": {"taskIds": "t"}}, "taskIds"),
])
def test_malformed_filters_are_invalid_params_naming_the_field(params, field):
    with pytest.raises(rpc.McpError) as err:
        parse_request(params, 7)
    assert err.value.code == rpc.INVALID_PARAMS and err.value.status == 400
    assert field in err.value.message and err.value.request_id == 7


def test_task_ids_are_reported_but_never_granted():
    f, tasks = parse_request({"notifications": {"taskIds": ["t1"]}}, 1)
    assert tasks is True and f.empty


def test_union_and_intersection():
    a = SubscriptionFilter(frozenset({"toolsListChanged"}), frozenset({"x://1"}))
    b = SubscriptionFilter(frozenset({"promptsListChanged"}), frozenset({"x://1", "x://2"}))
    assert union([a, b]) == SubscriptionFilter(frozenset({"toolsListChanged", "promptsListChanged"}),
                                               frozenset({"x://1", "x://2"}))
    assert a & b == SubscriptionFilter(frozenset(), frozenset({"x://1"}))
    assert (a & SubscriptionFilter()).empty


def test_admits_only_granted_types():
    f = SubscriptionFilter(frozenset({"toolsListChanged"}), frozenset({"file:///etc/"}))
    assert f.admits({"method": TOOLS})
    assert not f.admits({"method": "notifications/prompts/list_changed"})
    assert not f.admits({"method": "notifications/message", "params": {}})
    assert f.admits(updated("file:///etc/hosts"))
    assert not f.admits(updated("file:///var/log"))
    assert not f.admits({"method": UPDATED, "params": {}})


@pytest.mark.parametrize("subscribed, uri, expected", [
    ("file:///a", "file:///a", True),
    ("file:///a", "file:///a/b", True),
    ("file:///a", "file:///a#frag", True),
    ("file:///a", "file:///a?rev=2", True),
    ("file:///a/", "file:///a/b", True),
    ("file:///a", "file:///ab", False),
    ("file:///a/b", "file:///a", False),
])
def test_sub_resources_are_covered_but_not_string_prefixes(subscribed, uri, expected):
    assert covers(subscribed, uri) is expected


def test_from_wire_is_lenient():
    assert SubscriptionFilter.from_wire(None).empty
    assert SubscriptionFilter.from_wire({"toolsListChanged": "true", "resourceSubscriptions": "x"}).empty
    assert SubscriptionFilter.from_wire({"resourcesListChanged": True}).lists == {"resourcesListChanged"}


def test_deliverable_follows_advertised_capabilities():
    caps = {"tools": {"listChanged": True}, "prompts": {}, "resources": {"subscribe": True, "listChanged": False}}
    assert deliverable(caps) == (frozenset({"toolsListChanged"}), True)
    assert deliverable(None) == (frozenset(), False)
    assert deliverable({"tools": {}}) == (frozenset(), False)


def test_gap_notifications_cover_each_granted_type():
    f = SubscriptionFilter(frozenset({"toolsListChanged", "resourcesListChanged"}), frozenset({"u://1"}))
    methods = [(n["method"], n["params"].get("uri")) for n in f.notifications()]
    assert methods == [("notifications/resources/list_changed", None), (TOOLS, None), (UPDATED, "u://1")]
