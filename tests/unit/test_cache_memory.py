"""The in-process store (gateway/cache/memory.py): LRU bounds, keep time, tags."""

from __future__ import annotations

from gateway.cache.entry import Entry
from gateway.cache.keys import backend_tag, list_tag
from gateway.cache.memory import MemoryStore
from tests.support.clock import ManualClock


def entry(n: int = 0) -> Entry:
    return Entry({"result": {"n": n}}, 0, 60_000, "public")


async def test_least_recently_used_entry_leaves_first():
    store = MemoryStore(max_entries=2, max_bytes=10_000)
    await store.put("a", entry(), b"x", [], 60_000)
    await store.put("b", entry(), b"x", [], 60_000)
    assert (await store.get(["a"]))[0] is not None  # "a" is now the most recently used
    await store.put("c", entry(), b"x", [], 60_000)
    assert [e is not None for e in await store.get(["a", "b", "c"])] == [True, False, True]


async def test_byte_bound_evicts_until_it_fits_and_oversize_entries_are_not_kept():
    store = MemoryStore(max_entries=100, max_bytes=10)
    await store.put("a", entry(), b"12345", [], 60_000)
    await store.put("b", entry(), b"12345", [], 60_000)
    await store.put("c", entry(), b"123", [], 60_000)
    assert [e is not None for e in await store.get(["a", "b", "c"])] == [False, True, True]
    assert store.bytes == 8
    await store.put("huge", entry(), b"x" * 11, [], 60_000)
    assert (await store.get(["huge"]))[0] is None and store.bytes == 8


async def test_entries_leave_after_their_keep_time():
    clock = ManualClock()
    store = MemoryStore(max_entries=10, max_bytes=10_000, clock=clock)
    await store.put("a", entry(), b"x", [], 500)
    clock.now += 499
    assert (await store.get(["a"]))[0] is not None
    clock.now += 1
    assert (await store.get(["a"]))[0] is None
    assert len(store) == 0 and store.bytes == 0


async def test_dropping_a_tag_removes_exactly_its_entries():
    store = MemoryStore(max_entries=10, max_bytes=10_000)
    await store.put("t1", entry(), b"x", [backend_tag("alpha"), list_tag("alpha", "tools/list")], 60_000)
    await store.put("p1", entry(), b"x", [backend_tag("alpha"), list_tag("alpha", "prompts/list")], 60_000)
    await store.put("t2", entry(), b"x", [backend_tag("beta"), list_tag("beta", "tools/list")], 60_000)
    assert await store.drop([list_tag("alpha", "tools/list")]) == 1
    assert [e is not None for e in await store.get(["t1", "p1", "t2"])] == [False, True, True]
    assert await store.flush("alpha") == 1
    assert [e is not None for e in await store.get(["p1", "t2"])] == [False, True]
    assert await store.flush() == 1 and len(store) == 0


async def test_replacing_a_key_keeps_accounting_straight():
    store = MemoryStore(max_entries=10, max_bytes=10_000)
    await store.put("a", entry(1), b"xxxx", ["tag"], 60_000)
    await store.put("a", entry(2), b"xx", ["tag"], 60_000)
    assert store.bytes == 2 and len(store) == 1
    assert (await store.get(["a"]))[0].body == {"result": {"n": 2}}
    assert await store.drop(["tag"]) == 1 and store.bytes == 0


async def test_a_put_marked_before_a_drop_of_its_tags_is_refused():
    store = MemoryStore(max_entries=10, max_bytes=10_000)
    tags = [backend_tag("a"), list_tag("a", "tools/list")]
    since = await store.mark(tags)
    await store.drop([list_tag("a", "tools/list")])
    assert not await store.put("k", entry(), b"x", tags, 60_000, since)
    assert (await store.get(["k"]))[0] is None
    # Another tag's drop does not matter; a clear() of everything does.
    since = await store.mark(tags)
    await store.drop([list_tag("a", "prompts/list")])
    assert await store.put("k", entry(), b"x", tags, 60_000, since)
    since = await store.mark(tags)
    store.clear()
    assert not await store.put("k", entry(), b"x", tags, 60_000, since)


async def test_generation_counts_stay_bounded_and_still_refuse_racing_puts(monkeypatch):
    from gateway.cache import memory

    monkeypatch.setattr(memory, "_MAX_GENERATIONS", 3)
    store = MemoryStore(max_entries=10, max_bytes=10_000)
    since = await store.mark(["t0"])
    for i in range(10):
        await store.drop([f"t{i}"])
    assert len(store._generations) <= 3
    assert not await store.put("k", entry(), b"x", ["t0"], 60_000, since)
