"""Reconnect schedule: exponential, capped, jittered, never gives up.

Jitter is what keeps a site whose devices all lost the server at the same instant
from reconnecting in lock-step and tripping the server's flap limiter.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

JITTER_MODES = ("full", "equal", "none")


@dataclass(frozen=True)
class BackoffPolicy:
    base_s: float = 1.0
    cap_s: float = 60.0
    jitter: str = "full"


class Backoff:
    """Counts consecutive failed links; only a stable link resets it (see LinkCore)."""

    def __init__(self, policy: BackoffPolicy, rng: random.Random | None = None):
        self.policy = policy
        self.attempts = 0
        self._rng = rng or random.Random()

    def ceiling(self, attempts: int | None = None) -> float:
        n = self.attempts if attempts is None else attempts
        # Cap the exponent too: 2**n overflows a float long before "never give up" ends.
        return min(self.policy.cap_s, self.policy.base_s * (2 ** min(n, 62)))

    def next_delay(self) -> float:
        """Delay before the next attempt; counts one more failure."""
        ceiling = self.ceiling()
        self.attempts += 1
        mode = self.policy.jitter
        if mode == "none":
            return ceiling
        if mode == "equal":
            return ceiling / 2 + self._rng.uniform(0, ceiling / 2)
        return self._rng.uniform(0, ceiling)

    def reset(self) -> None:
        self.attempts = 0
