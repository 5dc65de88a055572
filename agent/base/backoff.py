"""Backoff: exponential, capped, jittered, never gives up. The one rule for every
schedule of retries the agent keeps: the link's reconnects, enrollment's polls, a
credentials write the card refused, an upload item's retries, a supervised loop's
restarts.

Jitter is what keeps a site whose devices all lost the server at the same instant
from reconnecting in lock-step and tripping the server's flap limiter.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

JITTER_MODES = ("full", "equal", "none")


@dataclass(frozen=True)
class BackoffPolicy:
    """How a retry's delay grows: from base_s, doubling up to cap_s, with the jitter named."""
    base_s: float = 1.0
    cap_s: float = 60.0
    jitter: str = "full"


def ceiling(base_s: float, cap_s: float, failures: int) -> float:
    """The delay after ``failures`` failures in a row, before any jitter: ``base_s``
    doubling per failure up to ``cap_s``. The exponent is capped too: 2**n overflows a
    float long before "never give up" ends."""
    return min(cap_s, base_s * (2 ** min(max(failures, 0), 62)))


class Backoff:
    """Counts consecutive failures; its owner says what resets it (a stable link, see
    LinkCore; a write that landed)."""

    def __init__(self, policy: BackoffPolicy, rng: random.Random | None = None):
        self.policy = policy
        self.attempts = 0
        self._rng = rng or random.Random()

    def ceiling(self, attempts: int | None = None) -> float:
        n = self.attempts if attempts is None else attempts
        return ceiling(self.policy.base_s, self.policy.cap_s, n)

    def next_delay(self, spread_s: float = 0.0) -> float:
        """Delay before the next attempt; counts one more failure. ``spread_s`` is a
        span the delay is drawn from evenly while it is wider than the schedule's own
        (the server's reconnect window: a node's whole population must not arrive at
        its neighbour in the same second, whatever the jitter mode)."""
        ceiling = self.ceiling()
        self.attempts += 1
        if spread_s > ceiling:
            return self.moment(spread_s)
        mode = self.policy.jitter
        if mode == "none":
            return ceiling
        if mode == "equal":
            return ceiling / 2 + self._rng.uniform(0, ceiling / 2)
        return self._rng.uniform(0, ceiling)

    def moment(self, span_s: float) -> float:
        """An even random moment within ``span_s`` (a server's window): a population
        told the same thing at once spreads over it. Counts no failure."""
        return self._rng.uniform(0, max(0.0, span_s))

    def reset(self) -> None:
        self.attempts = 0
