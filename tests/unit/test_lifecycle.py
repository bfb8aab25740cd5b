"""gateway/lifecycle.py: what each signal does, in order (the whole process under SIGTERM and
SIGHUP is tests/integration/test_lifecycle.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from gateway.lifecycle import Lifecycle
from gateway.readiness import BackendStates


def lifecycle(delay: float) -> Lifecycle:
    return Lifecycle(BackendStates([], "none"), drain_delay_seconds=delay)


async def test_sigterm_turns_readiness_at_once_and_waits_the_drain_delay():
    life = lifecycle(0.3)
    assert life.states.ready
    life.request_stop(signal.SIGTERM)
    assert not life.states.ready and life.stop_requested.is_set()
    started = time.monotonic()
    await life.drain_delay()
    assert 0.25 < time.monotonic() - started < 1.0


async def test_sigint_skips_the_delay_and_a_second_signal_cuts_it_short():
    life = lifecycle(30)
    life.request_stop(signal.SIGINT)
    await asyncio.wait_for(life.drain_delay(), 1)
    life = lifecycle(30)
    life.request_stop(signal.SIGTERM)
    waiting = asyncio.ensure_future(life.drain_delay())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    life.request_stop(signal.SIGTERM)
    await asyncio.wait_for(waiting, 1)


async def test_a_third_signal_forces_and_sighup_only_calls_the_reload_hook():
    life = lifecycle(30)
    forced, reloads = [], []
    life.on_force = lambda: forced.append(True)
    life.on_reload = lambda: reloads.append(True)
    life.install()
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        await asyncio.sleep(0.05)
        assert reloads == [True] and not life.stop_requested.is_set() and life.states.ready
        for _ in range(3):
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(0.05)
        assert forced == [True]
    finally:
        life.uninstall()


async def test_sighup_runs_every_joined_reloader_even_when_one_fails(caplog):
    life = lifecycle(30)
    ran: list[str] = []

    def broken() -> None:
        raise RuntimeError("certificates unreadable")

    life.add_reloader("configuration", lambda: ran.append("configuration"))
    life.add_reloader("certificates", broken)
    life.add_reloader("other", lambda: ran.append("other"))
    life.install()
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        await asyncio.sleep(0.05)
    finally:
        life.uninstall()
    assert ran == ["configuration", "other"] and not life.stop_requested.is_set()
    assert "reloading certificates failed" in caplog.text
