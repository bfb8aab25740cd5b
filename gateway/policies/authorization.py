"""Who may call what: the `authorization:` rules (docs/governance.md).

Rules are evaluated in order and the first that matches decides; none matching, `default`
does. A rule matches a request when every target field it sets holds (`methods`, `backends`,
`names` globs on tool and prompt names as the client sees them, `uris` globs on resource
URIs) and the caller holds everything `when` asks for (scopes, claim values).

What rules decide: the calls that use a name (`tools/call`, `prompts/get`, `resources/read`,
`completion/complete` by its ref). Lists, `server/discover` and `subscriptions/listen` are
never refused by a rule: what they show is filtered instead (a tool is listed when calling it
is allowed), so a rule about `tools/list` reads as one about the tools it lists.

The settings are compiled once into an immutable `RuleSet`: globs become one regular
expression per rule (fnmatch.translate), methods and backends frozensets. Which rules can
apply to a (method, name, backend) does not depend on the caller, so that part is memoized
per target (bounded) as the target's `Plan`: the decision itself when it is the same for
every caller (no rule targets it, or the first that does has no `when`), else the few rules
whose `when` a request then checks against its principal.

Where it runs: the `Authorization` head policy decides from `Mcp-Method` / `Mcp-Name` before
the body is read, wherever the request's headers say enough (a modern POST to an MCP path; the
body phase then holds the headers to the body, SHTTP §Server Validation, so a request cannot
name one tool in its headers and call another). The dispatcher decides again from the parsed
call, which covers every request the headers cannot: initialize-era clients, the HTTP+SSE
transport, completion refs, URIs whose backend only the route table knows.

A refusal is HTTP 403 with `WWW-Authenticate: Bearer error="insufficient_scope"` (RFC 6750
§3.1; with `scope=` when an allowing rule needs scopes the caller lacks) and a JSON-RPC error
whose data names the rule.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from gateway import asgi
from gateway.observability.record import note_authorization
from gateway.policies.head import HeadPolicy
from gateway.protocol import headers as h
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.methods import LIST_METHODS, METHODS
from gateway.protocol.principal import Principal, principal_of
from gateway.protocol.versions import is_modern

if TYPE_CHECKING:
    from gateway.settings import AuthorizationRule, AuthorizationSettings, GatewaySettings

# The methods a rule decides, and what each is about.
NAMED_METHODS = frozenset({"tools/call", "prompts/get", "completion/complete"})
URI_METHODS = frozenset({"resources/read", "completion/complete"})
DECIDED_METHODS = frozenset({"tools/call", "prompts/get", "resources/read", "completion/complete"})
# A list item is visible when the method that uses it is allowed; a rule naming the list
# method matches its items too.
USE_OF_LIST = {"tools/list": "tools/call", "prompts/list": "prompts/get",
               "resources/list": "resources/read", "resources/templates/list": "resources/read"}
LIST_OF_USE: dict[str, tuple[str, ...]] = {
    "tools/call": ("tools/list",), "prompts/get": ("prompts/list",),
    "resources/read": ("resources/list", "resources/templates/list"),
}
# Mcp-Method values the head phase decides.
_DECIDED_HEADERS = frozenset({"tools/call", "prompts/get", "resources/read"})
_NAMED_OR_LISTED = NAMED_METHODS | {"tools/list", "prompts/list"}
_URI_OR_LISTED = URI_METHODS | {"resources/list", "resources/templates/list"}
# Targets whose candidate rules are remembered; past it the memo starts over (names come from
# clients: a bound, not a leak).
_MEMO_ENTRIES = 4096
_UNSEEN: Any = object()


def compile_globs(globs: Iterable[str]) -> re.Pattern[str]:
    """One anchored expression for a list of shell globs (`*`, `?`, `[...]`), compiled once."""
    return re.compile("|".join(f"(?:{fnmatch.translate(g)})" for g in globs), re.DOTALL)


def glob_literal_prefix(glob: str) -> str:
    """The part of `glob` before its first wildcard: every name it matches starts with it."""
    cut = min((i for i in (glob.find("*"), glob.find("?"), glob.find("[")) if i >= 0), default=len(glob))
    return glob[:cut]


def claim_holds(value: Any, wanted: frozenset[str]) -> bool:
    """A claim holds when it equals one of the wanted values, or is a list holding one."""
    if isinstance(value, str):
        return value in wanted
    if isinstance(value, list):
        return any(isinstance(v, str) and v in wanted for v in value)
    if isinstance(value, (bool, int, float)):
        return orjson.dumps(value).decode() in wanted
    return False


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    # The rule that decided ("default" when none matched).
    rule: str
    # Scopes an allowing rule needs that the caller lacks (for the challenge's `scope=`).
    missing_scopes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Rule:
    label: str
    allow: bool
    methods: frozenset[str] | None
    backends: frozenset[str] | None
    names: re.Pattern[str] | None
    uris: re.Pattern[str] | None
    scopes: frozenset[str]
    claims: tuple[tuple[str, frozenset[str]], ...]
    # Made once: what this rule decides, and whether it holds for every caller.
    decision: Decision
    unconditional: bool

    def targets(self, method: str, name: str | None, uri: str | None, backend: str | None) -> bool:
        """Whether the request's target (not its caller) is one this rule is about."""
        if self.methods is not None and method not in self.methods:
            return False
        if self.backends is not None and backend not in self.backends:
            return False
        if self.names is None and self.uris is None:
            return True
        if name is not None and self.names is not None and self.names.match(name):
            return True
        return uri is not None and self.uris is not None and self.uris.match(uri) is not None

    def holds(self, principal: Principal) -> bool:
        if self.scopes and not self.scopes <= principal.scopes:
            return False
        claims = principal.claims
        return all(claim_holds(claims.get(claim), wanted) for claim, wanted in self.claims)

    def holds_but_scopes(self, principal: Principal) -> bool:
        claims = principal.claims
        return all(claim_holds(claims.get(claim), wanted) for claim, wanted in self.claims)


