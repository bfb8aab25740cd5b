"""From a validated Call to a Reply: route, fan out, forward, and rewrite what comes back.

This is the gateway's one place that knows what each modern method means: `server/discover`
is answered here, `*/list` is aggregated, named calls go to the backend that owns the name,
`subscriptions/listen` joins the hub. What leaves is always a modern answer: `resultType`
present, names as the client sees them, no legacy error codes (digest §a.4, §j).
"""

from __future__ import annotations

import asyncio
import logging
import time
from asyncio import get_running_loop
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from gateway import __version__
from gateway.backends.base import Backend, Message, Reply, aclose
from gateway.backends.concurrency import Slot
from gateway.backends.retry import retry_after
from gateway.cache import NoCache, Outcome, ResponseCache
from gateway.cache.assembled import Source
from gateway.deadlines import Deadline, within
from gateway.observability import tracing
from gateway.observability.backend_call import BackendCall, answered
from gateway.observability.record import CURRENT, RequestRecord, note_authorization
from gateway.policies.authorization import DECIDED_METHODS, USE_OF_LIST, Plan, RuleSet, call_target
from gateway.policies.ratelimit import LimitPlan, RateLimits
from gateway.protocol import jsonrpc as rpc
from gateway.protocol import meta
from gateway.protocol.request import Call, check_param_headers
from gateway.protocol.versions import MODERN_VERSIONS
from gateway.routing.fanout import aggregate_list
from gateway.routing.table import RouteTable, Target
from gateway.routing.views import View

log = logging.getLogger("gateway.dispatch")

SERVER_INFO = {"name": "mcp-gateway", "version": __version__}
# At most this many distinct tool names get a metric series of their own (metrics.py: bounded).
_MAX_TOOL_LABELS = 2000
# Re-read a backend's tools/list at most this often when a call names a tool the index lacks.
_TOOL_INDEX_REFRESH_SECONDS = 5.0
# The field that names an item of each list, and what kind of name it is.
_ITEM_NAME = {"tools": ("name", "tools"), "prompts": ("name", "prompts"), "resources": ("uri", None),
              "resourceTemplates": ("uriTemplate", None)}
# Re-list the fleet's resources at most this often when a read names a URI the index lacks.
_RESOURCE_INDEX_REFRESH_SECONDS = 5.0


class Hub(Protocol):
    """The subscription hub seam: turns a client's listen call into its notification stream,
    with the lifecycle `Runtime` drives (subscriptions/hub.py `SubscriptionHub`)."""

    async def listen(self, call: Call, targets: tuple[Target, ...], confined_to: frozenset[str] | None = None
                     ) -> Reply:
        """`confined_to`: a view's backends; a reload never extends the listen beyond them."""

    async def start(self) -> None:
        """Called once the backends and the cache are started (before any listen)."""

    async def begin_shutdown(self) -> None:
        """The server stopped accepting: end every client stream gracefully so that the drain
        can finish."""

    async def aclose(self) -> None:
        """Stop everything (upstream streams, the bus); the hub is not used again."""


class Budget(Deadline):
    """`backends[].timeout_seconds` as the whole call's budget, as the client sees it: the
    routing work (a tool-index refresh), the connection, every retry and the answer come out
    of it, so no phase gets a fresh deadline (docs/resilience.md "Deadlines"). A streamed
    answer must start within it; from then on its reads and `max_call_seconds` bound it.
    It is its own (coarse) deadline: `with budget:` bounds the call, no timer per call and no
    second object."""

    __slots__ = ("target", "call", "seconds", "phase")

    def __init__(self, target: Target, call: Call) -> None:
        # Deadline's own fields set here, not through its __init__: made for every call.
        self.target = target
        self.call = call
        self.seconds = seconds = target.backend.settings.timeout_seconds
        self.when = get_running_loop().time() + seconds
        self._fired = False
        self.phase = "waiting for its answer"

    def exhausted(self) -> rpc.McpError:
        backend = self.target.backend
        spent = get_running_loop().time() - (self.when - self.seconds)
        backend.health.failed(f"no {self.call.method} answer within {self.seconds:g}s")
        return rpc.McpError(
            rpc.BACKEND_TIMEOUT,
            f"Backend {backend.name!r} did not answer within {self.seconds:g}s ({self.call.method}: "
            f"backends[].timeout_seconds is the whole call's budget; it ran out after {spent:.2f}s, {self.phase})",
            status=504, data={"backend": backend.name, "limit": "backends[].timeout_seconds", "phase": self.phase},
            request_id=self.call.id)


# Methods whose target the route table learns at run time (a URI's owner: from lists) or only
# the body names (a completion's ref): governed from a plan worked out per request.
_TARGET_FROM_URI_OR_BODY = frozenset({"resources/read", "completion/complete"})
# (method, name) pairs whose governance plan a dispatcher keeps; past it the memo starts over.
_GOVERNANCE_PLANS = 4096


@dataclass(frozen=True, slots=True)
class _GovernancePlan:
    """What governs one target whoever calls it (`Dispatcher._governance_plan`): what a request
    still does is check the plans' caller-dependent parts against its principal."""

    target: str | None          # the tool or prompt name, or the resource URI
    backend: str | None         # the backend the whole fleet gives it
    rules: Plan | None          # the global rules' plan; None: no rule decides this method
    view_rules: Plan | None     # the view's own rules' plan; None: no view rules, or not in the view
    limits: LimitPlan | None    # the rate limits' plan; None: no rate limits configured


