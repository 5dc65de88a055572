"""Clocks are injected so every timing rule can be driven by a fake clock in tests.

Monotonic time drives every timer; wall time appears only in reports to the server.
"""
from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...
    def wall(self) -> float: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, start: float = 1000.0, wall_offset: float = 1_700_000_000.0):
        self.now = start
        self._wall_offset = wall_offset

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now + self._wall_offset

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now