def _compile_rule(index: int, rule: AuthorizationRule) -> Rule:
    methods = set(rule.methods) if rule.methods is not None else None
    if methods is not None:
        # A rule about a list is about the items it lists: it matches their use.
        methods |= {USE_OF_LIST[m] for m in methods if m in USE_OF_LIST}
    label = rule.id or f"rules.{index}"
    return Rule(
        label=label,
        allow=rule.effect == "allow",
        decision=Decision(rule.effect == "allow", label),
        unconditional=not rule.when.scopes and not rule.when.claims,
        methods=frozenset(methods) if methods is not None else None,
        backends=frozenset(rule.backends) if rule.backends is not None else None,
        names=compile_globs(rule.names) if rule.names is not None else None,
        uris=compile_globs(rule.uris) if rule.uris is not None else None,
        scopes=frozenset(rule.when.scopes),
        claims=tuple((claim, frozenset((v,) if isinstance(v, str) else v)) for claim, v in rule.when.claims.items()),
    )


# What decides the requests for one target, whoever sends them (`RuleSet.plan`).
Plan = Decision | tuple[Rule, ...]


class RuleSet:
    """The compiled `authorization` section. Immutable but for its per-target memo."""

    def __init__(self, rules: tuple[Rule, ...], *, default_allow: bool, fingerprint: str,
                 metadata_url: str | None = None) -> None:
        self.rules = rules
        # Named in the challenge of a refusal when the gateway is an OAuth resource server.
        self.metadata_url = metadata_url
        self.default = Decision(default_allow, "default")
        # Changes whenever the rules do: part of every cache key of a filtered answer.
        self.fingerprint = fingerprint
        self._memo: dict[tuple[str, str | None, str | None, str | None], Plan] = {}

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> RuleSet | None:
        """None when the section is the default (allow everything, no rules): nothing to run."""
        return cls.of(settings.authorization, settings)

    @classmethod
    def of(cls, section: AuthorizationSettings, settings: GatewaySettings) -> RuleSet | None:
        """The rules of one `authorization` section: the global one, or a view's."""
        if not section.rules and section.default == "allow":
            return None
        rules = tuple(_compile_rule(i, r) for i, r in enumerate(section.rules))
        fingerprint = hashlib.sha256(orjson.dumps(section.model_dump(mode="json"),
                                                  option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
        from gateway.policies.jwt_config import metadata_url

        return cls(rules, default_allow=section.default == "allow", fingerprint=fingerprint,
                   metadata_url=metadata_url(settings.auth) if settings.auth.mode == "jwt" else None)

    def candidates(self, method: str, name: str | None, uri: str | None, backend: str | None) -> tuple[Rule, ...]:
        """The rules about this target, in order (whoever the caller)."""
        return tuple(r for r in self.rules if r.targets(method, name, uri, backend))

    def plan(self, method: str, name: str | None, uri: str | None, backend: str | None) -> Plan:
        """What decides this target: the `Decision` when it does not depend on the caller (no
        rule is about the target: the default; the first one about it has no `when`: that
        rule), else the candidate rules for `verdict` to check. Memoized (bounded: names come
        from clients); the rules never change while the process runs."""
        key = (method, name, uri, backend)
        found = self._memo.get(key)
        if found is None:
            candidates = self.candidates(method, name, uri, backend)
            if not candidates:
                found = self.default
            elif candidates[0].unconditional:
                found = candidates[0].decision
            else:
                found = candidates
            if len(self._memo) >= _MEMO_ENTRIES:
                self._memo.clear()
            self._memo[key] = found
        return found

    def verdict(self, plan: Plan, principal: Principal) -> Decision:
        """What a target's plan (`plan`) decides for this caller."""
        if isinstance(plan, Decision):  # the same for every caller: decided when planned
            return plan
        candidates = plan
        for rule in candidates:
            if rule.unconditional or rule.holds(principal):
                return rule.decision
        if self.default.allowed:
            return self.default
        # Denied by default: would a scope have helped? The first allowing rule the caller
        # misses only by scopes says which (spec: authorization §Scope Challenge Handling).
        for rule in candidates:
            if rule.allow and rule.scopes and rule.holds_but_scopes(principal):
                return Decision(False, "default", tuple(sorted(rule.scopes - principal.scopes)))
        return self.default

    def decide(self, principal: Principal, method: str, *, name: str | None = None, uri: str | None = None,
               backend: str | None = None) -> Decision:
        return self.verdict(self.plan(method, name, uri, backend), principal)

    def allows(self, principal: Principal, method: str, *, name: str | None = None, uri: str | None = None,
               backend: str | None = None) -> bool:
        return self.decide(principal, method, name=name, uri=uri, backend=backend).allowed

    def refusal(self, decision: Decision, method: str, target: str | None) -> rpc.McpError:
        what = f"{method} {target!r}" if target is not None else method
        params = ['error="insufficient_scope"']
        if decision.missing_scopes:
            params.append(f'scope="{" ".join(decision.missing_scopes)}"')
        if self.metadata_url:
            params.append(f'resource_metadata="{self.metadata_url}"')
        reason = ("no rule allows it (authorization.default: deny)" if decision.rule == "default"
                  else f"authorization rule {decision.rule} denies it")
        data: dict[str, Any] = {"rule": decision.rule, "method": method}
        if target is not None:
            data["name"] = target
        if decision.missing_scopes:
            data["scopes"] = list(decision.missing_scopes)
        return rpc.McpError(rpc.INVALID_REQUEST, f"Forbidden: {what}: {reason}", status=403, data=data,
                            headers={"WWW-Authenticate": "Bearer " + ", ".join(params)})


def call_target(method: str, params: Mapping[str, Any], name: str | None) -> tuple[str | None, str | None]:
    """(name, uri) a request is about: its `Mcp-Name` value, or a completion's ref."""
    if method == "resources/read":
        return None, name
    if method == "completion/complete":
        ref = params.get("ref")
        if isinstance(ref, dict):
            if ref.get("type") == "ref/prompt" and isinstance(ref.get("name"), str):
                return ref["name"], None
            if ref.get("type") == "ref/resource" and isinstance(ref.get("uri"), str):
                return None, ref["uri"]
        return None, None
    return name, None


class PrefixResolver:
    """Which backend a client-visible name belongs to, from the configured prefixes alone (what
    the head phase knows before any route table lookup): the longest matching prefix."""

    def __init__(self, settings: GatewaySettings) -> None:
        self._prefixes = sorted(((settings.prefix_of(b), b.name) for b in settings.backends),
                                key=lambda pb: len(pb[0]), reverse=True)
        self._uri_prefixes = sorted(((p, b.name) for b in settings.backends for p in b.resource_prefixes),
                                    key=lambda pb: len(pb[0]), reverse=True)

    def name(self, name: str) -> str | None:
        for prefix, backend in self._prefixes:
            if name.startswith(prefix) and len(name) > len(prefix):
                return backend
        return None

    def uri(self, uri: str) -> str | None:
        for prefix, backend in self._uri_prefixes:
            if uri.startswith(prefix):
                return backend
        return None


class Authorization(HeadPolicy):
    """The header-phase decision: refuses a modern request whose `Mcp-Method` / `Mcp-Name`
    the rules deny, before its body is read. Whatever it cannot decide from headers passes on
    to the dispatcher, which decides from the body."""

    def __init__(self, app: asgi.ASGIApp, *, rules: RuleSet, resolver: PrefixResolver, mcp_paths: Iterable[str],
                 uri_backends_matter: bool | None = None) -> None:
        super().__init__(app)
        self.rules = rules
        self.resolver = resolver
        paths = {p.rstrip("/") or "/" for p in mcp_paths}
        self.mcp_paths = frozenset(paths | {p + "/" for p in paths})
        # A URI's owner may be known only to the route table (the URIs backends list): where a
        # rule about URIs names backends, the head phase leaves URIs it cannot place to the
        # dispatcher rather than guess.
        self.uri_backends_matter = any(r.uris is not None and r.backends is not None for r in rules.rules) \
            if uri_backends_matter is None else uri_backends_matter
        self._targets: dict[tuple[str | None, str | None, str | None], tuple[str, str, Plan] | None] = {}

    def admit(self, scope: asgi.Scope) -> rpc.McpError | None:
        if scope["method"] != "POST" or scope["path"] not in self.mcp_paths:
            return None
        # The header values the body phase holds the body to (`asgi.request_headers`: trimmed,
        # repeated field lines combined; `parse_call`, spec: SHTTP Server Validation), so what
        # is decided here is what the body must then name. Decoded once per request already.
        headers = asgi.request_headers(scope)
        key = (headers.get(h.METHOD), headers.get(h.NAME), headers.get(h.PROTOCOL_VERSION))
        found = self._targets.get(key, _UNSEEN)
        if found is _UNSEEN:
            found = self._target(*key)
            if len(self._targets) >= _MEMO_ENTRIES:
                self._targets.clear()
            self._targets[key] = found
        if found is None:
            return None
        method, target, plan = found
        # A plan that is a Decision was decided for every caller: the principal is not read.
        decision = plan if isinstance(plan, Decision) else self.rules.verdict(plan, principal_of(scope))
        if decision.allowed:
            return None  # the dispatcher decides again from the body, and notes it
        note_authorization(False, decision.rule)
        return self.rules.refusal(decision, method, target)

    def _target(self, method: str | None, name: str | None, version: str | None) -> tuple[str, str, Plan] | None:
        """(method, name or URI, the rules' plan for it) the headers say the request is about;
        None when they do not suffice (the dispatcher decides). Caller-independent: memoized
        per header triple in `admit` (bounded: the values come from clients)."""
        if method not in _DECIDED_HEADERS or name is None or version is None:
            return None  # completion refs are in the body; lists are filtered, not refused
        if not is_modern(version):
            return None
        try:
            target = h.decode_value(name)
        except h.HeaderValueError:
            return None  # the body phase answers a malformed header with its own 400
        if method == "resources/read":
            backend = self.resolver.uri(target)
            if backend is None and self.uri_backends_matter:
                return None
            return method, target, self.rules.plan(method, None, target, backend)
        return method, target, self.rules.plan(method, target, None, self.resolver.name(target))


# -- check-config --------------------------------------------------------------------------


def check_authorization(settings: GatewaySettings) -> None:
    """Refuse rules that name unknown backends or methods, or that can never match."""
    problems = rule_problems(settings)
    if problems:
        raise ValueError("; ".join(problems))


def rule_problems(settings: GatewaySettings, rules: tuple[AuthorizationRule, ...] | None = None,
                  at: str = "authorization.rules", within: Iterable[str] | None = None) -> list[str]:
    """What makes the rules of a section (the global one by default; a view's with `at` and the
    view's backends as `within`) name unknown things or never match."""
    problems: list[str] = []
    backends = {b.name: settings.prefix_of(b) for b in settings.backends}
    if within is not None:
        backends = {name: prefix for name, prefix in backends.items() if name in set(within)}
    kept_claims = set(settings.auth.claims)
    for i, rule in enumerate(settings.authorization.rules if rules is None else rules):
        where = f"{at}.{i}" + (f" ({rule.id})" if rule.id else "")
        problems += [f"{where}: {p}" for p in target_problems(rule.methods, rule.backends, rule.names, rule.uris,
                                                              backends, named_methods=_NAMED_OR_LISTED,
                                                              uri_methods=_URI_OR_LISTED,
                                                              allowed_methods=DECIDED_METHODS | LIST_METHODS,
                                                              unknown="no backend is named" if within is None
                                                              else "the view shows no backend named")]
        if rule.when.scopes and settings.auth.mode != "jwt":
            problems.append(f"{where}: when.scopes can never hold: callers have scopes only with auth.mode: jwt")
        for claim in rule.when.claims:
            if settings.auth.mode != "jwt":
                problems.append(f"{where}: when.claims can never hold: callers have claims only with auth.mode: jwt")
                break
            if claim not in kept_claims:
                problems.append(f"{where}: when.claims.{claim} can never hold: add {claim!r} to auth.claims "
                                f"so the principal keeps it")
    return problems


def target_problems(methods: tuple[str, ...] | None, rule_backends: tuple[str, ...] | None,
                    names: tuple[str, ...] | None, uris: tuple[str, ...] | None, backends: Mapping[str, str], *,
                    named_methods: frozenset[str], uri_methods: frozenset[str],
                    allowed_methods: frozenset[str], unknown: str = "no backend is named") -> list[str]:
    """What makes a rule's (or a limit's) target fields unsatisfiable; shared with rate_limits."""
    problems: list[str] = []
    if methods is not None:
        if not methods:
            problems.append("methods is empty: the rule can never match")
        for method in methods:
            if method not in METHODS:
                problems.append(f"methods: {method!r} is not an MCP method the gateway serves")
            elif method not in allowed_methods:
                problems.append(f"methods: {method!r} is never decided by a rule (its answer is filtered, "
                                f"it is not refused)")
    if rule_backends is not None:
        if not rule_backends:
            problems.append("backends is empty: the rule can never match")
        for backend in rule_backends:
            if backend not in backends:
                problems.append(f"backends: {unknown} {backend!r}")
    if methods is not None and names is not None and not set(methods) & named_methods:
        problems.append(f"names can never match: none of methods {list(methods)} is about a tool or prompt name")
    if methods is not None and uris is not None and not set(methods) & uri_methods:
        problems.append(f"uris can never match: none of methods {list(methods)} is about a resource URI")
    if names is not None and not names:
        problems.append("names is empty: the rule can never match")
    if uris is not None and not uris:
        problems.append("uris is empty: the rule can never match")
    if names and rule_backends and uris is None:
        known = [backends[b] for b in rule_backends if b in backends]
        if known and not any(_prefix_compatible(glob_literal_prefix(g), p) for g in names for p in known):
            problems.append(f"names {list(names)} can never match a name of backends {list(rule_backends)} "
                            f"(their names start with {sorted(set(known))})")
    return problems


def _prefix_compatible(literal: str, prefix: str) -> bool:
    return literal.startswith(prefix) or prefix.startswith(literal)