class Dispatcher:
    def __init__(self, table: RouteTable, *, cache: ResponseCache | None = None, hub: Hub | None = None,
                 instructions: str | None = None, rules: RuleSet | None = None,
                 rate_limits: RateLimits | None = None, view: View | None = None) -> None:
        self.table = table
        # A view (routing/views.py) serves only its backends and names, under its own rules
        # as well as the global ones; None: the whole fleet (the main path).
        self.view = view
        self.targets: tuple[Target, ...] = table.targets if view is None else tuple(
            t for t in table.targets if view.shows_backend(t.backend.name))
        # Governance (docs/governance.md): decided here for every request, whichever door it
        # came in by (modern, initialize-era, HTTP+SSE); None when not configured.
        self.rules = rules
        self.view_rules = view.rules if view is not None else None
        self.rate_limits = rate_limits
        self._governed = rules is not None or rate_limits is not None or self.view_rules is not None
        self._governance_plans: dict[tuple[str, str | None], _GovernancePlan] = {}
        # Lists are cut per caller (`_visible_result`), listens filtered (`_visible_listen`).
        self._cuts = rules is not None or view is not None
        self._cut_tag = (view.path if view is not None else "", rules.fingerprint if rules is not None else "",
                         self.view_rules.fingerprint if self.view_rules is not None else "")
        self.cache: ResponseCache = cache or NoCache()
        self.hub = hub
        self.instructions = instructions
        self._tool_index_refreshed: dict[str, float] = {}
        self._resource_index_refreshed = float("-inf")
        self._resource_index_refresh: asyncio.Future[Any] | None = None
        self._tool_labels: set[str] = set()

    async def dispatch(self, call: Call) -> Reply:
        """Answer one call; the request's record (observability/record.py) learns what it was,
        where it went and how it ended, and its SERVER span opens here, where `params._meta`
        is known."""
        record = CURRENT.get()
        if record is None or record.noted or record.finished:
            return await self._route(call)
        record.noted = True
        if record.era == "modern":
            # An initialize-era client's record names what it sent (read from its body by the
            # telemetry step), not the modern calls the gateway makes for it.
            record.method, record.jsonrpc_id, record.version = call.method, call.id, call.version
            record.name = call.name
        principal = call.principal
        if principal is not None and principal.authenticated:
            record.subject = principal.subject
        token = None
        if tracing._tracer is not None and record.span is None:  # tracing.enabled(), inline
            if record.era == "modern":
                record.meta = call.meta
            # Current while this call's work runs here (its CLIENT and INTERNAL spans are its
            # children); the telemetry step ends it when the answer is sent.
            token = tracing.attach(tracing.open_server_span(record, call.headers))
        try:
            # `_route`, without its call when nothing governs: the handler's coroutine at once.
            reply = await (self._route(call) if self._governed else self._handle(call))
        except rpc.McpError as exc:
            record.code, record.message = exc.code, exc.message
            raise
        finally:
            if token is not None:
                tracing.detach(token)
        if record.backend is None:
            record.backend = reply.backend
        record.note_answer(reply.message)
        return reply

    def _route(self, call: Call) -> Awaitable[Reply]:
        """The handler's coroutine for this call, not awaited: `dispatch` awaits it, so the
        record's bookkeeping adds no coroutine frame per request. Governance decides first: a
        refusal (403, 429) is raised from here, inside `dispatch`, so the record notes it."""
        if self._governed:
            pending = self._govern(call)
            if pending is not None:
                return self._route_when_admitted(pending, call)
        return self._handle(call)

    async def _route_when_admitted(self, pending: Awaitable[None], call: Call) -> Reply:
        """The shared (Redis) rate limiter's answer first, then the handler."""
        await pending
        return await self._handle(call)

    def _handle(self, call: Call) -> Awaitable[Reply]:
        method = call.method
        # Named calls first: most requests are tools/call (the methods are disjoint, so the
        # order decides nothing else).
        if method in ("tools/call", "prompts/get"):
            return self._named(call)
        if method == "server/discover":
            return self._discover(call)
        spec = call.spec
        assert spec is not None
        if spec.list_key is not None:
            return self._list(call)
        if method == "resources/read":
            return self._read(call)
        if method == "completion/complete":
            return self._complete(call)
        if spec.stream_only:
            if self.hub is None:
                raise rpc.method_not_found(method, call.id)
            if self._cuts:
                return self._visible_listen(call)
            return self.hub.listen(call, self.targets)
        raise rpc.method_not_found(method, call.id)

    # -- governance -------------------------------------------------------------------------

    def _govern(self, call: Call) -> Awaitable[None] | None:
        """Authorization rules, then rate limits; raises the refusal (403, 429). Synchronous
        unless a shared (Redis) limiter must be asked: then the awaitable that asks it."""
        method = call.method
        if method in _TARGET_FROM_URI_OR_BODY:
            plan = self._governance_plan(method, *call_target(method, call.params, call.name))
        else:
            # A tool or prompt name (or none): what governs it is fixed for this snapshot's
            # table and rules, so it is worked out once per (method, name), not per request.
            key = (method, call.name)
            plan = self._governance_plans.get(key)
            if plan is None:
                plan = self._governance_plan(method, call.name, None)
                if len(self._governance_plans) >= _GOVERNANCE_PLANS:
                    self._governance_plans.clear()  # names come from clients: a bound, not a leak
                self._governance_plans[key] = plan
        principal = call.principal
        if plan.rules is not None:
            assert self.rules is not None
            decision = self.rules.verdict(plan.rules, principal)
            note_authorization(decision.allowed, decision.rule)
            if not decision.allowed:
                raise self.rules.refusal(decision, method, plan.target).with_id(call.id)
        if plan.view_rules is not None:
            assert self.view_rules is not None
            decision = self.view_rules.verdict(plan.view_rules, principal)
            if not decision.allowed:
                raise self.view_rules.refusal(decision, method, plan.target).with_id(call.id)
        if plan.limits is not None:
            assert self.rate_limits is not None
            return self.rate_limits.check_plan(plan.limits, principal, method, plan.target, plan.backend)
        return None

    def _governance_plan(self, method: str, name: str | None, uri: str | None) -> _GovernancePlan:
        """What the rules and limits need to know of a target, whoever calls: its backend (as
        the whole fleet names it: the global rules see the main path's backend), the rules'
        plans, the limits' plan."""
        decided = method in DECIDED_METHODS
        if not decided:
            name = uri = None
        kind = "tools" if method == "tools/call" else "prompts"
        backend = self._backend_of(name, uri, kind, whole_fleet=True)
        rules = self.rules.plan(method, name, uri, backend) if self.rules is not None and decided else None
        view_rules = None
        if self.view_rules is not None and decided and self._in_view(name, uri, backend):
            # A name outside the view is not refused here: it is unknown (-32602), answered
            # by the handler exactly like a name curation hides.
            view_rules = self.view_rules.plan(method, name, uri, backend)
        target = name if name is not None else uri
        limits = self.rate_limits.plan(method, target, backend) if self.rate_limits is not None else None
        return _GovernancePlan(target, backend, rules, view_rules, limits)

    async def _visible_listen(self, call: Call) -> Reply:
        """A listen that carries only what this caller may see: subscriptions to URIs it may
        not read are never made, and an update for a URI it may not read (under a prefix it
        subscribed to) is not delivered (docs/governance.md)."""
        assert self.hub is not None
        principal = call.principal

        def may_read(uri: Any) -> bool:
            return isinstance(uri, str) and self._may_use(principal, "resources/read", None, uri,
                                                          self._backend_of(None, uri, whole_fleet=True))

        wire = call.params.get("notifications")
        if isinstance(wire, dict) and isinstance(wire.get("resourceSubscriptions"), list):
            uris = wire["resourceSubscriptions"]
            visible = [u for u in uris if not isinstance(u, str) or may_read(u)]
            if len(visible) != len(uris):
                call = call.with_params({**call.params, "notifications": {**wire, "resourceSubscriptions": visible}})
        view = self.view
        if view is not None and view.backends is not None:
            reply = await self.hub.listen(call, self.targets, view.backends)
        else:
            reply = await self.hub.listen(call, self.targets)
        if reply.stream is not None:
            reply.stream = _VisibleNotifications(reply.stream, may_read)
        return reply

    def _backend_of(self, name: str | None, uri: str | None, kind: str = "tools", *,
                    whole_fleet: bool = False) -> str | None:
        if name is not None:
            resolved = self.table.resolve_name(name, kind) if whole_fleet else self._resolve_name(name, kind)
            return resolved[0].backend.name if resolved is not None else None
        if uri is not None:
            target = self.table.resolve_uri(uri) if whole_fleet else self._resolve_uri(uri)
            return target.backend.name if target is not None else None
        return None

    # -- what this endpoint shows (the whole fleet, or a view's part of it) ---------------

    def _resolve_name(self, name: str, kind: str = "tools") -> tuple[Target, str] | None:
        """The route table's answer, or None for a name outside this view: unknown."""
        resolved = self.table.resolve_name(name, kind)
        view = self.view
        if view is None or resolved is None:
            return resolved
        if not (view.shows_backend(resolved[0].backend.name) and view.shows_name(name)):
            return None
        return resolved

    def _resolve_uri(self, uri: str) -> Target | None:
        target = self.table.resolve_uri(uri)
        view = self.view
        if view is None or target is None or view.shows_backend(target.backend.name):
            return target
        return None

    def _in_view(self, name: str | None, uri: str | None, backend: str | None) -> bool:
        view = self.view
        if view is None:
            return True
        if backend is not None and not view.shows_backend(backend):
            return False
        return name is None or view.shows_name(name)

    def _may_use(self, principal: Any, use: str, name: str | None, uri: str | None,
                 backend: str | None) -> bool:
        """Whether this caller may use an item of this endpoint: in the view (when one), and
        allowed by the global rules and by the view's own."""
        if self.view is not None and not self._in_view(name, uri, backend):
            return False
        rules = self.rules
        if rules is not None and not rules.allows(principal, use, name=name, uri=uri, backend=backend):
            return False
        view_rules = self.view_rules
        return view_rules is None or view_rules.allows(principal, use, name=name, uri=uri, backend=backend)

    # -- capability view of the fleet -----------------------------------------------------

    def capable(self, capability: str | None) -> tuple[Target, ...]:
        """Targets that advertise `capability`, or whose capabilities are not known yet."""
        if capability is None:
            return self.targets
        return tuple(
            t for t in self.targets if t.backend.capabilities is None or capability in t.backend.capabilities
        )

    # -- server/discover ------------------------------------------------------------------

    async def _discover(self, call: Call) -> Reply:
        # All backends at once, each bounded by its own deadline and failure memory
        # (Backend.discover): one hung backend must not hold the fleet's answer (or a legacy
        # client's initialize) for longer than its list_timeout_seconds.
        answers = await asyncio.gather(*(t.backend.discover(stale_ok=True) for t in self.targets),
                                       return_exceptions=True)
        results: list[Message] = []
        for target, answer in zip(self.targets, answers, strict=True):
            if isinstance(answer, rpc.McpError):
                log.warning("server/discover: backend %s left out: %s", target.backend.name, answer.message)
            elif isinstance(answer, BaseException):
                raise answer
            else:
                results.append(answer)
        result: dict[str, Any] = {
            "supportedVersions": list(MODERN_VERSIONS),
            "capabilities": merge_capabilities([r.get("capabilities") or {} for r in results]),
            "resultType": "complete",
            # The fleet's capabilities change only with its membership; a short, shared TTL.
            "ttlMs": min([_ttl(r) for r in results] + [60_000]) if results else 0,
            "cacheScope": "private" if any(r.get("cacheScope") != "public" for r in results) else "public",
            "_meta": {meta.SERVER_INFO: SERVER_INFO},
        }
        instructions = self.instructions or _joined_instructions(self.targets, results)
        if instructions:
            result["instructions"] = instructions
        return Reply("gateway", message=rpc.result_message(call.id, result))  # type: ignore[arg-type]

    # -- aggregated lists -----------------------------------------------------------------

    async def _list(self, call: Call) -> Reply:
        assert call.spec is not None
        targets = self.capable(call.spec.capability)
        if not targets:
            raise rpc.method_not_found(call.method, call.id)
        if self.table.pins is not None and call.method == "tools/list":
            await self.table.pins.reload_if_stale()  # an accept made elsewhere shows within seconds
        # A cut answer is kept as cut, under a key that says whose cut it is (`_cut_key`).
        endpoint = self._cut_key(call.principal) if self._cuts else ""
        again = self.cache.assembled_again(call, targets, self.table.revision, endpoint)
        if again is not None:
            message, body = again
            return Reply("gateway", message=message, raw=body, headers=_CACHE_HIT)
        outcomes: list[Outcome] = []
        sources: list[Source] = []

        async def fetch(target: Target, sub: Call) -> Message:
            # One child span per backend of the fan-out (a cache hit has no CLIENT span).
            with tracing.internal_span(f"fanout {target.backend.name}", **{"mcp.gateway.backend.name":
                                                                            target.backend.name}):
                message, outcome = await self.cache.fetch(target, sub, lambda: self._list_page(target, sub),
                                                          sources)
            outcomes.append(outcome)
            return message

        result = await aggregate_list(call, self.table, targets, fetch)
        result.setdefault("_meta", {})[meta.SERVER_INFO] = SERVER_INFO
        if self._cuts:
            result = self._visible_result(call, result)
        if outcomes and len(sources) == len(outcomes) and result["ttlMs"] > 0:
            # Assembled from fresh entries only, none left out (a partial answer has ttlMs 0):
            # the same request is answered from this until one of them changes.
            self.cache.keep_assembled(call, targets, self.table.revision, sources, result, endpoint)
        message = rpc.result_message(call.id, result)  # type: ignore[arg-type]
        return Reply("gateway", message=message, headers=_cache_header(outcomes))

    def _cut_key(self, principal: Any) -> tuple[Any, ...]:
        """Everything a cut list depends on beyond the request and the fleet's entries (which
        the kept answer's own key and sources hold: cache/assembled.py): this endpoint, the
        rules' fingerprints, and what of the caller the rules read (its scopes and claims; a
        principal is already in the key when authenticated, and a new token of the same
        subject may carry other claims). Measured against cutting the shared answer on every
        request: bench/README.md "Governance"."""
        claims = principal.claims
        return (self._cut_tag, principal.scopes,
                orjson.dumps(dict(claims), option=orjson.OPT_SORT_KEYS) if claims else b"")

    def _visible_result(self, call: Call, result: dict[str, Any]) -> dict[str, Any]:
        """The list as this caller may use it on this endpoint: an item is listed when the call
        that uses it is allowed (policies/authorization.py) and, on a view, is in the view.
        The backends' answers stay cached unfiltered and shared by every caller and path; this
        cut is kept (in process) under `_cut_key`, so it is never handed to a caller or a path
        whose cut may differ, and a change of rules (a restart) makes new keys. The cut is per
        caller, so it is `private` (spec: caching §cacheScope)."""
        assert call.spec is not None
        key = call.spec.list_key
        if key not in _ITEM_NAME or not isinstance(result.get(key), list):
            return result
        field_name, kind = _ITEM_NAME[key]
        use = USE_OF_LIST[call.method]
        principal = call.principal
        kept = []
        for item in result[key]:
            name = item.get(field_name) if isinstance(item, dict) else None
            if not isinstance(name, str):
                continue
            if kind is not None:
                backend = self._backend_of(name, None, kind, whole_fleet=True)
                allowed = self._may_use(principal, use, name, None, backend)
            else:
                allowed = self._may_use(principal, use, None, name, self._backend_of(None, name, whole_fleet=True))
            if allowed:
                kept.append(item)
        return {**result, key: kept, "cacheScope": "private"}

    async def _list_page(self, target: Target, call: Call) -> Message:
        """One backend's page, within its `list_timeout_seconds`: a late backend is left out of
        the aggregated answer (fanout.py), not waited for. The deadline bounds the trip to the
        backend only; a cache hit never arms it (a timer is a measurable share of a cached list:
        bench/README.md "Profile"), and everything else a lookup may wait on is bounded on its own
        (the store's socket timeouts, the fill lock's lifetime, the single-flight leader's own
        deadline)."""
        limit = target.backend.settings.list_timeout_seconds
        try:
            async with asyncio.timeout(limit):
                return await self._final(target, call)
        except TimeoutError:
            target.backend.health.failed(f"no {call.method} answer within {limit:g}s")
            raise

    # -- named calls ----------------------------------------------------------------------

    async def _named(self, call: Call) -> Reply:
        name = call.name
        assert name is not None
        tool = call.method == "tools/call"  # else prompts/get
        arguments = call.params.get("arguments")
        if arguments is not None and not isinstance(arguments, dict):
            # SCHEMA: `arguments` of tools/call and prompts/get is an object; a malformed call
            # is -32602 (TOOLS). Forwarded, it reached the backend as something no tool can
            # take, and an `x-mcp-header` argument could not be found in it (§b.2).
            raise rpc.invalid_params(f'"params.arguments" of {call.method} must be an object', call.id)
        kinds = "tools" if tool else "prompts"
        # The whole fleet's answer is the table's (`_resolve_name`, inline without a view).
        resolved = self.table.resolve_name(name, kinds) if self.view is None else self._resolve_name(name, kinds)
        if resolved is None:
            raise rpc.invalid_params(f"Unknown {'tool' if tool else 'prompt'}: {name!r} (no backend serves this name)",
                                     call.id, data={"name": name})
        target, upstream_name = resolved
        # The same call when the backend's name is the client's (`with_name`, inline).
        upstream = call if upstream_name == name else call.with_name(upstream_name)
        if not tool:
            return await self._forward_within_budget(target, upstream)
        # What the table knows of the tool: its `x-mcp-header` annotations, None when no list
        # showed it yet (then its label is "other", and the index is refreshed in the budget).
        annotations = self.table.param_headers(target, upstream_name)
        record = CURRENT.get()
        if record is not None:
            record.tool_label = name if name in self._tool_labels else self._tool_label(name, annotations is not None)
        pins = self.table.pins
        if pins is not None:
            # Before the budget: the pin store is the gateway's, not the backend's, and its
            # reads are bounded on their own (a failed read keeps the last copy, pins.py);
            # a slow store must not count against the backend's health.
            await pins.reload_if_stale()
            reason = pins.withheld(target.backend.name, upstream_name)
            if reason is not None:
                raise rpc.invalid_params(reason[0].upper() + reason[1:], call.id,
                                         data={"backend": target.backend.name, "name": name, "pin": "changed"})
            annotations = self.table.param_headers(target, upstream_name)  # a list may have come meanwhile
        budget = Budget(target, call)
        try:
            with budget:
                if annotations is None:
                    budget.phase = "refreshing its tool index"
                    annotations = await self._param_annotations(target, upstream_name)
                    budget.phase = "waiting for its answer"
                if annotations:
                    check_param_headers(call, annotations)
                return await self._forward(target, upstream, budget)
        except TimeoutError:
            if not budget.expired():
                raise
            raise budget.exhausted() from None

    def _tool_label(self, name: str, known: bool) -> str:
        """The tool's metric label: its client-facing name when the route table knows the tool
        (`known`: a backend listed it), else "other" (label values never come from raw input)."""
        if name in self._tool_labels:
            return name
        if not known or len(self._tool_labels) >= _MAX_TOOL_LABELS:
            return "other"
        self._tool_labels.add(name)
        return name

    async def tool_param_headers(self, name: str) -> tuple[Any, ...]:
        """The `x-mcp-header` annotations of the tool clients call `name` (empty if unknown).
        Requests the gateway synthesizes (for legacy clients) mirror arguments with these."""
        resolved = self._resolve_name(name)
        if resolved is None:
            return ()
        return tuple(await self._param_annotations(*resolved) or ())

    async def _param_annotations(self, target: Target, tool: str) -> Any:
        annotations = self.table.param_headers(target, tool)
        if annotations is not None:
            return annotations
        # The tool was not seen in a tools/list yet: read the backend's list once (bounded in
        # rate) so that `x-mcp-header` rules are enforced from the first call.
        name = target.backend.name
        now = time.monotonic()
        if now - self._tool_index_refreshed.get(name, 0.0) < _TOOL_INDEX_REFRESH_SECONDS:
            return None
        self._tool_index_refreshed[name] = now
        try:
            await self.refresh_tool_index(target)
        except rpc.McpError as exc:
            log.info("tools index refresh for %s failed: %s", name, exc.message)
        return self.table.param_headers(target, tool)

    async def refresh_tool_index(self, target: Target) -> None:
        from gateway.backends.base import internal_call

        cursor: str | None = None
        for _ in range(100):  # bounded: a backend that pages forever is not followed forever
            params = {"cursor": cursor} if cursor is not None else {}
            message = await self._final(target, internal_call("tools/list", params))
            result = message.get("result") or {}
            self.table.filter_tools(target, result.get("tools") or [])
            cursor = result.get("nextCursor")
            if not isinstance(cursor, str):
                return

    async def _resolve_relisted(self, uri: str) -> Target | None:
        """The backend that serves a URI the route table does not know (never listed, or
        evicted from its bounded index): the fleet's resources/list is read once, bounded in
        rate, before the answer is "nobody"."""
        refresh = self._resource_index_refresh
        if refresh is None or refresh.done():
            if time.monotonic() - self._resource_index_refreshed < _RESOURCE_INDEX_REFRESH_SECONDS:
                return None
            self._resource_index_refreshed = time.monotonic()
            # One shared refresh: misses that arrive while it runs wait for it rather than
            # being told "not found" for a URI it is about to learn. Shielded, so a caller
            # that goes away does not cancel it for the others.
            refresh = self._resource_index_refresh = asyncio.ensure_future(
                asyncio.gather(*(self._refresh_resource_index(t) for t in self.capable("resources"))))
        await asyncio.shield(refresh)
        return self._resolve_uri(uri)

    async def _refresh_resource_index(self, target: Target) -> None:
        from gateway.backends.base import internal_call

        cursor: str | None = None
        try:
            async with asyncio.timeout(target.backend.settings.list_timeout_seconds):
                for _ in range(100):  # bounded: a backend that pages forever is not followed forever
                    params = {"cursor": cursor} if cursor is not None else {}
                    result = (await self._final(target, internal_call("resources/list", params))).get("result")
                    if not isinstance(result, dict):
                        return
                    cursor = result.get("nextCursor")
                    resources = result.get("resources")
                    self.table.learn_resources(target, resources if isinstance(resources, list) else [],
                                               first="cursor" not in params, last=not isinstance(cursor, str))
                    if not isinstance(cursor, str):
                        return
        except (rpc.McpError, TimeoutError) as exc:
            log.info("resources index refresh for %s failed: %s", target.backend.name,
                     getattr(exc, "message", None) or "no answer in time")

    async def _read(self, call: Call) -> Reply:
        assert call.name is not None
        target = self._resolve_uri(call.name) or await self._resolve_relisted(call.name)
        if target is None:
            raise rpc.invalid_params(f"Resource not found: {call.name!r} (no backend serves this URI)", call.id,
                                     data={"uri": call.name})
        m = call.meta
        streaming = meta.PROGRESS_TOKEN in m or meta.LOG_LEVEL in m
        budget = Budget(target, call)
        try:
            with budget:
                if streaming or "inputResponses" in call.params or "requestState" in call.params:
                    # Relayed as it comes (progress, logs) or an MRTR retry: never from the cache.
                    reply = await self._forward(target, call, budget)
                    reply.headers = [*(reply.headers or []), *_cache_header(["bypass"])]  # type: ignore[misc]
                    return reply
                message, outcome = await self.cache.fetch(target, call, lambda: self._final(target, call))
        except TimeoutError:
            if not budget.expired():
                raise
            raise budget.exhausted() from None
        return Reply(target.backend.name, status=rpc.http_status_of(message), message=message,
                     headers=_cache_header([outcome]))

    async def _complete(self, call: Call) -> Reply:
        ref = call.params.get("ref")
        if not isinstance(ref, dict):
            raise rpc.invalid_params('"ref" must be an object', call.id)
        if ref.get("type") == "ref/prompt" and isinstance(ref.get("name"), str):
            resolved = self._resolve_name(ref["name"], "prompts")
            if resolved is None:
                raise rpc.invalid_params(f"Unknown prompt: {ref['name']!r}", call.id)
            target, upstream = resolved
            params = dict(call.params)
            params["ref"] = {**ref, "name": upstream}
            return await self._forward_within_budget(target, call.with_params(params))
        if ref.get("type") == "ref/resource" and isinstance(ref.get("uri"), str):
            target = self._resolve_uri(ref["uri"]) or await self._resolve_relisted(ref["uri"])
            if target is None:
                raise rpc.invalid_params(f"Resource not found: {ref['uri']!r}", call.id)
            return await self._forward_within_budget(target, call)
        raise rpc.invalid_params('"ref" must be a ref/prompt with a name or a ref/resource with a uri', call.id)

    # -- forwarding -----------------------------------------------------------------------

    async def _send(self, target: Target, call: Call) -> tuple[Reply, BackendCall | None]:
        """backend.send, measured, traced and guarded by the backend's remembered health and its
        concurrency bound: the one place every upstream call passes, for every backend kind
        (observability/backend_call.py, docs/resilience.md). The measure runs until the answer
        is complete: `_final` and `_forward` end it. Traced, a BackendCall holds the call's
        CLIENT spans from the start; untraced, only the clock is read here and the object is
        made when the answer is a stream, or the call fails: a whole answer is counted without
        one (`answered`), and no BackendCall is handed back."""
        backend = target.backend
        health = backend.health
        if health.ejected:
            health.admit(call.id)  # -31001 at once, unless this call is the half-open trial
        limiter = backend.limiter
        slot = None
        if limiter is not None:
            await limiter.acquire(call.id)
            slot = Slot(limiter)
        record = CURRENT.get()
        tool = record.tool_label or "" if record is not None else ""
        probe = BackendCall(backend, call, tool) if tracing._tracer is not None else None
        started = time.perf_counter()
        sending = call if probe is None else probe.call  # traced: with the span's context
        retry_budget = backend.retry_budget
        if not retry_budget.full:  # a full budget stays full: the deposit is skipped
            retry_budget.deposit()
        try:
            try:
                reply = await backend.send(sending)
            except rpc.McpError as exc:
                # The first attempt is sent here, the rest (if any) by retry.py.
                reply = await retry_after(backend, sending, health.failed, error=exc)
            else:
                if reply.status >= 500:
                    reply = await retry_after(backend, sending, health.failed, reply=reply)
        except rpc.McpError as exc:
            if slot is not None:
                slot.release()
            (probe or BackendCall(backend, call, tool, started)).failed(exc)
            raise
        except BaseException:
            if slot is not None:
                slot.release()
            (probe or BackendCall(backend, call, tool, started)).abandoned()
            raise
        if reply.status < 500:
            endpoint = health.single  # health.succeeded(), inline: one call less per request
            if endpoint is not None:
                endpoint.succeeded()
        if slot is not None:
            _hold_until_done(reply, slot)
        if record is not None and record.backend is None:
            record.backend = backend.name
        if probe is None:
            if reply.message is not None:
                answered(backend, call, tool, started, reply.message)
                return reply, None
            probe = BackendCall(backend, call, tool, started)
        probe.sent(reply.message)
        return reply, probe

    async def _final(self, target: Target, call: Call) -> Message:
        backend = target.backend
        # Counted while under way, so that a reload's drain of this backend waits for it.
        backend.in_flight += 1
        try:
            reply, probe = await self._send(target, call)
            if reply.message is not None:
                message = reply.message
            else:
                assert probe is not None  # a stream's call is measured by its BackendCall
                try:
                    message = await reply.final()
                except rpc.McpError as exc:
                    probe.failed(exc)
                    raise
                except BaseException:
                    probe.abandoned()
                    raise
                probe.complete(message)
            return modernize(message, call, backend.name)
        finally:
            backend.in_flight -= 1

    async def _forward_within_budget(self, target: Target, call: Call) -> Reply:
        budget = Budget(target, call)
        try:
            with budget:
                return await self._forward(target, call, budget)
        except TimeoutError:
            if not budget.expired():
                raise
            raise budget.exhausted() from None

    async def _forward(self, target: Target, call: Call, budget: Budget | None = None) -> Reply:
        # Counted in the backend's in-flight calls while under way (what a reload's drain waits
        # for): a whole answer uncounts it here, a stream hands it to an _UnderWay (no object
        # per call for the common whole answer).
        backend = target.backend
        backend.in_flight += 1
        try:
            reply, probe = await self._send(target, call)
        except BaseException:
            backend.in_flight -= 1
            raise
        message = reply.message
        if message is not None:
            backend.in_flight -= 1
            result = message.get("result")
            if type(result) is dict and result.get("resultType") == "complete":
                return reply  # what `modernize` answers for it, the same message: most answers
            fixed = modernize(message, call, reply.backend)
            if fixed is not message:
                reply.message, reply.raw = fixed, None
            return reply
        assert reply.stream is not None and probe is not None
        # A stream stays under way until it is relayed (its generator's end) or dropped unread
        # (the Reply's closer: a generator that never started runs no `finally`).
        under_way = _UnderWay(backend)
        reply.closers.append(under_way.end)
        reply.stream = _modernize_stream(reply.stream, call, reply.backend, probe, CURRENT.get(), budget,
                                         under_way)
        return reply


