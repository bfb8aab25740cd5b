"""`serve --watch`: reload when the configuration file changes.

The file is polled: `os.stat` of its path (inode, mtime, size) once per interval, and the
content hashed when that changes, so a touch or a rewrite with the same bytes reloads
nothing. Polling rather than inotify (watchfiles is installed with uvicorn[standard]) because
a Kubernetes ConfigMap volume changes a mounted file by swapping a symlink two levels up
(`..data`), which inotify on the file never reports, while `stat` follows the links and sees
the new inode; one `stat` a second is no cost worth optimizing away. A file seen mid-write
is read again once its stamp holds still for one settle period.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("gateway.reload")

Stamp = tuple[int, int, int, int] | None


class ConfigWatcher:
    def __init__(self, path: str | os.PathLike[str], on_change: Callable[[], object], *,
                 interval_seconds: float = 1.0, settle_seconds: float = 0.2) -> None:
        self.path = Path(path)
        self.on_change = on_change
        self.interval_seconds = interval_seconds
        self.settle_seconds = settle_seconds
        self._task: asyncio.Task[None] | None = None

    def _stamp(self) -> Stamp:
        try:
            st = os.stat(self.path)  # follows symlinks: a ConfigMap swap shows as a new inode
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)

    def _digest(self) -> str | None:
        try:
            return hashlib.sha256(self.path.read_bytes()).hexdigest()
        except OSError:
            return None

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="config-watch")

    async def run(self) -> None:
        stamp, digest = self._stamp(), self._digest()
        log.info("watching %s for changes (every %gs)", self.path, self.interval_seconds)
        while True:
            await asyncio.sleep(self.interval_seconds)
            now = self._stamp()
            if now == stamp:
                continue
            # Let a write in progress finish: the stamp must hold still for one settle period.
            while True:
                await asyncio.sleep(self.settle_seconds)
                settled = self._stamp()
                if settled == now:
                    break
                now = settled
            stamp = now
            content = self._digest()
            if content is None or content == digest:
                continue  # gone for now (mid-swap), or the same bytes: nothing to reload
            digest = content
            log.info("%s changed: reloading", self.path)
            self.on_change()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
