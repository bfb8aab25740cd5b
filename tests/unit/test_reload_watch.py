"""`serve --watch` (gateway/reload/watch.py) on real files: a change reloads once, the same
bytes rewritten reload nothing, and a ConfigMap-style symlink swap is seen."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from gateway.reload.watch import ConfigWatcher


async def watching(path: Path) -> tuple[ConfigWatcher, list[int]]:
    seen: list[int] = []
    watcher = ConfigWatcher(path, lambda: seen.append(1), interval_seconds=0.05, settle_seconds=0.02)
    watcher.start()
    await asyncio.sleep(0.1)  # its baseline read
    return watcher, seen


async def until(predicate, timeout: float = 3.0) -> None:
    async def loop() -> None:
        while not predicate():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(loop(), timeout)


async def test_a_changed_file_reloads_once_and_the_same_bytes_do_not(tmp_path):
    path = tmp_path / "gateway.yaml"
    path.write_text("backends: []\n")
    watcher, seen = await watching(path)
    try:
        path.write_text("backends: [1]\n")
        await until(lambda: seen == [1])
        path.write_text("backends: [1]\n")  # rewritten, same content: the stamp moves, the hash does not
        os.utime(path)
        await asyncio.sleep(0.3)
        assert seen == [1]
    finally:
        await watcher.aclose()


async def test_a_configmap_symlink_swap_is_seen(tmp_path):
    # Kubernetes: gateway.yaml -> ..data/gateway.yaml, ..data -> ..2026_v1; an update writes
    # ..2026_v2 and renames a new ..data link over the old one.
    for version, text in (("v1", "a: 1\n"), ("v2", "a: 2\n")):
        (tmp_path / f"..{version}").mkdir()
        (tmp_path / f"..{version}" / "gateway.yaml").write_text(text)
    os.symlink("..v1", tmp_path / "..data")
    os.symlink("..data/gateway.yaml", tmp_path / "gateway.yaml")
    watcher, seen = await watching(tmp_path / "gateway.yaml")
    try:
        os.symlink("..v2", tmp_path / "..data_tmp")
        os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
        await until(lambda: seen == [1])
    finally:
        await watcher.aclose()


async def test_a_file_that_disappears_for_a_moment_is_not_a_change(tmp_path):
    path = tmp_path / "gateway.yaml"
    path.write_text("a: 1\n")
    watcher, seen = await watching(path)
    try:
        path.unlink()
        await asyncio.sleep(0.2)
        path.write_text("a: 1\n")
        await asyncio.sleep(0.3)
        assert seen == []
    finally:
        await watcher.aclose()
