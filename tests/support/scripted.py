"""The scripted fixture backend (tests/fixtures/servers/scripted_modern.py) as a subprocess,
with its control endpoints: what it was asked, what it saw cancelled, and the gate a test
opens to let a held tool call finish."""

from __future__ import annotations

from typing import Any

import httpx

from tests.support.procs import Proc, python_server


class Scripted:
    def __init__(self, name: str, *, page_size: int = 2, list_delay: float = 0.0) -> None:
        self.name = name
        self.proc: Proc = python_server("scripted_modern.py", "--name", name, "--page-size", str(page_size),
                                        "--list-delay", str(list_delay), name=f"scripted-{name}")

    def start(self) -> Scripted:
        self.proc.start()
        return self

    def stop(self) -> None:
        self.proc.stop()

    # `with Scripted(name) as server:` starts it and stops it however the block ends.
    def __enter__(self) -> Scripted:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill(self) -> None:
        self.proc.kill()

    @property
    def url(self) -> str:
        return self.proc.url

    @property
    def _control(self) -> str:
        return f"http://127.0.0.1:{self.proc.port}/control"

    async def state(self) -> dict[str, Any]:
        async with httpx.AsyncClient(trust_env=False) as client:
            response = await client.get(f"{self._control}/state")
            response.raise_for_status()
            return response.json()

    async def release(self, key: str) -> None:
        async with httpx.AsyncClient(trust_env=False) as client:
            (await client.post(f"{self._control}/release/{key}")).raise_for_status()

    async def set_templates(self, templates: list[str]) -> None:
        async with httpx.AsyncClient(trust_env=False) as client:
            (await client.post(f"{self._control}/templates", json=templates)).raise_for_status()

    async def calls(self, method: str | None = None) -> list[dict[str, Any]]:
        calls = (await self.state())["calls"]
        return [c for c in calls if method is None or c["method"] == method]
