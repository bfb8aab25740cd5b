"""What one backend shows: `backends[].tools / prompts / resources` (docs/governance.md).

`include` (globs; unset: everything) and `exclude` (globs) pick the items a backend offers,
`rename` gives a tool or prompt another name, `descriptions` another description. All of it
reads the backend's own names and is applied before the backend's prefix: a client sees
`<prefix><renamed>` and never the hidden items. A hidden name, and the original name of a
renamed one, resolve to nothing, so calling one is the client's error for an unknown tool,
prompt or resource (-32602), exactly as if the backend did not have it. Resources are curated
by URI (templates by their uriTemplate); they are not renamed.

Compiled once per backend from the frozen settings: the globs into one expression each.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.policies.authorization import compile_globs

if TYPE_CHECKING:
    from gateway.settings import BackendSettings, CurationSettings


@dataclass(frozen=True, slots=True)
class Selection:
    include: re.Pattern[str] | None
    exclude: re.Pattern[str] | None
    rename: dict[str, str] = field(default_factory=dict)
    descriptions: dict[str, str] = field(default_factory=dict)
    # shown name → the backend's own name, for the renamed ones.
    upstream_of: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, settings: CurationSettings | None) -> Selection | None:
        if settings is None:
            return None
        return cls(
            include=compile_globs(settings.include) if settings.include is not None else None,
            exclude=compile_globs(settings.exclude) if settings.exclude else None,
            rename=dict(settings.rename),
            descriptions=dict(settings.descriptions),
            upstream_of={shown: own for own, shown in settings.rename.items()},
        )

    def shows(self, own: str) -> bool:
        if self.include is not None and not self.include.match(own):
            return False
        return self.exclude is None or not self.exclude.match(own)

    def upstream(self, shown: str) -> str | None:
        """The backend's own name for a name a client sent, or None when that name is hidden."""
        own = self.upstream_of.get(shown)
        if own is None:
            if shown in self.rename:
                return None  # renamed away: only the new name exists
            own = shown
        return own if self.shows(own) else None

    def present(self, items: list[Any], key: str) -> list[Any]:
        """The items a client may see, renamed and redescribed (copies; never the cached ones)."""
        out = []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get(key), str):
                continue
            own = item[key]
            if not self.shows(own):
                continue
            shown = self.rename.get(own)
            description = self.descriptions.get(own)
            if shown is not None or description is not None:
                item = dict(item)
                if shown is not None:
                    item[key] = shown
                if description is not None:
                    item["description"] = description
            out.append(item)
        return out


@dataclass(frozen=True, slots=True)
class Curation:
    tools: Selection | None = None
    prompts: Selection | None = None
    resources: Selection | None = None

    @classmethod
    def of(cls, backend: BackendSettings) -> Curation | None:
        if backend.tools is None and backend.prompts is None and backend.resources is None:
            return None
        return cls(Selection.of(backend.tools), Selection.of(backend.prompts), Selection.of(backend.resources))

    def selection(self, kind: str) -> Selection | None:
        return self.tools if kind == "tools" else self.prompts if kind == "prompts" else self.resources

    def shows_uri(self, uri: str) -> bool:
        return self.resources is None or self.resources.shows(uri)
