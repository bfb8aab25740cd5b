"""One legacy request run as modern calls through the Dispatcher, until it has an answer.

An `InputRequiredResult` is the modern server asking the client for input. A legacy client
expects that as server-to-client requests (elicitation, sampling, roots) on the request's
SSE stream, so each input request is sent there, the client's POSTed answers are awaited,
and the modern call is retried with `inputResponses` / `requestState` and a new id (MRTR,
digest §f): the mirror of what the legacy backends do for modern clients (digest §h.5).
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.dispatch import Dispatcher
from gateway.legacy_clients import translate
from gateway.legacy_clients.sessions import EventLog, LegacySession, Message
from gateway.protocol import jsonrpc as rpc

# An InputRequiredResult answered this many times in a row ends the call: a backend that
# keeps asking must not hold a client forever.
MAX_INPUT_ROUNDS = 16


class LegacyCallRunner:
    def __init__(self, dispatcher: Dispatcher, *, input_timeout_seconds: float) -> None:
        self.dispatcher = dispatcher
        self.input_timeout_seconds = input_timeout_seconds

    async def run(self, session: LegacySession, msg: Message, stream: EventLog | None) -> Message:
        """Run one legacy request as modern calls until it has a final answer."""
        param_headers: tuple[Any, ...] = ()
        params = msg.get("params")
        if msg["method"] == "tools/call" and isinstance(params, dict) and isinstance(params.get("name"), str):
            param_headers = await self.dispatcher.tool_param_headers(params["name"])
        extra: dict[str, Any] | None = None
        for _ in range(MAX_INPUT_ROUNDS):
            call = translate.modern_call(
                msg,
                request_id=session.next_id("r"),
                client_capabilities=session.client_capabilities,
                client_info=session.client_info,
                log_level=session.log_level,
                param_headers=param_headers,
                extra_params=extra,
            )
            call.principal = session.principal
            final = await self._dispatch(call, stream)
            result = final.get("result")
            if not (isinstance(result, dict) and result.get("resultType") == "input_required"):
                return translate.legacy_response(final, msg["id"])
            if stream is None:
                raise rpc.invalid_request(
                    "this request needs input from the client (elicitation, sampling or roots), which is "
                    "sent as server requests on an SSE stream: send Accept: application/json, "
                    "text/event-stream",
                    msg["id"],
                )
            extra = {}
            requests = result.get("inputRequests")
            if isinstance(requests, dict) and requests:
                extra["inputResponses"] = await self._ask_client(session, requests, stream)
            if "requestState" in result:
                extra["requestState"] = result["requestState"]
        raise rpc.McpError(
            rpc.INTERNAL_ERROR,
            f"Gave up after {MAX_INPUT_ROUNDS} rounds of input requests for {msg['method']}",
            request_id=msg["id"],
        )

    async def _dispatch(self, call: Any, stream: EventLog | None) -> Message:
        """One modern call: its final response; its notifications (progress, logs) go to the
        client's stream, in order, before the response."""
        reply = await self.dispatcher.dispatch(call)
        if reply.stream is None:
            assert reply.message is not None
            return reply.message
        try:
            async for message in reply.stream:
                if "method" not in message:
                    return message
                if stream is not None and "id" not in message:
                    stream.append(message)
        finally:
            await reply.aclose()
        raise rpc.backend_protocol_error(reply.backend, "stream ended without a response", call.id)

    async def _ask_client(
        self, session: LegacySession, requests: dict[str, Any], stream: EventLog
    ) -> dict[str, Any]:
        """Send each input request to the client on the request's stream and wait for all the
        answers (POSTed back as JSON-RPC responses)."""
        loop = asyncio.get_running_loop()
        asked: list[tuple[str, str, str, asyncio.Future[Message]]] = []
        try:
            for key, request in requests.items():
                if not isinstance(request, dict) or not isinstance(request.get("method"), str):
                    raise rpc.McpError(
                        rpc.INTERNAL_ERROR, f"The backend sent a malformed input request {key!r}"
                    )
                method = request["method"]
                params = translate.legacy_input_request(
                    method,
                    request.get("params"),
                    protocol_version=session.protocol_version,
                    client_capabilities=session.client_capabilities,
                )
                request_id = session.next_input_id()
                future: asyncio.Future[Message] = loop.create_future()
                session.pending[request_id] = future
                asked.append((key, method, request_id, future))
                stream.append({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
            try:
                answers = await asyncio.wait_for(
                    asyncio.gather(*(f for *_, f in asked)), self.input_timeout_seconds
                )
            except TimeoutError:
                for _, _, request_id, future in asked:
                    # wait_for cancelled the gather and with it each future still unanswered:
                    # `not done()` alone matched none, so the client was never told.
                    if future.cancelled() or not future.done():
                        stream.append(
                            rpc.notification(
                                "notifications/cancelled",
                                {"requestId": request_id, "reason": "no answer in time"},
                            )
                        )
                raise rpc.McpError(
                    rpc.INTERNAL_ERROR,
                    f"The client did not answer the gateway's "
                    f"{', '.join(m for _, m, _, _ in asked)} request(s) within "
                    f"{self.input_timeout_seconds:g}s",
                ) from None
        finally:
            for _, _, request_id, _ in asked:
                session.pending.pop(request_id, None)
        return {
            key: translate.input_response(method, answer)
            for (key, method, _, _), answer in zip(asked, answers)
        }
