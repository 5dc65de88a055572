"""Enrollment rules, sans I/O: get a pairing code, show it until it is used or expires,
poll for the token with jittered backoff, never hammer the server.

One way in, h11's: ``EnrollmentCore.handle(event) -> [effect]``, time as an event
(``Tick``) and a ``deadline()`` (monotonic) by which the shell brings the next one. A
``Tick`` at or after it gives the request to make (``RequestCode``, ``PollPairing``),
one at a time; each answer is an event, and a backoff gives ``Retry`` (when, for the
shell's log line).

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
from typing import NamedTuple, Union

from ..base.backoff import Backoff, BackoffPolicy

NEED_CODE, WAITING, PAIRED = "need-code", "waiting-for-pairing", "paired"


@dataclass(frozen=True)
class RequestCode:
    """Ask the server for a pairing code (effect)."""
    pass


@dataclass(frozen=True)
class PollPairing:
    """Ask the server whether the code was paired (effect)."""
    pass


@dataclass(frozen=True)
class Retry:
    """An answer the agent did not expect: the next request in ``delay_s`` (backoff)."""
    delay_s: float


@dataclass(frozen=True)
class EnrollmentPolicy:
    """How often a pairing is polled, and the backoff of failed requests."""
    poll_interval_s: float = 5.0
    poll_jitter: float = 0.2
    errors: BackoffPolicy = BackoffPolicy(base_s=2.0, cap_s=120.0, jitter="full")


@dataclass
class PairingCode:
    """The code shown to the operator, and when it expires."""
    code: str
    display: str
    expires_at: float     # monotonic
    poll_secret: str


def not_enrolling(status: int) -> str:
    """What a 404/405/410 to the code request means, in the words status and doctor say."""
    return (f"the server answered {status} to edge-agent's enrollment (POST /api/v1/enroll): "
            f"is it a ScreenTinker server? set [server] profile (\"auto\" finds out)")


# -- events: each with the monotonic time it happened ---------------------------------

class Started(NamedTuple):
    """The enrollment begins, with a code from before a restart if one was saved (used
    while it is still valid)."""
    now: float
    saved: PairingCode | None = None


class Tick(NamedTuple):
    """The time is ``now``: the request that is due, if any."""
    now: float


class GotCode(NamedTuple):
    now: float
    code: PairingCode


class StillPending(NamedTuple):
    """A poll proved the code alive: not paired yet."""
    now: float


class GotToken(NamedTuple):
    """Paired (or already paired at the start: a token held from before)."""
    token: str


class CodeUnknown(NamedTuple):
    """The server no longer knows the code (expired, or used by someone else)."""
    now: float


class NoEnrollment(NamedTuple):
    """The code request itself was answered ``status`` (404, 405, 410): this server
    does not enroll this way."""
    now: float
    status: int


class Failed(NamedTuple):
    """A request failed (the network, a bad answer): ``why``."""
    now: float
    why: str


class TokenRefused(NamedTuple):
    """The token was refused or dropped: a fresh code, after ``hold_s``."""
    now: float
    hold_s: float = 0.0


Event = Union[Started, Tick, GotCode, StillPending, GotToken, CodeUnknown, NoEnrollment,
              Failed, TokenRefused]
Effect = Union[RequestCode, PollPairing, Retry]


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

    def handle(self, event: Event) -> list[Effect]:
        if isinstance(event, Tick):
            return self._tick(event.now)
        if isinstance(event, Started):
            if event.saved is not None and event.saved.expires_at > event.now:
                self.code, self.state = event.saved, WAITING
            self._next_at = event.now
        elif isinstance(event, GotCode):
            # not a reset of the backoff: a server may hand out codes it forgets at
            # once; the first pending poll proves the code (StillPending)
            self._in_flight = False
            self.code, self.state, self.last_error = event.code, WAITING, None
            self._next_at = event.now + self._poll_delay()
        elif isinstance(event, StillPending):
            self._in_flight = False
            self._errors.reset()
            self.last_error = None
            self._next_at = event.now + self._poll_delay()
        elif isinstance(event, GotToken):
            self._in_flight = False
            self._errors.reset()
            self.token, self.state, self.code = event.token, PAIRED, None
        elif isinstance(event, CodeUnknown):
            # a new code, on the backoff (within its base after a code polled pending)
            self.code, self.state = None, NEED_CODE
            return self._back_off(event.now)
        elif isinstance(event, NoEnrollment):
            # no code was made; backs off like any error
            self.last_error = not_enrolling(event.status)
            return self._back_off(event.now)
        elif isinstance(event, Failed):
            self.last_error = event.why
            return self._back_off(event.now)
        elif isinstance(event, TokenRefused):
            self.token, self.code, self.state = None, None, NEED_CODE
            self._in_flight = False
            self._next_at = event.now + event.hold_s
        else:
            raise TypeError(f"not an enrollment event: {type(event).__name__}")
        return []

    def deadline(self) -> float:
        """When the next Tick is wanted (monotonic); inf while nothing is due (paired,
        or a request in flight: its answer comes as an event)."""
        if self.state == PAIRED or self._in_flight:
            return math.inf
        t = self._next_at
        if self.code is not None:
            t = min(t, self.code.expires_at)
        return t

    def _tick(self, now: float) -> list[Effect]:
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

    def _back_off(self, now: float) -> list[Effect]:
        self._in_flight = False
        delay = self._errors.next_delay()
        self._next_at = now + delay
        return [Retry(delay)]

    def _poll_delay(self) -> float:
        j = self.policy.poll_jitter
        return self.policy.poll_interval_s * (1 + self._rng.uniform(-j, j))
