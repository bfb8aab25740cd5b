"""`backends[].instances: N`: N processes of one stdio command behind one backend name
(docs/resilience.md "stdio instances").

Each instance is a whole stdio backend of its era (stdio.py, legacy/stdio.py): its own
supervised process, its own pipe ids and, initialize-era, its own legacy session (one
initialize per process). This backend only decides which instance serves each call: the
endpoint picker of HTTP endpoints (endpoints.py: power of two choices on requests in flight)
over the instances whose process is running, each instance an endpoint of the backend's
remembered health (health.py, labelled `instance-<i>`).

- A process that dies is out of rotation at once (`EndpointHealth.lost`); what it had in
  flight is lost as with one process (STDIO §Unexpected Termination: a request it may have
  read is never sent again unless its method is an idempotent read, backends/retry.py). Its
  supervisor restarts it with the usual backoff, and a check through the fresh process puts
  it back as soon as it answers (unless active checks are off: then the half-open trial does).
- A call that could not be written to its instance (the process was not running, or its stdin
  was already closed: `errors.never_sent`) goes to another instance at once, whatever its
  method: no process read it.
- A listen (`subscriptions/listen`) goes through one instance. N copies of one server
  announce the same changes; listening through each would deliver every change N times, to
  be told apart from real repeats. When that instance dies its listen ends, and the hub
  listens again through another one and tells its listeners what may have been missed
  (docs/subscriptions.md).
- `max_concurrent_calls`, its queue and the retry budget stay the backend's: the dispatcher
  applies them above this class, whatever the number of processes.
- Parked MRTR calls (initialize-era) are the backend's too: the instances share one
  `Continuations`, so the client's retry may arrive through any instance and still reach the
  session (and process) that holds the backend's request.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Collection

from gateway.backends import health_checks
from gateway.backends.base import Backend, Message, Reply, aclose
from gateway.backends.endpoints import InFlightRelease, choose
from gateway.backends.errors import never_sent
from gateway.backends.health import EndpointHealth
from gateway.backends.stdio_process import StdioProcess
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.request import Call
from gateway.settings import BackendSettings

# (the settings of one instance, its index) -> that instance: a one-process stdio backend.
InstanceFactory = Callable[[BackendSettings, int], Backend]
_FAILURES = (rpc.BACKEND_UNAVAILABLE, rpc.BACKEND_TIMEOUT)


class StdioInstances(Backend):
    """N one-process stdio backends of one era behind one name."""

    def __init__(self, settings: BackendSettings, make: InstanceFactory) -> None:
        super().__init__(settings)
        one = settings.model_copy(update={"instances": 1})
        self.instances: tuple[Backend, ...] = tuple(make(one, i) for i in range(settings.instances))
        self.processes: tuple[StdioProcess, ...] = tuple(
            instance.process for instance in self.instances)  # type: ignore[attr-defined]
        parked = getattr(self.instances[0], "continuations", None)
        for index, (instance, process) in enumerate(zip(self.instances, self.processes)):
            process.watchers.append(functools.partial(self._process_changed, index))
            if parked is not None:
                instance.continuations = parked  # type: ignore[attr-defined]
        self._closing = False
        self._checks: set[asyncio.Task[bool]] = set()

    @property
    def pids(self) -> tuple[int | None, ...]:
        """Each instance's process id (None while it is not running)."""
        return tuple(process.pid for process in self.processes)

    async def start(self) -> None:
        await asyncio.gather(*(instance.start() for instance in self.instances))

    async def aclose(self) -> None:
        self._closing = True
        for task in self._checks:
            task.cancel()
        await asyncio.gather(*(instance.aclose() for instance in self.instances), return_exceptions=True)

    # -- choosing an instance -------------------------------------------------------------

    def _choose(self, unsent: Collection[EndpointHealth]) -> EndpointHealth | None:
        """An instance in rotation whose process runs, outside `unsent`; when none runs, one
        whose process is (re)starting (the write waits `connect_timeout_seconds` for it).

        While nothing is in flight, the first such instance: an idle backend's calls stay on
        one warm process. Sequential calls spread over processes sharing a CPU cost about
        0.5 ms each (bench/README.md "stdio instances"); as soon as calls overlap, power of
        two choices spreads them."""
        endpoints = self.health.endpoints
        stopped = [e for e, process in zip(endpoints, self.processes) if process.pid is None]
        avoid = (*unsent, *stopped)
        if all(e.in_flight == 0 for e in endpoints):
            for endpoint in endpoints:
                if endpoint.ejected_until == 0.0 and endpoint not in avoid:
                    return endpoint
        return choose(endpoints, avoid) or choose(endpoints, unsent)

    async def send(self, call: Call) -> Reply:
        if call.is_notification:
            return Reply(self.name, status=202)
        endpoints = self.health.endpoints
        counted = not call.stream_only  # a listen is not load: it does not weigh on the choice
        unsent: list[EndpointHealth] = []
        last: rpc.McpError | None = None
        while True:
            endpoint = self._choose(unsent)
            if endpoint is None:
                raise (last.with_id(call.id) if last is not None else self.health.unavailable(call.id))
            instance = self.instances[endpoints.index(endpoint)]
            if counted:
                endpoint.in_flight += 1
            try:
                reply = await instance.send(call)
            except rpc.McpError as exc:
                if counted:
                    endpoint.in_flight -= 1
                if exc.code in _FAILURES:
                    endpoint.failed(exc.message)
                if not never_sent(exc):
                    raise
                unsent.append(endpoint)
                last = exc
                continue
            except BaseException:
                if counted:
                    endpoint.in_flight -= 1
                raise
            if not counted:
                return reply
            return self._watched(reply, endpoint)

    def _watched(self, reply: Reply, endpoint: EndpointHealth) -> Reply:
        """`reply`, its outcome reported to the instance that gave it (the dispatcher's own
        report goes nowhere for a backend of several endpoints, health.py) and its in-flight
        count given back when it is done."""
        if reply.stream is None:
            endpoint.in_flight -= 1
            if reply.status >= 500:
                endpoint.failed(f"HTTP {reply.status}")
            else:
                endpoint.succeeded()
            return reply
        release = InFlightRelease(endpoint).release
        reply.stream = self._outcome(reply.stream, endpoint, release)
        reply.closers.append(release)
        return reply

    @staticmethod
    async def _outcome(stream: AsyncIterator[Message], endpoint: EndpointHealth,
                       release: Callable[[], None]) -> AsyncIterator[Message]:
        try:
            async for message in stream:
                if "method" not in message:
                    endpoint.succeeded()  # the final response (a JSON-RPC error is an answer too)
                yield message
        except rpc.McpError as exc:
            if exc.code in _FAILURES:
                endpoint.failed(exc.message)
            raise
        finally:
            release()
            await aclose(stream)

    # -- health -----------------------------------------------------------------------------

    async def check_endpoint(self, index: int) -> None:
        """An active check through that instance alone (its discover, or the canary)."""
        await self.instances[index].health_check()

    def _process_changed(self, index: int, running: bool, what: str) -> None:
        if self._closing:
            return
        if not running:
            self.health.endpoints[index].lost(f"instance {index}: {what}")
            return
        if self.processes[index].generation > 1 and self.settings.health.check_interval_seconds > 0:
            # A restart: check the fresh process now rather than at the next interval, so that
            # it is back in rotation as soon as it answers.
            task = asyncio.ensure_future(health_checks.check_endpoint(self, index))
            self._checks.add(task)
            task.add_done_callback(self._checks.discard)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} x{len(self.instances)}>"


def spread(settings: BackendSettings, make: InstanceFactory) -> Backend:
    """The backend for a stdio `settings`: one process, or `instances` of them."""
    if settings.instances == 1:
        return make(settings, 0)
    return StdioInstances(settings, make)
