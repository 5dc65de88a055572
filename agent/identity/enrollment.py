"""Enrollment rules, sans I/O: get a pairing code, show it until it is used or expires,
poll for the token with jittered backoff, never hammer the server.

Every answer the agent does not expect goes through the one backoff (base/backoff.py):
an error, a code request the server does not serve (404/405/410: no code was ever
made, so nothing is "gone"), and a code the server forgets again and again. Only a
poll that proved the code alive (pending) resets it, so whatever a server answers,
the requests are bounded by the backoff's cap.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from ..base.backoff import Backoff, BackoffPolicy

NEED_CODE, WAITING, PAIRED = "need-code", "waiting-for-pairing", "paired"


@dataclass(frozen=True)
class RequestCode:
    pass


@dataclass(frozen=True)
class PollPairing:
    pass


@dataclass(frozen=True)
class EnrollmentPolicy:
    poll_interval_s: float = 5.0
    poll_jitter: float = 0.2
    errors: BackoffPolicy = BackoffPolicy(base_s=2.0, cap_s=120.0, jitter="full")


@dataclass
class PairingCode:
    code: str
    display: str
    expires_at: float     # monotonic
    poll_secret: str


def not_enrolling(status: int) -> str:
    """What a 404/405/410 to the code request means, in the words status and doctor say."""
    return (f"the server answered {status} to edge-agent's enrollment (POST /api/v1/enroll): "
            f"is it a ScreenTinker server? set [server] profile (\"auto\" finds out)")


class EnrollmentCore:
    def __init__(self, policy: EnrollmentPolicy = EnrollmentPolicy(), rng: random.Random | None = None):
        self.policy = policy
        self.state = NEED_CODE
        self.code: PairingCode | None = None
        self.token: str | None = None
        self.last_error: str | None = None
        self._rng = rng or random.Random()
        self._errors = Backoff(policy.errors, self._rng)
        self._next_at = 0.0
        self._in_flight = False

    @property
    def attempts(self) -> int:
        """Answers in a row that were not what the agent expects."""
        return self._errors.attempts

    def start(self, now: float, saved: PairingCode | None = None) -> None:
        """Begins, reusing a code from before a restart while it is still valid."""
        if saved is not None and saved.expires_at > now:
            self.code, self.state = saved, WAITING
        self._next_at = now

    def poll(self, now: float) -> list:
        if self._in_flight or self.state == PAIRED:
            return []
        if self.state == WAITING and self.code is not None and now >= self.code.expires_at:
            # an expired code is useless on screen: ask for a new one now
            self.code, self.state = None, NEED_CODE
            self._next_at = min(self._next_at, now)
        if now < self._next_at:
            return []
        self._in_flight = True
        return [RequestCode()] if self.state == NEED_CODE else [PollPairing()]

    def next_wakeup(self) -> float:
        if self.state == PAIRED or self._in_flight:
            return math.inf
        t = self._next_at
        if self.code is not None:
            t = min(t, self.code.expires_at)
        return t

    # -- answers ------------------------------------------------------------------
    def on_code(self, now: float, code: PairingCode) -> None:
        # not a reset of the backoff: a server may hand out codes it forgets at once;
        # the first pending poll proves the code (on_pending)
        self._in_flight = False
        self.code, self.state, self.last_error = code, WAITING, None
        self._next_at = now + self._poll_delay()

    def on_pending(self, now: float) -> None:
        self._in_flight = False
        self._errors.reset()
        self.last_error = None
        self._next_at = now + self._poll_delay()

    def on_paired(self, token: str) -> None:
        self._in_flight = False
        self._errors.reset()
        self.token, self.state, self.code = token, PAIRED, None

    def on_code_gone(self, now: float) -> None:
        """The server no longer knows the code (expired, or used by someone else): a new
        one, on the backoff (within its base after a code that was polled pending)."""
        self._in_flight = False
        self.code, self.state = None, NEED_CODE
        delay = self._errors.next_delay()
        self._next_at = now + delay
        return delay

    def on_not_enrolling(self, now: float, status: int) -> float:
        """The code request itself was answered ``status`` (404, 405, 410): this server
        does not enroll this way. No code was made; backs off like any error."""
        return self.on_error(now, not_enrolling(status))

    def on_error(self, now: float, why: str) -> float:
        self._in_flight = False
        self.last_error = why
        delay = self._errors.next_delay()
        self._next_at = now + delay
        return delay

    def revoke(self, now: float, hold_s: float = 0.0) -> None:
        """The token was refused: back to a fresh code, after ``hold_s``."""
        self.token, self.code, self.state = None, None, NEED_CODE
        self._in_flight = False
        self._next_at = now + hold_s

    def _poll_delay(self) -> float:
        j = self.policy.poll_jitter
        return self.policy.poll_interval_s * (1 + self._rng.uniform(-j, j))
