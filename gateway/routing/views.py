"""Views: curated MCP endpoints over the same fleet (`views:`; docs/governance.md "Views").

A view is one compiled object, a backend set + a name filter + a rule set, handed to the same
endpoint code as the main path: `Dispatcher(view=...)` serves it (discover, lists, calls,
listen, MRTR), and `GatewayApp` mounts one `McpEndpoint` per view path, with initialize-era
sessions (and /sse) of its own. The dispatcher asks the view three things:

- `shows_backend`: a backend outside the view is not in its fleet (discover, lists, listen,
  name and URI resolution: its names and URIs are unknown, -32602);
- `shows_name`: a tool or prompt name (as clients see it) outside `names` is unknown too,
  exactly like a name curation hides;
- `rules`: the view's own `authorization`, decided after the global rules (both must allow),
  by the same `RuleSet` code.

Rate limits are the global ones, counted once per request whichever door it came in by: a
view has none of its own (a window on the fleet must not be a way around its limits, nor
double-count a call).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway import ops
from gateway.policies.authorization import RuleSet, compile_globs, glob_literal_prefix, rule_problems
from gateway.policies.jwt_config import WELL_KNOWN

if TYPE_CHECKING:
    from gateway.settings import GatewaySettings, ViewSettings


@dataclass(frozen=True, slots=True)
class View:
    path: str
    backends: frozenset[str] | None  # None: every backend of the fleet
    names: re.Pattern[str] | None  # None: every name of its backends
    rules: RuleSet | None  # None: the global rules alone

    @classmethod
    def of(cls, view: ViewSettings, settings: GatewaySettings) -> View:
        return cls(path=view.path,
                   backends=frozenset(view.backends) if view.backends is not None else None,
                   names=compile_globs(view.names) if view.names is not None else None,
                   rules=RuleSet.of(view.authorization, settings))

    def shows_backend(self, backend: str) -> bool:
        return self.backends is None or backend in self.backends

    def shows_name(self, name: str) -> bool:
        return self.names is None or self.names.match(name) is not None


def views_of(settings: GatewaySettings) -> tuple[View, ...]:
    return tuple(View.of(v, settings) for v in settings.views)


def sse_paths(view_path: str, settings: GatewaySettings) -> tuple[str, str] | None:
    """A view's HTTP+SSE transport paths (stream, messages) when the main endpoint has one:
    `<view path>/sse` and `<view path>/sse/messages`."""
    server = settings.server
    if not server.legacy_clients or server.legacy_sse_path is None:
        return None
    base = view_path.rstrip("/") + "/sse"
    return base, base + "/messages"


# -- check-config --------------------------------------------------------------------------


def check_views(settings: GatewaySettings) -> None:
    """Refuse views naming unknown backends, clashing paths, and names or rules that can never
    match."""
    problems = view_problems(settings)
    if problems:
        raise ValueError("; ".join(problems))


def view_problems(settings: GatewaySettings) -> list[str]:
    problems: list[str] = []
    server = settings.server
    prefixes = {b.name: settings.prefix_of(b) for b in settings.backends}
    taken: dict[str, str] = {server.path: "server.path"}
    for p in ops.PATHS:
        taken[p] = "an operational path"
    if server.legacy_clients and server.legacy_sse_path is not None:
        taken[server.legacy_sse_path] = "server.legacy_sse_path"
        taken[server.legacy_sse_path.rstrip("/") + "/messages"] = "server.legacy_sse_path's /messages"
    for i, view in enumerate(settings.views):
        where = f"views.{i} ({view.path})"
        own = [view.path]
        extra = sse_paths(view.path, settings)
        if extra is not None:
            own += extra
        for path in own:
            if path in taken:
                problems.append(f"{where}: path {path!r} is already {taken[path]}")
            elif path == WELL_KNOWN or path.startswith(WELL_KNOWN + "/"):
                problems.append(f"{where}: path {path!r} is under {WELL_KNOWN} (OAuth metadata)")
        for path in own:
            taken.setdefault(path, f"the path of views.{i}")
        if view.backends is not None:
            if not view.backends:
                problems.append(f"{where}: backends is empty: the view would show nothing")
            for name in view.backends:
                if name not in prefixes:
                    problems.append(f"{where}: backends: no backend is named {name!r}")
        shown = [prefixes[b] for b in (view.backends if view.backends is not None else prefixes) if b in prefixes]
        if view.names is not None:
            if not view.names:
                problems.append(f"{where}: names is empty: the view would show no tool or prompt")
            for glob in view.names:
                literal = glob_literal_prefix(glob)
                if shown and not any(literal.startswith(p) or p.startswith(literal) for p in shown):
                    problems.append(f"{where}: names {glob!r} can never match a name of its backends "
                                    f"(their names start with {sorted(set(shown))})")
        problems += rule_problems(settings, view.authorization.rules, at=f"views.{i}.authorization.rules",
                                  within=view.backends)
    return problems
