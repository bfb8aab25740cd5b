"""`views:` compiled (routing/views.py) and what check-config refuses about them."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.routing.views import View, views_of
from gateway.settings import ConfigError, load_settings

BACKENDS = [{"name": "ledger", "url": "http://127.0.0.1:1/a"}, {"name": "reports", "url": "http://127.0.0.1:1/b"}]


def load(*views: dict[str, Any], **extra: Any) -> Any:
    return load_settings(None, backends=BACKENDS, views=list(views), **extra)


def refused(*views: dict[str, Any], **extra: Any) -> str:
    with pytest.raises(ConfigError) as error:
        load(*views, **extra)
    return str(error.value)


def test_a_view_compiles_to_backends_names_and_rules():
    config = load({"path": "/mcp/finance/", "backends": ["ledger"], "names": ["ledger__get_*"],
                   "authorization": {"rules": [{"effect": "deny", "names": ["ledger__get_secret"]}]}},
                  {"path": "/everything"})
    finance, everything = views_of(config)
    assert finance.path == "/mcp/finance"  # a trailing slash is the same path
    assert finance.shows_backend("ledger") and not finance.shows_backend("reports")
    assert finance.shows_name("ledger__get_a") and not finance.shows_name("ledger__put_a")
    assert finance.rules is not None and not finance.rules.allows(
        _anyone(), "tools/call", name="ledger__get_secret", backend="ledger")
    assert everything == View("/everything", None, None, None)
    assert everything.shows_backend("reports") and everything.shows_name("anything")


def _anyone() -> Any:
    from gateway.protocol.principal import Principal

    return Principal("anonymous", None)


@pytest.mark.parametrize(("view", "extra", "message"), [
    ({"path": "/v", "backends": ["ghost"]}, {}, "views.0 (/v): backends: no backend is named 'ghost'"),
    ({"path": "/v", "backends": []}, {}, "backends is empty"),
    ({"path": "/mcp"}, {}, "path '/mcp' is already server.path"),
    ({"path": "/mcp/"}, {}, "path '/mcp' is already server.path"),
    ({"path": "/metrics"}, {}, "is already an operational path"),
    ({"path": "/sse"}, {}, "is already server.legacy_sse_path"),
    ({"path": "/sse/messages"}, {}, "is already server.legacy_sse_path's /messages"),
    ({"path": "/.well-known/oauth-protected-resource/x"}, {}, "under /.well-known/oauth-protected-resource"),
    ({"path": "/v", "backends": ["ledger"], "names": ["reports__*"]}, {},
     "names 'reports__*' can never match a name of its backends (their names start with ['ledger__'])"),
    ({"path": "/v", "names": []}, {}, "names is empty"),
    ({"path": "/v", "backends": ["ledger"], "authorization": {"rules": [{"effect": "deny", "backends": ["reports"]}]}},
     {}, "views.0.authorization.rules.0: backends: the view shows no backend named 'reports'"),
    ({"path": "/v", "authorization": {"rules": [{"effect": "allow", "when": {"claims": {"groups": "x"}}}]}}, {},
     "views.0.authorization.rules.0: when.claims can never hold"),
    ({"path": "v"}, {}, "must start with '/'"),
])
def test_check_config_refuses(view, extra, message):
    assert message in refused(view, **extra)


def test_two_views_cannot_share_a_path_nor_each_others_sse_paths():
    assert "path '/v' is already the path of views.0" in refused({"path": "/v"}, {"path": "/v/"})
    # /v's HTTP+SSE paths are /v/sse and /v/sse/messages.
    assert "path '/v/sse' is already the path of views.0" in refused({"path": "/v"}, {"path": "/v/sse"})
    # Without the HTTP+SSE transport there is no /v/sse to clash with.
    load({"path": "/v"}, {"path": "/v/sse"}, server={"legacy_sse_path": None})


def test_views_are_restart_only_like_the_rest_of_governance():
    from gateway.reload.plan import plan

    before = load({"path": "/v", "backends": ["ledger"]})
    after = load({"path": "/v", "backends": ["ledger", "reports"]})
    change = plan(before, after)
    assert change.needs_restart == ("views",)
    assert change.settings.views == before.views  # the running views stay until a restart
