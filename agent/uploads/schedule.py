"""Upload scheduling rules, sans I/O: per-item backoff, queue-wide holds, outcomes.

A failing item backs off on its own (30 s doubling to a 30 min cap, jittered) and
never delays the others. What is about the server or the agent, not the item, holds
the whole queue instead, and writes nothing to the items (so an outage costs the SD
card nothing and the items no attempts): the server saying "slow down" (429, 503,
Retry-After), the server out of reach (no answer, 502, 504), a route it does not have
yet (404, 405, 501), and credentials it refuses (401, 403: a state of the agent, which
re-authenticates). Only an item the server calls malformed (400, 413, 415, 422) is
dead-lettered, with the reason.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from ..base.backoff import ceiling
from ..config.policies import UploadPolicy

OK, TRANSIENT, PERMANENT = "ok", "transient", "permanent"
# queue-wide: the item is not at fault
SLOW_DOWN, UNREACHABLE, UNAVAILABLE, AUTH = "slow-down", "unreachable", "unavailable", "auth"
QUEUE_WIDE = (SLOW_DOWN, UNREACHABLE, UNAVAILABLE, AUTH)
MALFORMED = (400, 413, 415, 422)

MAX_RETRY_AFTER_S = 6 * 3600.0


@dataclass(frozen=True)
class Outcome:
    """How one upload's send ended, and when it may be tried again."""
    kind: str
    detail: str = ""
    retry_after_s: float | None = None


def classify(status: int | None, retry_after: str | None = None, error: str = "") -> Outcome:
    """An HTTP answer (or a network error, status None) as an Outcome."""
    if status is None:
        return Outcome(UNREACHABLE, error or "network error")
    if 200 <= status < 300:
        return Outcome(OK)
    if status in (429, 503):
        return Outcome(SLOW_DOWN, f"HTTP {status}", parse_retry_after(retry_after))
    if status in (502, 504):
        return Outcome(UNREACHABLE, f"HTTP {status}")
    # someone else answered for the server: the site, not the server, nor the item
    if 300 <= status < 400:   # never followed: a token must not travel to another host
        return Outcome(UNREACHABLE, f"HTTP {status}: a redirect answered for the server "
                                    f"(not followed)")
    if status == 511:   # a captive portal wants a login
        return Outcome(UNREACHABLE, "HTTP 511: a captive portal answered for the server")
    if status in (401, 403):
        return Outcome(AUTH, f"HTTP {status}")
    if status in (404, 405, 501):
        return Outcome(UNAVAILABLE, f"HTTP {status}")
    if status in MALFORMED:
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


def expired(stamp: float, stamp_synced: bool, now: float, now_synced: bool,
            synced_since: float | None, max_age_s: float) -> bool:
    """Whether an item stamped ``stamp`` is past ``max_age_s`` at wall time ``now``.

    Nothing is old by a clock that is not synchronised now. An item stamped while the
    clock was not synchronised (a Pi boots without an RTC, then NTP jumps its clock by
    months) is aged from ``synced_since``, when the clock was first seen synchronised
    after it was stamped (None: not yet), not from its stale stamp: a jump never ages
    the whole queue at once."""
    if not now_synced:
        return False
    if stamp_synced:
        return now - stamp > max_age_s
    return synced_since is not None and now - synced_since > max_age_s


class UploadScheduler:
    def __init__(self, policy: UploadPolicy, rng: random.Random | None = None):
        self.policy = policy
        self.hold_until = 0.0
        self.hold_reason: str | None = None   # a queue-wide outcome kind, while held
        self.hold_failures = 0                # queue-wide failures in a row
        self._rng = rng or random.Random()

    def retry_delay(self, attempts: int) -> float:
        """Delay after the ``attempts``-th failure of one item (attempts >= 1)."""
        p = self.policy
        return ceiling(p.base_s, p.cap_s, attempts - 1) * (1 + self._rng.uniform(-p.jitter, p.jitter))

    def after_failure(self, attempts: int, now: float) -> float:
        """When this item may go again (an item-specific failure)."""
        return now + self.retry_delay(attempts)

    def hold(self, outcome: Outcome, now: float) -> float:
        """A queue-wide outcome: nothing goes before the returned time."""
        self.hold_failures += 1
        delay = (outcome.retry_after_s if outcome.retry_after_s is not None
                 else self.retry_delay(self.hold_failures))
        self.hold_until = max(self.hold_until, now + delay)
        self.hold_reason = outcome.kind
        return self.hold_until

    def succeeded(self) -> None:
        self.hold_failures = 0
        self.hold_reason = None

    def link_up(self, now: float) -> bool:
        """The link (or fresh credentials) came back: a hold that was about reaching the
        server or being let in ends now; one the server asked for (slow-down) does not."""
        if self.hold_reason in (UNREACHABLE, AUTH) and self.hold_until > now:
            self.hold_until = now
            self.hold_failures = 0
            return True
        return False

    def may_send(self, now: float) -> bool:
        return now >= self.hold_until

    def next_wakeup(self, earliest_due: float | None) -> float | None:
        if earliest_due is None:
            return None
        return max(earliest_due, self.hold_until)
