"""The route table: tool and prompt names by prefix, resource URIs by what backends listed.

Built once from settings (prefixes, configured URI prefixes) and fed at run time by the list
answers that pass through the gateway (which URIs a backend lists, which tool arguments it
mirrors into `Mcp-Param-*` headers).

Resource URIs resolve in this order: the operator's `resource_prefixes` (a backend cannot
claim a URI the operator gave to another by listing it), then the URIs backends listed, then
the literal prefixes of listed templates. A backend's complete listing replaces what it listed
before, so ownership follows the latest lists; a URI two backends list goes to the one first
in the configured order. The listed-URI index is bounded (least recently used out): a URI that
fell out resolves again once a list passes by (the dispatcher re-lists on a miss).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.backends.base import Backend
from gateway.protocol import headers as h
from gateway.routing.curation import Curation
from gateway.routing.pins import Pins

log = logging.getLogger("gateway.routing")


@dataclass(frozen=True, slots=True)
class Target:
    backend: Backend
    prefix: str
    # What the backend shows (routing/curation.py); None: everything, as it names it.
    curation: Curation | None = None

    def expose(self, name: str) -> str:
        """The name a client sees for the backend's `name` (already curated)."""
        return self.prefix + name


class RouteTable:
    def __init__(self, targets: Sequence[Target], *, max_uris: int = 100_000) -> None:
        self.targets: tuple[Target, ...] = tuple(targets)
        self.by_name = {t.backend.name: t for t in self.targets}
        # Prefix lookup by length: a name is resolved with one dict probe per distinct prefix
        # length, whatever the fleet size.
        self._prefixes: dict[str, Target] = {t.prefix: t for t in self.targets}
        self._lengths = sorted({len(p) for p in self._prefixes}, reverse=True)
        self._uri_prefixes = sorted(
            ((p, t) for t in self.targets for p in t.backend.settings.resource_prefixes),
            key=lambda pt: len(pt[0]),
            reverse=True,
        )
        # URI → the targets that list it, in configured order (the first owns it); LRU order.
        self._uris: OrderedDict[str, list[Target]] = OrderedDict()
        self._max_uris = max_uris
        self._order = {t.backend.name: i for i, t in enumerate(self.targets)}
        # Per backend: the URIs of its last complete listing, and of the listing in progress.
        self._listed: dict[str, set[str]] = {}
        self._listing: dict[str, set[str]] = {}
        # Backends whose listing in progress cannot conclude which URIs are gone.
        self._inconclusive: set[str] = set()
        self._conflicts_logged: set[tuple[str, str]] = set()
        # Per backend: the literal prefixes of its listed templates (last complete listing
        # plus what the listing in progress added), and the listing in progress itself.
        self._templates: dict[str, list[str]] = {}
        self._template_listing: dict[str, list[str]] = {}
        self._uri_templates: list[tuple[str, Target]] = []  # all of them, longest prefix first
        self._param_headers: dict[str, dict[str, tuple[h.ParamHeader, ...]]] = {}
        # Per backend: the last tools list filtered (held, so `is` is a sound test) and its result.
        self._filtered: dict[str, tuple[list[Any], list[Any]]] = {}
        # Pinned tool definitions (routing/pins.py), set by the runtime; None: no backend pins.
        self.pins: Pins | None = None
        # Bumped whenever a list may have taught the table something: an aggregated answer kept
        # for reuse (cache/assembled.py) is only reused while this has not moved.
        self.revision = 0

    def inherit(self, old: RouteTable) -> None:
        """Take over what `old` learned about the backends both tables share (the same
        Backend object: a reload that left its settings alone), so that a reload costs them no
        re-listing: their listed URIs and templates, their tools' header annotations. Names
        are prefix-free here (a backend's own), so a new prefix changes nothing of it."""
        self.revision = old.revision + 1  # an aggregated answer of the old table is not reused
        for target in self.targets:
            name = target.backend.name
            before = old.by_name.get(name)
            if before is None or before.backend is not target.backend:
                continue
            for uri in sorted(old._listed.get(name, ())):
                self._index(target, uri)
            self._listed[name] = {uri for uri in old._listed.get(name, ()) if uri in self._uris}
            if name in old._templates:
                self._templates[name] = list(old._templates[name])
            if name in old._param_headers:
                self._param_headers[name] = dict(old._param_headers[name])
            if name in old._filtered:
                self._filtered[name] = old._filtered[name]
        self._uri_templates = sorted(
            ((lit, t) for t in self.targets for lit in self._templates.get(t.backend.name, ())),
            key=lambda lt: (-len(lt[0]), self._order.get(lt[1].backend.name, 0)))

    # -- names ----------------------------------------------------------------------------

    def resolve_name(self, exposed: str, kind: str = "tools") -> tuple[Target, str] | None:
        """(target, the backend's own name) for a client-visible tool or prompt name (`kind`
        "tools" or "prompts"); None for a name no backend shows."""
        for n in self._lengths:
            if len(exposed) > n:
                target = self._prefixes.get(exposed[:n])
                if target is not None:
                    name = exposed[n:]
                    if target.curation is not None:
                        selection = target.curation.selection(kind)
                        if selection is not None:
                            own = selection.upstream(name)
                            return (target, own) if own is not None else None
                    return target, name
        return None

    # -- resource URIs --------------------------------------------------------------------

    def resolve_uri(self, uri: str) -> Target | None:
        """The target that serves `uri`; None when none does, or when its owner hides it."""
        target = self._resolve_uri(uri)
        if target is not None and target.curation is not None and not target.curation.shows_uri(uri):
            return None
        return target

    def _resolve_uri(self, uri: str) -> Target | None:
        for prefix, t in self._uri_prefixes:
            if uri.startswith(prefix):
                return t
        listers = self._uris.get(uri)
        if listers is not None:
            self._uris.move_to_end(uri)
            return listers[0]
        for prefix, t in self._uri_templates:
            if uri.startswith(prefix):
                return t
        if len(self.targets) == 1:
            return self.targets[0]
        return None

    def learn_resources(self, target: Target, resources: list[Any], *, first: bool = True,
                        last: bool = True) -> None:
        """Index one page of `target`'s resources/list. `first`: the page starts a listing;
        `last`: it ends one, and the URIs the backend no longer lists stop routing to it."""
        self.revision += 1
        name = target.backend.name
        if first:
            abandoned = self._listing.get(name)
            if abandoned is not None:
                # Two listings interleave (two clients paging at once): the pages no longer
                # form one listing, so this round may add URIs but must not conclude any gone;
                # what the abandoned one saw counts as listed.
                self._inconclusive.add(name)
                self._listed.setdefault(name, set()).update(u for u in abandoned if u in self._uris)
            self._listing[name] = set()
        # A later page whose first page this replica did not see only adds: without the whole
        # listing nothing can be known to be gone.
        listing = self._listing.get(name)
        listed = self._listed.setdefault(name, set())
        for res in resources:
            if isinstance(res, dict) and isinstance(res.get("uri"), str):
                uri = res["uri"]
                self._index(target, uri)
                if listing is None:
                    listed.add(uri)
                elif len(listing) < self._max_uris:
                    listing.add(uri)
                else:
                    self._inconclusive.add(name)  # past the index bound: the rest went unseen
        if last and listing is not None:
            del self._listing[name]
            if name in self._inconclusive:
                self._inconclusive.discard(name)
                listed.update(uri for uri in listing if uri in self._uris)
                return
            for uri in listed - listing:
                self._forget(target, uri)
            self._listed[name] = {uri for uri in listing if uri in self._uris}

    def _index(self, target: Target, uri: str) -> None:
        listers = self._uris.get(uri)
        if listers is None:
            self._uris[uri] = [target]
            while len(self._uris) > self._max_uris:
                evicted, gone = self._uris.popitem(last=False)
                for t in gone:
                    self._listed.get(t.backend.name, set()).discard(evicted)
            return
        self._uris.move_to_end(uri)
        if target in listers:
            return
        listers.append(target)
        listers.sort(key=lambda t: self._order.get(t.backend.name, len(self._order)))
        owner, other = listers[0].backend.name, (listers[1] if listers[0] is target else target).backend.name
        if (owner, other) not in self._conflicts_logged:
            self._conflicts_logged.add((owner, other))
            log.warning("resource %r is listed by backends %s and %s; routed to %s (first in the configured "
                        "order; further URIs both list are not logged)", uri, owner, other, owner)

    def _forget(self, target: Target, uri: str) -> None:
        listers = self._uris.get(uri)
        if listers is not None and target in listers:
            listers.remove(target)
            if not listers:
                del self._uris[uri]

    def learn_templates(self, target: Target, templates: list[Any], *, first: bool = True,
                        last: bool = True) -> None:
        """Index one page of `target`'s resources/templates/list, like `learn_resources`: a
        page adds the literal prefix of each template (the part before the first expression,
        a safe routing prefix) at once, and a complete listing replaces what the backend
        listed before, so a template it dropped stops routing to it."""
        self.revision += 1
        name = target.backend.name
        literals = [tpl["uriTemplate"].split("{", 1)[0] for tpl in templates
                    if isinstance(tpl, dict) and isinstance(tpl.get("uriTemplate"), str)]
        literals = [lit for lit in literals if lit]
        if first:
            self._template_listing[name] = []
        listing = self._template_listing.get(name)
        known = self._templates.setdefault(name, [])
        if listing is not None and len(listing) < self._max_uris:
            listing.extend(literals[: self._max_uris - len(listing)])
        if last and listing is not None and len(listing) < self._max_uris:
            del self._template_listing[name]
            updated = list(dict.fromkeys(listing))
        else:
            # Mid-listing, a page whose first page this replica did not see, or a listing past
            # the bound: add only, nothing can be known to be gone.
            if last:
                self._template_listing.pop(name, None)
            updated = list(dict.fromkeys([*known, *literals]))[: self._max_uris]
        if updated != known:  # the usual listing changes nothing: no re-sort over the fleet
            self._templates[name] = updated
            self._uri_templates = sorted(
                ((lit, t) for t in self.targets for lit in self._templates.get(t.backend.name, ())),
                key=lambda lt: (-len(lt[0]), self._order.get(lt[1].backend.name, 0)))

    # -- tool argument headers ------------------------------------------------------------

    def filter_tools(self, target: Target, tools: list[Any]) -> list[Any]:
        """Drop tools whose `x-mcp-header` annotations are invalid (SHTTP: HTTP clients MUST
        reject them, so the gateway never offers them) and remember the valid annotations."""
        last = self._filtered.get(target.backend.name)
        if last is not None and last[0] is tools:
            # The very list filtered last time: a cache hit hands out the stored list object,
            # and stored messages are never mutated (cache/policy.py `with_hints`). Walking
            # every schema again was a third of a cached tools/list (bench/README.md).
            return last[1]
        self.revision += 1
        kept = self._filter_tools(target, tools)
        self._filtered[target.backend.name] = (tools, kept)
        return kept

    def _filter_tools(self, target: Target, tools: list[Any]) -> list[Any]:
        index = self._param_headers.setdefault(target.backend.name, {})
        # Schemas are walked only when the annotation key occurs in the list at all: most
        # backends use none, and walking every schema in Python was half the cost of a
        # forwarded tools/list (bench/README.md "Profile"); one C-level encoding of the
        # list answers that question for a fraction of it.
        if not _mentions_annotations(tools):
            kept = [tool for tool in tools if isinstance(tool, dict) and isinstance(tool.get("name"), str)]
            index.update(dict.fromkeys([tool["name"] for tool in kept], ()))
            return kept
        kept = []
        for tool in tools:
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                continue
            try:
                annotations = h.param_headers(tool.get("inputSchema"))
            except h.InvalidToolDefinition as exc:
                log.warning("backend %s: tool %r excluded: %s", target.backend.name, tool["name"], exc)
                index.pop(tool["name"], None)
                continue
            index[tool["name"]] = annotations
            kept.append(tool)
        return kept

    def param_headers(self, target: Target, tool: str) -> tuple[h.ParamHeader, ...] | None:
        """The annotations of a backend tool, or None when the tool has not been listed yet."""
        return self._param_headers.get(target.backend.name, {}).get(tool)


_ANNOTATION_KEY = b'"x-mcp-header"'


def _mentions_annotations(tools: list[Any]) -> bool:
    """Whether any object in `tools` may have an `x-mcp-header` key (as JSON, a key is always
    written as this exact quoted string; orjson escapes no character of it). True when unsure."""
    try:
        return _ANNOTATION_KEY in orjson.dumps(tools)
    except (TypeError, orjson.JSONEncodeError):
        return True