class _UnderWay:
    """A call counted in its backend's `in_flight` (by `_forward`, before it was sent), uncounted
    once whichever way it ends."""

    __slots__ = ("_backend",)

    def __init__(self, backend: Backend) -> None:
        self._backend: Backend | None = backend

    def end(self) -> None:
        backend, self._backend = self._backend, None
        if backend is not None:
            backend.in_flight -= 1


def _hold_until_done(reply: Reply, slot: Slot) -> None:
    """A streamed answer keeps its concurrency slot until the stream ends or is closed."""
    if reply.stream is None:
        slot.release()
        return
    reply.closers.append(slot.release)
    reply.stream = _released_at_end(reply.stream, slot)


async def _released_at_end(stream: AsyncIterator[Message], slot: Slot) -> AsyncIterator[Message]:
    try:
        async for message in stream:
            yield message
    finally:
        slot.release()
        await aclose(stream)


def modernize(message: Message, call: Call, backend: str) -> Message:
    """Make a backend's final response a valid modern answer for this call. Returns the same
    object when nothing had to change (the fast path relays the backend's bytes)."""
    result = message.get("result")
    if isinstance(result, dict):
        rtype = result.get("resultType")
        if rtype is None:
            # Servers implementing 2026-07-28 MUST include it (schema `Result`).
            return {**message, "result": {**result, "resultType": "complete"}}
        if rtype in ("complete", "input_required"):
            if rtype == "input_required" and not (call.spec is not None and call.spec.mrtr):
                raise rpc.backend_protocol_error(backend, f"input_required is not allowed for {call.method}", call.id)
            return message
        if rtype == "task" and call.declares_extension(meta.TASKS_EXTENSION):
            return message
        raise rpc.backend_protocol_error(backend, f"result type {rtype!r} the client did not negotiate", call.id)
    error = message.get("error")
    if not isinstance(error, dict):
        # `"result": "done"`, `"error": "bad"`: no JSON-RPC response (SCHEMA), and relayed raw
        # it would reach the client as the gateway's own answer.
        raise rpc.backend_protocol_error(backend, "its answer has neither a result object nor an error object",
                                         call.id)
    if error.get("code") == rpc.LEGACY_RESOURCE_NOT_FOUND:
        # Modern implementations MUST NOT emit -32002 (digest §a.4, §h.7).
        return {**message, "error": {**error, "code": rpc.INVALID_PARAMS}}
    return message


