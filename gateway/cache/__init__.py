"""The response cache seam (docs/cache.md).

The dispatcher sends every cacheable backend call (`tools/list` pages, `resources/read`, …)
through `ResponseCache.fetch`, which either answers from the store or calls `load` and maybe
stores the answer. The outcome becomes the `X-Cache` response header. The answer carries the
`ttlMs` still left and the `cacheScope` the gateway applied. An aggregated list answer made
only of fresh entries is kept encoded (`keep_assembled`) and handed out again while those
entries hold (`assembled_again`, cache/assembled.py).

The subscription hub calls the `invalidate_*` methods; `build_cache` (factory.py) makes the
configured implementation (`StoreCache` over memory, or Redis with a local layer).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from gateway.backends.base import Message
    from gateway.cache.assembled import Source
    from gateway.protocol.request import Call
    from gateway.routing.table import Target

Outcome = Literal["hit", "miss", "stale", "bypass"]
Loader = Callable[[], Awaitable["Message"]]


class ResponseCache(Protocol):
    async def fetch(self, target: Target, call: Call, load: Loader, sources: list[Source] | None = None
                    ) -> tuple[Message, Outcome]:
        """The answer to `call` from `target`, and how it was obtained. A fresh hit appends
        where it came from to `sources`, for `keep_assembled`."""

    def assembled_again(self, call: Call, targets: Sequence[Target], revision: int, endpoint: Hashable = ""
                        ) -> tuple[Message, bytes] | None:
        """An aggregated list answer kept by `keep_assembled`, as (message, body), when every
        entry it was made from still holds (cache/assembled.py)."""

    def keep_assembled(self, call: Call, targets: Sequence[Target], revision: int, sources: Sequence[Source],
                       result: dict[str, Any], endpoint: Hashable = "") -> None: ...

    async def invalidate_lists(self, backend: str, methods: tuple[str, ...] | None = None) -> None: ...

    async def invalidate_resource(self, backend: str, uri: str) -> None: ...

    async def invalidate_backend(self, backend: str) -> None: ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


class NoCache:
    """Every call goes to the backend."""

    async def fetch(self, target: Target, call: Call, load: Loader, sources: list[Source] | None = None
                    ) -> tuple[Message, Outcome]:
        return await load(), "bypass"

    def assembled_again(self, call: Call, targets: Sequence[Target], revision: int, endpoint: Hashable = ""
                        ) -> tuple[Message, bytes] | None:
        return None

    def keep_assembled(self, call: Call, targets: Sequence[Target], revision: int, sources: Sequence[Source],
                       result: dict[str, Any], endpoint: Hashable = "") -> None:
        return None

    async def invalidate_lists(self, backend: str, methods: tuple[str, ...] | None = None) -> None:
        return None

    async def invalidate_resource(self, backend: str, uri: str) -> None:
        return None

    async def invalidate_backend(self, backend: str) -> None:
        return None

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None
