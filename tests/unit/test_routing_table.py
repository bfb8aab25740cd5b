"""gateway/routing/table.py: names by prefix, URIs by listing, configured prefix and template,
and the x-mcp-header index fed by tools/list."""

from __future__ import annotations

from typing import Any

from gateway.backends.modern import ModernHttpBackend
from gateway.routing.table import RouteTable, Target
from gateway.settings import BackendSettings


def target(name: str, prefix: str, **settings: Any) -> Target:
    # A real backend object, never started: the table only reads its name and settings.
    backend = ModernHttpBackend(BackendSettings(name=name, url=f"http://127.0.0.1:1/{name}", **settings))
    return Target(backend, prefix)


# -- route table -------------------------------------------------------------------------


def test_names_resolve_by_longest_prefix():
    table = RouteTable([target("a", "a__"), target("ab", "ab."), target("plain", "p")])
    assert table.resolve_name("a__echo")[1] == "echo"
    assert table.resolve_name("ab.echo")[0].backend.name == "ab"
    assert table.resolve_name("pecho")[0].backend.name == "plain"
    assert table.resolve_name("a__") is None  # a prefix alone names nothing
    assert table.resolve_name("zzz") is None


def test_single_backend_with_empty_prefix_owns_every_name_and_uri():
    only = target("only", "")
    table = RouteTable([only])
    assert table.resolve_name("anything") == (only, "anything")
    assert table.resolve_uri("file:///x") is only


def test_uris_by_listing_configured_prefix_and_template():
    a, b = target("a", "a__"), target("b", "b__", resource_prefixes=("b://",))
    table = RouteTable([a, b])
    assert table.resolve_uri("x://listed") is None
    table.learn_resources(a, [{"uri": "x://listed"}, {"no": "uri"}, "junk"])
    assert table.resolve_uri("x://listed") is a
    assert table.resolve_uri("b://anything/at/all") is b
    table.learn_templates(a, [{"uriTemplate": "t://a/items/{id}"}, {"uriTemplate": "{whole}"}])
    assert table.resolve_uri("t://a/items/7") is a
    assert table.resolve_uri("t://b/items/7") is None


def test_a_complete_template_listing_replaces_the_previous_one():
    a, b = target("a", "a__"), target("b", "b__")
    table = RouteTable([a, b])
    table.learn_templates(a, [{"uriTemplate": "t://a/items/{id}"}, {"uriTemplate": "t://a/old/{id}"}])
    assert table.resolve_uri("t://a/old/1") is a
    table.learn_templates(a, [{"uriTemplate": "t://a/items/{id}"}])  # t://a/old/ dropped
    assert table.resolve_uri("t://a/items/1") is a
    assert table.resolve_uri("t://a/old/1") is None
    # Paged: the first page adds at once, the last page concludes what is gone.
    table.learn_templates(a, [{"uriTemplate": "t://a/new/{id}"}], first=True, last=False)
    assert table.resolve_uri("t://a/new/1") is a and table.resolve_uri("t://a/items/1") is a
    table.learn_templates(a, [{"uriTemplate": "t://a/more/{id}"}], first=False, last=True)
    assert table.resolve_uri("t://a/items/1") is None
    assert table.resolve_uri("t://a/new/1") is a and table.resolve_uri("t://a/more/1") is a
    # A later page without its first page (another replica served it) only adds.
    table.learn_templates(b, [{"uriTemplate": "t://b/{x}"}], first=False, last=True)
    table.learn_templates(a, [{"uriTemplate": "t://a/late/{id}"}], first=False, last=True)
    assert table.resolve_uri("t://a/new/1") is a and table.resolve_uri("t://a/late/1") is a
    assert table.resolve_uri("t://b/1") is b


def test_the_longest_template_prefix_wins_then_the_configured_order():
    a, b = target("a", "a__"), target("b", "b__")
    table = RouteTable([a, b])
    table.learn_templates(b, [{"uriTemplate": "t://shared/deep/{x}"}, {"uriTemplate": "t://same/{x}"}])
    table.learn_templates(a, [{"uriTemplate": "t://shared/{x}"}, {"uriTemplate": "t://same/{x}"}])
    assert table.resolve_uri("t://shared/deep/1") is b
    assert table.resolve_uri("t://shared/1") is a
    assert table.resolve_uri("t://same/1") is a  # equal prefixes: a is configured first


def test_invalid_tools_are_filtered_and_annotations_indexed():
    a = target("a", "a__")
    table = RouteTable([a])
    tools = [
        {"name": "ok", "inputSchema": {"type": "object", "properties": {"r": {"type": "string", "x-mcp-header": "R"}}}},
        {"name": "bad", "inputSchema": {"type": "object", "properties": {"n": {"type": "number", "x-mcp-header": "N"}}}},
        {"name": "plain", "inputSchema": {"type": "object"}},
        {"no": "name"},
    ]
    assert [t["name"] for t in table.filter_tools(a, tools)] == ["ok", "plain"]
    assert [p.header for p in table.param_headers(a, "ok")] == ["mcp-param-r"]
    assert table.param_headers(a, "plain") == ()
    assert table.param_headers(a, "bad") is None  # never offered, never indexed
    assert table.param_headers(a, "unlisted") is None