async def _modernize_stream(stream: AsyncIterator[Message], call: Call, backend: str, probe: BackendCall,
                            record: RequestRecord | None, budget: Budget | None = None,
                            under_way: _UnderWay | None = None) -> AsyncIterator[Message]:
    """The stream, made modern. With a budget, its first message must come within the call's
    budget (Budget): from then on the stream's own read and max_call_seconds bounds hold.
    `under_way`: the backend's in-flight count this stream holds until it ends."""
    wants_logs = call.log_level is not None
    try:
        if budget is not None:
            first = within(budget.when)
            try:
                with first:
                    msg = await anext(stream, None)
            except TimeoutError:
                if not first.expired():
                    raise
                raise budget.exhausted() from None
            if msg is None:
                raise rpc.backend_protocol_error(backend, "stream ended without a response", call.id)
            messages: AsyncIterator[Message] = _chain(msg, stream)
        else:
            messages = stream
        async for msg in messages:
            method = msg.get("method")
            if method is None:
                probe.complete(msg)
                if record is not None:
                    record.note_answer(msg)
                yield modernize(msg, call, backend)
                return
            if "id" in msg:
                # Servers MUST NOT send requests on any stream (SHTTP); never relay one.
                log.warning("backend %s sent a request (%s) on a response stream; dropped", backend, method)
                continue
            if method == "notifications/message" and not wants_logs:
                continue  # LOG: no log messages for requests without a logLevel
            yield msg
        raise rpc.backend_protocol_error(backend, "stream ended without a response", call.id)
    except rpc.McpError as exc:
        probe.failed(exc)
        if record is not None and record.code is None:
            record.code, record.message = exc.code, exc.message
        raise
    finally:
        probe.abandoned()  # a no-op once the answer was noted
        if under_way is not None:
            under_way.end()
        await aclose(stream)


