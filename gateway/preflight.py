"""Build what `serve` builds at start-up, without starting it, and say what fails where.

Validation (settings.py) checks each value; some mistakes only show when the parts are built
from them (a Redis URL scheme the client does not speak, a backend kind the gateway cannot
make). `check-config` runs this so that a configuration it accepts never crashes `serve`, and
`serve` runs it when building fails, to print the same field-named problems instead of a
traceback. Whatever a component's constructor refuses is covered, with no list to keep.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from gateway.settings import GatewaySettings

log = logging.getLogger("gateway.preflight")


def _message(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


async def _release(thing: Any) -> None:
    closer = getattr(thing, "aclose", None)
    if closer is not None:
        with contextlib.suppress(Exception):
            await closer()


async def find_problems(settings: GatewaySettings) -> list[tuple[str, str]]:
    """`startup_problems`, inside a running event loop (serve's)."""
    from gateway.app import build_app
    from gateway.backends import create_backend
    from gateway.cache.factory import build_cache
    from gateway.routing.table import RouteTable
    from gateway.backends.replica import ReplicaContext
    from gateway.subscriptions import build_hub

    problems: list[tuple[str, str]] = []
    built: list[Any] = []

    def attempt(where: str, make: Callable[[], Any]) -> Any:
        try:
            thing = make()
        except Exception as exc:  # noqa: BLE001 - any refusal is a problem to print, not a crash
            problems.append((where, _message(exc)))
            return None
        built.append(thing)
        return thing

    # The parts in the order Runtime builds them, each named by the section it comes from.
    replica = ReplicaContext.from_settings(settings)
    for i, backend in enumerate(settings.backends):
        attempt(f"backends.{i}", lambda b=backend: create_backend(b, replica))
    cache = attempt("cache", lambda: build_cache(settings.cache, settings.redis))
    if cache is not None:
        own_bus = settings.subscriptions.redis is not None or settings.subscriptions.redis_url is not None
        hub_field = "subscriptions.redis" if own_bus else ("redis" if settings.bus_redis() is not None else "subscriptions")
        attempt(hub_field, lambda: build_hub(settings, RouteTable([]), cache))
    if not problems:
        # Then the whole application exactly as serve builds it (pipeline, policies, fronts).
        app = attempt("<start-up>", lambda: build_app(settings))
        if app is not None:
            built.append(app.runtime)
    for thing in reversed(built):
        await _release(thing)
    return problems


def startup_problems(settings: GatewaySettings) -> list[tuple[str, str]]:
    """(field path, message) for every part of the gateway that cannot be built from
    `settings`; [] when serve would start."""
    return asyncio.run(find_problems(settings))
