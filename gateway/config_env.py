"""The `MCP_GATEWAY_*` environment, checked before it is applied.

pydantic-settings ignores a variable that names no setting (`MCP_GATEWAY_CAHCE__STORE`), and
it cannot address one entry of a list: `MCP_GATEWAY_BACKENDS__0__TIMEOUT_SECONDS` would
replace the whole `backends` list of the file with a mapping that does not validate. Here:

- every `MCP_GATEWAY_*` variable must name a setting, or loading fails naming the variable;
- `MCP_GATEWAY_BACKENDS__<index>__<key>` sets one key of one backend of the file (the index
  must exist there); the rest of the environment goes to pydantic-settings as before;
- an entry of any other list (`MCP_GATEWAY_RATE_LIMITS__0__RATE`) is refused naming the
  variable that sets the list whole, as JSON (`MCP_GATEWAY_RATE_LIMITS`).
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

PREFIX = "MCP_GATEWAY_"
# Read by the CLI, not a setting.
NOT_SETTINGS = frozenset({"MCP_GATEWAY_CONFIG"})
BACKEND_KEY = "BACKENDS__"


def _unwrap(annotation: Any) -> Any:
    """The model class, or mapping/sequence origin, behind Optional/Annotated wrappers."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
            annotation = models[0] if models else args[0]
        else:
            return annotation


def _is_structured(annotation: Any) -> bool:
    target = _unwrap(annotation)
    origin = typing.get_origin(target)
    return origin in (tuple, list, dict) or target in (tuple, list, dict) or (
        isinstance(target, type) and issubclass(target, BaseModel))


