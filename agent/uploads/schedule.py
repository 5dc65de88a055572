"""Upload scheduling rules, sans I/O: per-item backoff, queue-wide holds, outcomes.

A failing item backs off on its own (30 s doubling to a 30 min cap, jittered) and
never delays the others; only the server saying "slow down" (429, 503, Retry-After)
holds the whole queue. Other 4xx answers are permanent: retrying cannot fix them.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

OK, TRANSIENT, PERMANENT, SLOW_DOWN = "ok", "transient", "permanent", "slow-down"

# What goes first when the queue is full: lowest priority first.
KINDS = {"screenshot": 0, "log": 1, "proof-of-play": 2}
MAX_RETRY_AFTER_S = 6 * 3600.0


@dataclass(frozen=True)
class UploadPolicy:
    base_s: float = 30.0
    cap_s: float = 1800.0
    jitter: float = 0.2          # +-20 %: items that failed together spread out
    max_items: int = 10_000
    max_bytes: int = 256 * 1024 * 1024
    max_age_days: float = 14.0
    dedupe_window_s: float = 3600.0
    batch_max: int = 200         # proof-of-play records per request


@dataclass(frozen=True)
class Outcome:
    kind: str
    detail: str = ""
    retry_after_s: float | None = None


def classify(status: int | None, retry_after: str | None = None, error: str = "") -> Outcome:
    """An HTTP answer (or a network error, status None) as an Outcome."""
    if status is None:
        return Outcome(TRANSIENT, error or "network error")
    if 200 <= status < 300:
        return Outcome(OK)
    if status in (429, 503):
        return Outcome(SLOW_DOWN, f"HTTP {status}", parse_retry_after(retry_after))
    if status == 408:
        return Outcome(TRANSIENT, "HTTP 408")
    if 400 <= status < 500:
        return Outcome(PERMANENT, f"HTTP {status}")
    return Outcome(TRANSIENT, f"HTTP {status}")


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds form), clamped; None if absent/bad."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except (ValueError, AttributeError):
        return None
    if seconds != seconds or seconds < 0:
        return None
    return min(seconds, MAX_RETRY_AFTER_S)


class UploadScheduler:
    def __init__(self, policy: UploadPolicy, rng: random.Random | None = None):
        self.policy = policy
        self.hold_until = 0.0
        self._rng = rng or random.Random()

    def retry_delay(self, attempts: int) -> float:
        """Delay after the ``attempts``-th failure of one item (attempts >= 1)."""
        p = self.policy
        ceiling = min(p.cap_s, p.base_s * (2 ** min(max(attempts - 1, 0), 40)))
        return ceiling * (1 + self._rng.uniform(-p.jitter, p.jitter))

    def after_failure(self, outcome: Outcome, attempts: int, now: float) -> float:
        """When this item may go again; a slow-down also holds the whole queue."""
        due = now + self.retry_delay(attempts)
        if outcome.kind == SLOW_DOWN:
            hold = outcome.retry_after_s if outcome.retry_after_s is not None else self.retry_delay(attempts)
            self.hold_until = max(self.hold_until, now + hold)
            due = max(due, self.hold_until)
        return due

    def may_send(self, now: float) -> bool:
        return now >= self.hold_until

    def next_wakeup(self, earliest_due: float | None) -> float | None:
        if earliest_due is None:
            return None
        return max(earliest_due, self.hold_until)
