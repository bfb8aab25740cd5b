"""What a new configuration changes, decided from the two validated settings alone (pure).

A backend is *kept* when its settings are equal field for field (BackendSettings is frozen
and compared by value): its Backend object, with its pools, sessions, processes and upstream
listens, carries over. Any other difference makes it *replaced* (a new Backend; the old one
drains). The route prefix is the fleet's (`GatewaySettings.prefix_of`: a lone backend has
none), so a kept backend can still be *renamed* when the fleet around it changes.

Only `backends` is applied live. Every other section is read once at start-up by parts that
live as long as the process (listeners, the pipeline, the cache store, the hub's bus): a
change there is reported as needing a restart, field by field, and the running value stays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from gateway.settings import GatewaySettings

# The one section applied live.
LIVE = frozenset({"backends"})


@dataclass(frozen=True, slots=True)
class ReloadPlan:
    kept: frozenset[str]
    replaced: frozenset[str]
    added: frozenset[str]
    removed: frozenset[str]
    renamed: frozenset[str]
    # Dotted field paths that changed outside `backends` (values never shown: secrets).
    needs_restart: tuple[str, ...]
    # What is swapped in: the new backends over the running values of everything else.
    settings: GatewaySettings

    @property
    def changes_fleet(self) -> bool:
        return bool(self.replaced or self.added or self.removed or self.renamed)

    def summary(self) -> str:
        parts = [f"{what} {', '.join(sorted(names))}" for what, names in (
            ("added", self.added), ("removed", self.removed), ("replaced", self.replaced),
            ("renamed", self.renamed)) if names]
        parts.append(f"{len(self.kept)} kept")
        return "; ".join(parts)


def plan(current: GatewaySettings, new: GatewaySettings) -> ReloadPlan:
    before = {b.name: b for b in current.backends}
    after = {b.name: b for b in new.backends}
    kept = frozenset(n for n, b in after.items() if before.get(n) == b)
    effective = current.model_copy(update={"backends": new.backends})
    renamed = frozenset(n for n in kept if current.prefix_of(before[n]) != effective.prefix_of(after[n]))
    return ReloadPlan(
        kept=kept,
        replaced=frozenset(n for n in after if n in before and n not in kept),
        added=frozenset(n for n in after if n not in before),
        removed=frozenset(n for n in before if n not in after),
        renamed=renamed,
        needs_restart=tuple(_changed_fields(current, new, skip=LIVE)),
        settings=effective,
    )


def _changed_fields(old: BaseModel, new: BaseModel, *, skip: frozenset[str] = frozenset(),
                    prefix: str = "") -> list[str]:
    changed: list[str] = []
    for name in type(old).model_fields:
        if name in skip:
            continue
        a: Any = getattr(old, name)
        b: Any = getattr(new, name)
        if a == b:
            continue
        if isinstance(a, BaseModel) and isinstance(b, BaseModel) and type(a) is type(b):
            changed += _changed_fields(a, b, prefix=f"{prefix}{name}.")
        else:
            changed.append(f"{prefix}{name}")
    return changed
