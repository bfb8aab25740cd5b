"""The dispatcher's governance seams that need no network: a listen stream loses the
`resources/updated` notifications its caller may not read, and nothing else."""

from __future__ import annotations

from typing import Any

from gateway.dispatch import _VisibleNotifications


class Stream:
    cancel_safe_next = True

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = list(messages)
        self.closed = False

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if not self.messages:
            raise StopAsyncIteration
        return self.messages.pop(0)

    async def aclose(self) -> None:
        self.closed = True


def updated(uri: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": uri}}


async def test_updates_for_unreadable_uris_are_not_delivered():
    listed = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed", "params": {}}
    inner = Stream([updated("x://public/a"), updated("x://secret/b"), listed, updated("x://public/c"),
                    {"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {}}])
    visible = _VisibleNotifications(inner, lambda uri: isinstance(uri, str) and "secret" not in uri)
    seen = [m async for m in visible]
    assert seen == [updated("x://public/a"), listed, updated("x://public/c")]
    assert visible.cancel_safe_next
    await visible.aclose()
    assert inner.closed
