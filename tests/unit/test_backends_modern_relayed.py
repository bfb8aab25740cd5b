"""The client headers a modern HTTP backend relays as they are (backends/modern.py `_relayed`):
remembered per set of header names, the same as testing every name, whichever way it is found,
and names sent by clients cannot grow the memo past its bound."""

from __future__ import annotations

import itertools

from gateway.backends import modern
from gateway.protocol import headers as h


def _by_every_name(names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(key for key in names if key.startswith(h.PARAM_PREFIX) or key in ("traceparent", "tracestate",
                                                                                   "baggage"))


def test_relayed_names_are_the_ones_a_test_of_every_name_finds(monkeypatch):
    monkeypatch.setattr(modern, "_relayed_by_names", {})
    pool = ["host", "content-type", "mcp-method", "mcp-param-region", "mcp-param-x", "traceparent", "tracestate",
            "baggage", "x-request-id", "mcp-paramless", "trace", "authorization"]
    sets = [tuple(combo) for size in (0, 1, 3, 5) for combo in itertools.permutations(pool, size)][:3000]
    for names in sets:
        assert modern._relayed(names) == _by_every_name(names)
        assert modern._relayed(names) == _by_every_name(names)  # the second time from the memo
    assert len(modern._relayed_by_names) == modern._MAX_NAME_SETS < len(sets)
