"""Legacy client sessions: ids, principal binding, expiry, bounds, resumable event logs."""

from __future__ import annotations

import asyncio

import pytest

from gateway.legacy_clients.sessions import (
    MAX_SESSIONS_PER_PRINCIPAL,
    EventLog,
    SessionStore,
    parse_event_id,
    per_principal_share,
)
from tests.support.clock import ManualClock


async def test_ids_are_secure_visible_ascii_and_unique():
    store = SessionStore(idle_seconds=60, max_sessions=100)
    ids = {(await store.create("p", "2025-11-25", {}, None)).id for _ in range(50)}
    assert len(ids) == 50
    for session_id in ids:
        assert len(session_id) >= 40  # 32 random bytes, url-safe base64
        assert all(0x21 <= ord(c) <= 0x7E for c in session_id)


async def test_a_session_is_found_only_by_its_principal():
    store = SessionStore(idle_seconds=60, max_sessions=10)
    session = await store.create("issuer|alice", "2025-11-25", {}, None)
    assert store.get(session.id, "issuer|alice") is session
    assert store.get(session.id, "issuer|mallory") is None
    assert store.get("guessed", "issuer|alice") is None


async def test_idle_sessions_expire_but_active_ones_do_not():
    clock = ManualClock(1000.0)
    store = SessionStore(idle_seconds=60, max_sessions=10, clock=clock)
    idle = await store.create("p", "2025-11-25", {}, None)
    busy = await store.create("p", "2025-11-25", {}, None)
    parked = asyncio.get_running_loop().create_future()
    busy.pending["gw-1"] = parked  # waiting for the client's answer counts as activity
    clock.now += 61
    assert store.get(idle.id, "p") is None
    assert store.get(busy.id, "p") is busy
    await store.sweep()
    assert len(store) == 1
    assert idle.closed


async def test_the_store_is_bounded_and_evicts_the_least_recently_used():
    clock = ManualClock(1000.0)
    store = SessionStore(idle_seconds=600, max_sessions=2, clock=clock)
    first = await store.create("p", "2025-11-25", {}, None)
    second = await store.create("p", "2025-11-25", {}, None)
    assert store.get(first.id, "p") is first  # first is now the most recently used
    third = await store.create("p", "2025-11-25", {}, None)
    assert len(store) == 2
    assert second.closed and store.get(second.id, "p") is None
    assert store.get(first.id, "p") is first and store.get(third.id, "p") is third


async def test_an_authenticated_principal_makes_room_from_its_own_sessions():
    store = SessionStore(idle_seconds=600, max_sessions=6)
    assert store.max_per_principal == 3
    bob = await store.create("iss|bob", "2025-11-25", {}, None, authenticated=True)
    alice = [await store.create("iss|alice", "2025-11-25", {}, None, authenticated=True) for _ in range(5)]
    assert store.get(bob.id, "iss|bob") is bob  # the least recently used of the store lives
    assert [s.closed for s in alice] == [True, True, False, False, False]
    assert len(store) == 4
    await store.end(alice[2])  # ending one frees its place in the share
    await store.create("iss|alice", "2025-11-25", {}, None, authenticated=True)
    assert not alice[3].closed and len(store) == 4
    # Unauthenticated callers are not counted: only the store's own LRU bound applies.
    anonymous = [await store.create("|anonymous", "2025-11-25", {}, None) for _ in range(6)]
    assert [s.closed for s in anonymous] == [False] * 6 and len(store) == 6


def test_a_principals_share_is_at_most_half_of_the_total():
    assert [per_principal_share(n) for n in (1, 2, 6, 201, 10_000)] == [1, 1, 3, 100, MAX_SESSIONS_PER_PRINCIPAL]


async def test_ending_a_session_cancels_its_work_and_ends_its_streams():
    store = SessionStore(idle_seconds=60, max_sessions=10)
    session = await store.create("p", "2025-11-25", {}, None)
    work = asyncio.create_task(asyncio.sleep(3600))
    session.in_flight[1] = work
    parked = asyncio.get_running_loop().create_future()
    session.pending["gw-1"] = parked
    stream = session.new_stream()
    await store.end(session)
    assert work.cancelled() and parked.cancelled() and stream.done
    assert store.get(session.id, "p") is None


async def test_event_log_replays_after_any_retained_event_and_follows_live():
    log = EventLog("s-1")
    log.prime(1000)
    log.append({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}})
    seen: list[int] = []

    async def read(after: int) -> None:
        async for seq, payload in log.follow(after):
            assert payload.startswith(f"id: s-1:{seq}\n".encode())
            seen.append(seq)

    reader = asyncio.create_task(read(1))
    await asyncio.sleep(0)
    log.append({"jsonrpc": "2.0", "id": 1, "result": {}})
    log.finish()
    await reader
    assert seen == [2, 3]


async def test_event_log_knows_what_it_can_resume():
    log = EventLog("s-1", capacity=3)
    for n in range(5):
        log.append({"n": n})
    assert log.can_resume_after(5) and log.can_resume_after(2)
    assert not log.can_resume_after(1)  # event 2 fell out of the buffer
    assert not log.can_resume_after(6)


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("s-3:12", ("s-3", 12)),
        ("g-1:0", ("g-1", 0)),
        ("nocolon", None),
        (":5", None),
        ("s-1:x", None),
        ("s-1:\xb2", None),  # "²".isdigit(), but int() refuses it
        ("s-1:" + "9" * 5000, None),  # int() refuses over 4,300 digits
        ("s-1:" + "9" * 19, None),
        ("s-1:" + "9" * 18, ("s-1", 10**18 - 1)),
        ("s-1:-1", None),
        ("s-1:", None),
    ],
)
def test_parse_event_id(value, parsed):
    assert parse_event_id(value) == parsed


async def test_adopted_fleet_sessions_are_bounded_and_forgotten_idle_without_a_share():
    """A replica's materializations of fleet sessions (fleet.py): the replica's LRU bound and
    idle expiry apply (what is forgotten is closed here), the per-principal share does not
    (the fleet counts it in Redis)."""
    from gateway.legacy_clients.sessions import LegacySession

    clock = ManualClock(1000.0)
    store = SessionStore(idle_seconds=60, max_sessions=3, max_per_principal=1, clock=clock)
    adopted = [LegacySession(f"id-{i}", "issuer|alice", "2025-11-25", {}, None) for i in range(4)]
    for session in adopted[:3]:
        store.adopt(session)
    assert [store.get(s.id, "issuer|alice") for s in adopted[:3]] == adopted[:3]  # no share of 1 applied
    store.adopt(adopted[3])  # the least recently used one makes room
    await asyncio.sleep(0)
    assert adopted[0].closed and store.peek("id-0") is None and len(store) == 3
    clock.now += 61
    fresh = LegacySession("id-9", "issuer|alice", "2025-11-25", {}, None)
    store.adopt(fresh)  # the idle ones are forgotten on the way
    await asyncio.sleep(0)
    assert len(store) == 1 and all(s.closed for s in adopted) and store.peek("id-9") is fresh
