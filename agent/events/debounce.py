"""One event per settle window per kind and source, with the count of raw ones.

An HDMI cable wiggle or a flapping port produces dozens of raw changes in a second;
the server wants to hear once that it happened, how often, and how it ended.
"""
from __future__ import annotations

from .model import Event


class Debouncer:
    def __init__(self, settle_s: float = 2.0):
        self.settle_s = settle_s
        self._pending: dict[str, tuple[Event, float]] = {}  # key -> (event, last raw at)

    def feed(self, key: str, event: Event, now: float) -> None:
        held = self._pending.get(key)
        if held is None:
            self._pending[key] = (event, now)
            return
        first, _ = held
        # the latest state wins; the first timestamp says when the burst began
        event.count = first.count + 1
        event.ts = first.ts
        event.details = {**event.details, "first_type": first.details.get("first_type", first.type)}
        self._pending[key] = (event, now)

    def due(self, now: float) -> list[Event]:
        ready = [k for k, (_, last) in self._pending.items() if now - last >= self.settle_s]
        return [self._pending.pop(k)[0] for k in ready]

    def next_deadline(self) -> float | None:
        if not self._pending:
            return None
        return min(last for _, last in self._pending.values()) + self.settle_s
