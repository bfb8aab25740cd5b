"""The hub's lifecycle is declared on `dispatch.Hub`, and `SubscriptionHub` provides all of it:
`Runtime` calls these methods without probing for them."""

from __future__ import annotations

import inspect

from gateway.dispatch import Hub
from gateway.subscriptions import SubscriptionHub


def test_the_subscription_hub_implements_every_method_of_the_hub_protocol():
    declared = [name for name, _ in inspect.getmembers(Hub, inspect.iscoroutinefunction) if not name.startswith("_")]
    assert set(declared) == {"listen", "start", "begin_shutdown", "aclose"}
    for name in declared:
        implementation = getattr(SubscriptionHub, name)
        assert inspect.iscoroutinefunction(implementation), name
        assert list(inspect.signature(implementation).parameters) == list(inspect.signature(getattr(Hub, name)).parameters)
