"""A fan-out's writes leave in bursts (gateway/write_batch.py `WriteBatch.burst`, used by
subscriptions/upstream.py `fan_out`): every stream must get exactly the bytes it gets when each
client is offered the notification on its own and writes at once, with its own id and JSON
type, in order, across more streams than one burst sends at a time, and with a second
notification in the same loop pass (held behind the burst's)."""

from __future__ import annotations

import asyncio

import httpx

from gateway import write_batch
from gateway.subscriptions.encoding import Outgoing
from tests.support.gateway import running_gateway
from tests.support.listen import RawListen, close_all

SUB = "io.modelcontextprotocol/subscriptionId"
STREAMS = 2 * write_batch.BURST_WRITES + 37  # three sends per burst, the last one short


def _events(data: bytes) -> list[bytes]:
    """The body's SSE events as the bytes on the wire (chunk framing included)."""
    return [e for e in bytes(data).split(b"\n\n") if b"data: " in e]


async def test_a_fan_out_in_bursts_writes_what_each_stream_would_have_got_on_its_own(mutable_backend):
    settings = {"backends": [{"name": "m", "url": mutable_backend.url}],
                "subscriptions": {"max_listens": STREAMS, "max_listens_per_principal": STREAMS}}
    streams = [RawListen(i if i % 2 == 0 else str(i), {"toolsListChanged": True}) for i in range(STREAMS)]
    async with running_gateway(settings) as gw, httpx.AsyncClient():
        tasks = [asyncio.create_task(s.run(gw.port)) for s in streams]
        try:
            await asyncio.wait_for(asyncio.gather(*(s.wait_events(1) for s in streams)), 30)
            (upstream,) = gw.runtime.hub.upstreams.values()
            assert len(upstream.sinks) == STREAMS
            first = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed",
                     "params": {"_meta": {"example.com/round": 1}}}
            second = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed",
                      "params": {"_meta": {"example.com/round": 2}}}

            # The fan-out: in bursts, and a second notification in the same pass.
            upstream.fan_out(first)
            upstream.fan_out(second)
            await asyncio.wait_for(asyncio.gather(*(s.wait_events(3) for s in streams)), 30)
            # The same two notifications offered to each client alone, outside any burst.
            for sink in tuple(upstream.sinks):
                sink.offer(upstream.id, Outgoing(first))
            await asyncio.sleep(0)
            for sink in tuple(upstream.sinks):
                sink.offer(upstream.id, Outgoing(second))
            await asyncio.wait_for(asyncio.gather(*(s.wait_events(5) for s in streams)), 30)

            for s in streams:
                _ack, *events = _events(s.data)
                assert len(events) == 4, (s.id, len(events))
                # Chunks may coalesce differently on the wire; the events' bytes may not differ.
                burst = [e.rsplit(b"\r\n", 1)[-1] for e in events[:2]]
                alone = [e.rsplit(b"\r\n", 1)[-1] for e in events[2:]]
                assert burst == alone, s.id
                notifications = s.messages()[1:]
                assert [n["params"]["_meta"]["example.com/round"] for n in notifications] == [1, 2, 1, 2]
                for n in notifications:
                    got = n["params"]["_meta"][SUB]
                    assert got == s.id and type(got) is type(s.id), (s.id, got)
        finally:
            await close_all(streams, tasks)