def _model_choices(annotation: Any) -> list[type[BaseModel]]:
    """The models of a union of several (a discriminated union such as `backends[].auth`)."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return []
    found = []
    for arg in typing.get_args(annotation):
        if arg is type(None):
            continue
        found += _model_choices(arg) or ([arg] if isinstance(arg, type) and issubclass(arg, BaseModel) else [])
    return found if len(found) > 1 else []


def _unknown_part(model: type[BaseModel], parts: list[str]) -> str | None:
    """The first of `parts` that names nothing under `model`, else None."""
    annotation: Any = model
    for i, part in enumerate(parts):
        choices = _model_choices(annotation)
        if choices:
            # A key of any of the union's models will do; validation picks the one.
            unknown = [_unknown_part(choice, parts[i:]) for choice in choices]
            return None if None in unknown else unknown[0]
        target = _unwrap(annotation)
        if isinstance(target, type) and issubclass(target, BaseModel):
            field = target.model_fields.get(part)
            if field is None:
                return part
            annotation = field.annotation
            continue
        origin = typing.get_origin(target)
        if origin is dict or target is dict:
            return None  # free-form keys (headers, env, method_scopes)
        if origin in (tuple, list):
            return part if not part.isdigit() else _unknown_part_in(typing.get_args(target)[0], parts[i + 1:])
        return part  # a scalar has no keys under it
    return None


def _indexed_lists(model: type[BaseModel], parts: list[str]) -> list[str]:
    """The dotted paths of the lists that `parts` index into (`rate_limits` for
    `rate_limits__0__rate`), outermost first."""
    found: list[str] = []
    annotation: Any = model
    for i, part in enumerate(parts):
        choices = _model_choices(annotation)
        if choices:
            deeper = [_indexed_lists(choice, parts[i:]) for choice in choices]
            return found + [".".join(parts[:i] + [p]) for p in next((d for d in deeper if d), [])]
        target = _unwrap(annotation)
        if isinstance(target, type) and issubclass(target, BaseModel):
            field = target.model_fields.get(part)
            if field is None:
                return found
            annotation = field.annotation
            continue
        origin = typing.get_origin(target)
        if origin not in (tuple, list) or not part.isdigit():
            return found
        found.append(".".join(parts[:i]))
        annotation = typing.get_args(target)[0]
    return found


def _unknown_part_in(annotation: Any, parts: list[str]) -> str | None:
    target = _unwrap(annotation)
    if isinstance(target, type) and issubclass(target, BaseModel):
        return _unknown_part(target, parts)
    return parts[0] if parts else None


def _annotation_at(model: type[BaseModel], keys: list[str]) -> Any:
    """The annotation of the setting at `keys` below `model` (None when not a model field:
    a free-form key of a mapping). A key of several union models: the first that has it."""
    annotation: Any = model
    for key in keys:
        choices = _model_choices(annotation) or [_unwrap(annotation)]
        fields = [c.model_fields[key] for c in choices
                  if isinstance(c, type) and issubclass(c, BaseModel) and key in c.model_fields]
        if not fields:
            return None
        annotation = fields[0].annotation
    return annotation


def check(environ: Mapping[str, str], settings_model: type[BaseModel]) -> list[tuple[str, str]]:
    """(variable, problem) for every `MCP_GATEWAY_*` variable that names no setting."""
    problems = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(PREFIX) or upper in NOT_SETTINGS:
            continue
        parts = upper[len(PREFIX):].lower().split("__")
        if not all(parts):
            problems.append((name, "is not a setting: sections and keys are joined by exactly two underscores"))
            continue
        if parts[0] == "backends" and len(parts) > 1 and not parts[1].isdigit():
            problems.append((name, f"is not a setting: {_backend_form()}"))
            continue
        unknown = _unknown_part(settings_model, parts)
        if unknown is not None:
            where = " under " + ".".join(parts[:parts.index(unknown)]) if parts.index(unknown) else ""
            problems.append((name, f"is not a setting: no {unknown!r}{where} (a misspelt section or key?)"))
            continue
        # Only a backend of the file takes one key by index (apply_backend_overrides); any
        # other list entry would replace the whole list with a mapping that does not validate.
        lists = _indexed_lists(settings_model, parts)
        whole = next((path for path in lists if path != "backends"), None)
        if whole is not None:
            variable = PREFIX + whole.upper().replace(".", "__")
            problems.append((name, f"is not a setting: {whole} is a list; set it whole, as JSON in {variable}"))
    return problems


def _backend_form() -> str:
    return (f"set one key of one backend as {PREFIX}BACKENDS__<index>__<KEY> (e.g. "
            f"{PREFIX}BACKENDS__0__TIMEOUT_SECONDS=5), or the whole list as JSON in {PREFIX}BACKENDS")


def backend_overrides(environ: Mapping[str, str]) -> dict[str, tuple[int, list[str], str]]:
    """{variable: (index, key path, raw value)} for every `MCP_GATEWAY_BACKENDS__<i>__...`."""
    found = {}
    for name, value in environ.items():
        upper = name.upper()
        if not upper.startswith(PREFIX + BACKEND_KEY):
            continue
        index, _, rest = upper[len(PREFIX + BACKEND_KEY):].partition("__")
        if index.isdigit() and rest:
            found[name] = (int(index), rest.lower().split("__"), value)
    return found


def apply_backend_overrides(data: dict[str, Any], environ: Mapping[str, str],
                            backend_model: type[BaseModel]) -> list[tuple[str, str]]:
    """Set each `MCP_GATEWAY_BACKENDS__<i>__<key>` on backend i of `data` (the file's
    mapping, changed in place); (variable, problem) for those that cannot apply."""
    problems = []
    backends = data.get("backends")
    for name, (index, keys, raw) in sorted(backend_overrides(environ).items()):
        if not isinstance(backends, list) or index >= len(backends):
            have = f"backends 0-{len(backends) - 1}" if isinstance(backends, list) and backends else "no backends"
            problems.append((name, f"the config file has no backends.{index} ({have}): per-key variables "
                                   f"change a backend the file declares; a new list goes in {PREFIX}BACKENDS "
                                   "as JSON"))
            continue
        entry = backends[index]
        if not isinstance(entry, dict):
            continue  # the file's own error (backends.i is not a mapping) is reported by validation
        annotation = _annotation_at(backend_model, keys)
        value: Any = raw
        if annotation is not None and _is_structured(annotation):
            try:
                value = json.loads(raw)
            except json.JSONDecodeError:
                problems.append((name, f"backends.{index}.{'.'.join(keys)} must be JSON here (a list or an object)"))
                continue
        target = entry
        for key in keys[:-1]:
            target = target.setdefault(key, {})
            if not isinstance(target, dict):
                break
        else:
            target[keys[-1]] = value
    return problems
