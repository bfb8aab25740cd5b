"""A clock the test moves by hand: `clock.now += 1_500`, and every reader sees it."""

from __future__ import annotations


class ManualClock:
    def __init__(self, start: float = 1_000_000) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now