def test_a_list_seen_again_is_not_walked_again_but_a_new_list_is():
    # A cache hit hands the table the very list it filtered last time (stored messages are
    # never mutated): the result is reused. Any other list object is filtered afresh, even
    # with equal content, so a changed definition always takes effect.
    a = target("a", "")
    table = RouteTable([a])
    annotated = {"type": "object", "properties": {"r": {"type": "string", "x-mcp-header": "R"}}}
    cached = [{"name": "t", "inputSchema": annotated}]
    first = table.filter_tools(a, cached)
    assert table.filter_tools(a, cached) is first
    assert [p.header for p in table.param_headers(a, "t")] == ["mcp-param-r"]

    now_invalid = {"type": "object", "properties": {"r": {"type": "number", "x-mcp-header": "R"}}}
    assert table.filter_tools(a, [{"name": "t", "inputSchema": now_invalid}]) == []
    assert table.param_headers(a, "t") is None
    # The earlier list object, no longer the last one filtered, is walked again too.
    assert table.filter_tools(a, cached) == cached
    assert table.param_headers(a, "t") is not None


# -- resource URI ownership --------------------------------------------------------------


def test_configured_prefixes_win_over_listed_uris():
    a, b = target("a", "a__"), target("b", "b__", resource_prefixes=("b://",))
    table = RouteTable([a, b])
    table.learn_resources(a, [{"uri": "b://secrets"}])  # a cannot claim what the operator gave b
    assert table.resolve_uri("b://secrets") is b


def test_a_new_listing_replaces_the_backends_previous_uris():
    a, b = target("a", "a__"), target("b", "b__")
    table = RouteTable([a, b])
    table.learn_resources(a, [{"uri": "x://1"}, {"uri": "x://2"}])
    table.learn_resources(a, [{"uri": "x://2"}])
    assert table.resolve_uri("x://1") is None
    assert table.resolve_uri("x://2") is a


def test_a_uri_two_backends_list_goes_to_the_first_configured_then_follows_the_lists(caplog):
    a, b = target("a", "a__"), target("b", "b__")
    table = RouteTable([a, b])
    table.learn_resources(b, [{"uri": "x://shared"}, {"uri": "x://also"}])
    assert table.resolve_uri("x://shared") is b
    table.learn_resources(a, [{"uri": "x://shared"}, {"uri": "x://also"}])
    assert table.resolve_uri("x://shared") is a  # configured order, not who listed first
    assert len([r for r in caplog.records if "listed by backends" in r.getMessage()]) == 1  # logged once
    table.learn_resources(a, [])
    assert table.resolve_uri("x://shared") is b  # a no longer lists it; b still does


def test_a_paged_listing_replaces_only_once_complete():
    a, b = target("a", "a__"), target("b", "b__")
    table = RouteTable([a, b])
    table.learn_resources(a, [{"uri": "x://1"}], first=True, last=False)
    table.learn_resources(a, [{"uri": "x://2"}], first=False, last=True)
    table.learn_resources(a, [{"uri": "x://1"}], first=True, last=False)
    assert table.resolve_uri("x://2") is a  # the new listing has not reached page 2 yet
    table.learn_resources(a, [], first=False, last=True)
    assert table.resolve_uri("x://2") is None
    assert table.resolve_uri("x://1") is a


def test_the_uri_index_is_bounded_least_recently_used_out():
    a, b = target("a", "a__"), target("b", "b__")
    table = RouteTable([a, b], max_uris=2)
    table.learn_resources(a, [{"uri": "x://1"}, {"uri": "x://2"}])
    assert table.resolve_uri("x://1") is a  # used: x://2 is now the oldest
    table.learn_resources(b, [{"uri": "x://3"}])
    assert table.resolve_uri("x://2") is None
    assert table.resolve_uri("x://1") is a and table.resolve_uri("x://3") is b


def test_interleaved_listings_forget_nothing():
    # Client A pages 1-2, client B starts over, A reads the last page: the pages no longer form
    # one listing, so x://2 (seen only on A's page 2) must still route.
    a, b = target("a", "a__"), target("b", "b__")
    table = RouteTable([a, b])
    table.learn_resources(a, [{"uri": "x://1"}], first=True, last=False)
    table.learn_resources(a, [{"uri": "x://2"}], first=False, last=False)
    table.learn_resources(a, [{"uri": "x://1"}], first=True, last=False)  # B's first page
    table.learn_resources(a, [{"uri": "x://3"}], first=False, last=True)  # A's last page
    assert table.resolve_uri("x://2") is a
    # The next uninterrupted listing concludes again.
    table.learn_resources(a, [{"uri": "x://1"}], first=True, last=True)
    assert table.resolve_uri("x://2") is None and table.resolve_uri("x://1") is a



def test_a_list_without_annotations_is_kept_whole_and_indexed_empty():
    a = target("a", "a__")
    table = RouteTable([a])
    tools = [{"name": f"t{i}", "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}}}
             for i in range(3)] + [{"no": "name"}, "junk"]
    assert [t["name"] for t in table.filter_tools(a, tools)] == ["t0", "t1", "t2"]
    assert table.param_headers(a, "t1") == ()
    # The key mentioned in a description is no annotation: nothing is dropped.
    described = [{"name": "d", "description": 'mirrors "x-mcp-header" values', "inputSchema": {"type": "object"}}]
    assert [t["name"] for t in table.filter_tools(a, described)] == ["d"]


def test_an_annotation_anywhere_in_the_list_still_gets_every_schema_checked():
    a = target("a", "a__")
    table = RouteTable([a])
    tools = [
        {"name": "plain", "inputSchema": {"type": "object"}},
        {"name": "unreachable", "inputSchema": {"type": "object", "anyOf": [
            {"properties": {"r": {"type": "string", "x-mcp-header": "R"}}}]}},
    ]
    assert [t["name"] for t in table.filter_tools(a, tools)] == ["plain"]