async def _chain(first: Message, rest: AsyncIterator[Message]) -> AsyncIterator[Message]:
    yield first
    async for msg in rest:
        yield msg


class _VisibleNotifications:
    """A listen stream without the `resources/updated` notifications its caller may not see.
    Cancel-safe when the stream it wraps is (a cancelled wait loses nothing: the skip happens
    only after a message arrived)."""

    def __init__(self, stream: AsyncIterator[Message], may_read: Any) -> None:
        self._stream = stream
        self._may_read = may_read
        self.cancel_safe_next = getattr(stream, "cancel_safe_next", False)

    def __aiter__(self) -> _VisibleNotifications:
        return self

    async def __anext__(self) -> Message:
        while True:
            message = await self._stream.__anext__()
            if message.get("method") == "notifications/resources/updated":
                params = message.get("params")
                if not (isinstance(params, dict) and self._may_read(params.get("uri"))):
                    continue
            return message

    async def aclose(self) -> None:
        await aclose(self._stream)

    def __getattr__(self, name: str) -> Any:
        # Anything else the endpoint or the hub asks of the stream (its granted filter, ...).
        return getattr(self._stream, name)


def merge_capabilities(all_caps: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for caps in all_caps:
        for key in ("tools", "prompts", "resources"):
            if isinstance(caps.get(key), dict):
                into = merged.setdefault(key, {})
                for flag in ("listChanged", "subscribe"):
                    if caps[key].get(flag):
                        into[flag] = True
        for key in ("completions", "logging"):
            if key in caps:
                merged[key] = {}
    return merged


def _ttl(result: Message) -> int:
    ttl = result.get("ttlMs")
    return max(0, int(ttl)) if isinstance(ttl, (int, float)) and not isinstance(ttl, bool) else 0


def _joined_instructions(targets: tuple[Target, ...], results: list[Message]) -> str | None:
    parts = [r["instructions"] for r in results if isinstance(r.get("instructions"), str) and r["instructions"]]
    if not parts:
        return None
    if len(targets) == 1:
        return parts[0]
    return "\n\n".join(parts)


_CACHE_HIT = [(b"x-cache", b"hit")]


def _cache_header(outcomes: list[Outcome]) -> list[tuple[bytes, bytes]] | None:
    if not outcomes:
        return None
    for value in ("bypass", "miss", "stale"):
        if value in outcomes:
            return [(b"x-cache", value.encode())]
    return [(b"x-cache", b"hit")]
