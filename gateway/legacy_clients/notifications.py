"""A legacy session's notifications: one modern `subscriptions/listen` through the hub.

Legacy clients learn about list changes and updated resources on their GET stream, after
`resources/subscribe` for the latter (L-RES). The gateway holds one listen per session whose
filter is what the session was promised (the `listChanged` flags it advertised, the URIs the
client subscribed to) and appends what arrives to the session's GET stream, without the
modern subscription id. A change of subscriptions re-listens with the new filter.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gateway.dispatch import Dispatcher
from gateway.legacy_clients import translate
from gateway.legacy_clients.sessions import LegacySession, Message
from gateway.protocol import jsonrpc as rpc
from gateway.protocol import meta

log = logging.getLogger("gateway.legacy_clients")

_LISTEN_BACKOFF_SECONDS = (0.5, 1.0, 2.0, 5.0, 15.0, 30.0)


class SessionNotifications:
    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher

    def ensure_listener(self, session: LegacySession, *, restart: bool = False) -> None:
        if self.dispatcher.hub is None or session.closed:
            return
        running = session.listener is not None and not session.listener.done()
        if running and not restart:
            return
        if running:
            assert session.listener is not None
            session.listener.cancel()
        session.listener = asyncio.create_task(self._listen(session), name=f"legacy-listen-{session.id[:8]}")

    async def _listen(self, session: LegacySession) -> None:
        """Hold one modern `subscriptions/listen` for the session and append what arrives to
        its GET stream, re-establishing it after failures (with backoff)."""
        caps = session.server_capabilities
        wanted: dict[str, Any] = {}
        for kind, flag in (
            ("tools", "toolsListChanged"),
            ("prompts", "promptsListChanged"),
            ("resources", "resourcesListChanged"),
        ):
            if caps.get(kind, {}).get("listChanged"):
                wanted[flag] = True
        if session.subscriptions:
            wanted["resourceSubscriptions"] = sorted(session.subscriptions)
        failures = 0
        while not session.closed:
            call = translate.modern_call(
                {"method": "subscriptions/listen", "params": {"notifications": wanted}},
                request_id=session.next_id("l"),
                client_capabilities=session.client_capabilities,
                client_info=session.client_info,
                log_level=None,
            )
            call.principal = session.principal
            try:
                reply = await self.dispatcher.dispatch(call)
                if reply.stream is None:
                    raise rpc.McpError(
                        rpc.INTERNAL_ERROR,
                        f"subscriptions/listen answered without a stream: "
                        f"{(reply.message or {}).get('error')}",
                    )
                try:
                    async for message in reply.stream:
                        if "method" not in message:
                            break  # the graceful end of the listen: re-listen
                        if message["method"] == "notifications/subscriptions/acknowledged":
                            if falls_short(wanted, message.get("params")):
                                # The hub left out what a backend did not acknowledge in time
                                # (a backend that was down, a listen changing hands between
                                # replicas after one died): that part would stay silent for the
                                # life of this listen, so it is made again, with backoff.
                                log.info("legacy session notifications: the listen was acknowledged only in part; "
                                         "listening again")
                                break
                            failures = 0
                            continue
                        session.notification_stream().append(without_subscription_id(message))
                finally:
                    await reply.aclose()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the hub or a backend failed: keep the session, retry later
                log.warning("legacy session notifications: listen failed: %s", getattr(exc, "message", exc))
            delay = _LISTEN_BACKOFF_SECONDS[min(failures, len(_LISTEN_BACKOFF_SECONDS) - 1)]
            failures += 1
            await asyncio.sleep(delay)


def falls_short(wanted: dict[str, Any], ack_params: Any) -> bool:
    """Does a listen's acknowledgement grant less than the session asked for?"""
    granted = ack_params.get("notifications") if isinstance(ack_params, dict) else None
    if not isinstance(granted, dict):
        return True
    for name, value in wanted.items():
        if name == "resourceSubscriptions":
            got = granted.get(name)
            if not isinstance(got, list) or not set(value) <= set(got):
                return True
        elif value and granted.get(name) is not True:
            return True
    return False


def without_subscription_id(message: Message) -> Message:
    """Legacy notifications have no subscription ids (the hub tags modern listeners)."""
    params = message.get("params")
    if not isinstance(params, dict) or not isinstance(params.get("_meta"), dict):
        return message
    rest = {k: v for k, v in params["_meta"].items() if k != meta.SUBSCRIPTION_ID}
    params = {k: v for k, v in params.items() if k != "_meta"}
    if rest:
        params["_meta"] = rest
    return {**message, "params": params}
