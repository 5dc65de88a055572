"""Who this device is to its server, sans I/O: one object, typed events in, effects out.

The token, the id the server knows the device by, whether an operator claimed it and
the pairing code of a registration change here and nowhere else, one event at a time
(the shell in service.py feeds them under one lock, from whichever thread they come:
the link's callbacks, the enroller, the operator's SIGUSR2). Readers on other threads
see ``current``, a snapshot replaced whole, never half of a change.

The profiles differ only in their inputs: the native profile enrolls over HTTPS
(``Enrolled``), ScreenTinker registers inside the link (``Registered``, ``Claimed``,
``UnpairedByServer``). A token the enroller brings back is kept only if no revoke came
after the enrollment it answers started (``generation``): a revoke cannot be undone by
a pairing answer that was already on its way.

The shell answers each ``Store`` and ``Forget`` with ``Written`` or ``WriteFailed``. A
credential the disk cannot take yet (a full or read-only state partition, an I/O error)
is still in use: the server has spent the pairing code, so dropping the token would
strand the screen. It stays in memory, and the latest write the disk lacks is tried
again on a capped backoff (``due``), never in a hot loop, until the disk takes it.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace

from ..base.backoff import Backoff, BackoffPolicy
from ..base.journal_fields import MessageId

# Retries of a credentials write the disk refused: 1 s doubling to 5 minutes. No jitter:
# the disk is this device's own, nobody else retries against it.
WRITE_RETRY = BackoffPolicy(base_s=1.0, cap_s=300.0, jitter="none")
# Each write is fsync'd on the SD card, and a server decides when one happens (a
# ScreenTinker server that re-issues the token on every message made 978 writes in 90
# s; answering each as a claimed screen's, "online", made a claim follow each token:
# 2,984 fsyncs in 30 s): a burst of WRITE_BURST, then one every WRITE_EVERY_S, for
# every token and claim a server's message brings (SERVER_SAYS). Beyond it the credentials are
# in use from memory and the latest is written when the budget allows, and at the stop.
# Four: a screen unpaired and paired again at once (register, claim, register, claim)
# has each on the card without waiting.
WRITE_BURST = 4
WRITE_EVERY_S = 20.0
HELD_BACK = "held back: the server changes them faster than the card is written"


@dataclass(frozen=True)
class Identity:
    """The credentials in use: the device id, the token, whether an operator claimed it."""
    device_id: str             # what the server knows this device by
    token: str | None
    claimed: bool              # an operator added it (always, for the native profile's token)
    pairing_code: str | None   # the code a link registration was made with, until claimed


# -- events ---------------------------------------------------------------------
@dataclass(frozen=True)
class Registered:
    """The server registered us inside the link and handed over a token (ScreenTinker)."""
    token: str
    server_device_id: str | None = None
    pairing_code: str | None = None


@dataclass(frozen=True)
class Claimed:
    """An operator added this screen on the server (ScreenTinker)."""
    name: str = ""


@dataclass(frozen=True)
class UnpairedByServer:
    """The server no longer has this device (ScreenTinker)."""


# the events a server's message makes, as many as it likes, that write the card: held to
# the write budget. (UnpairedByServer only removes the file, unsynced: a server's next
# token after it is a Registered, which waits for the budget.)
SERVER_SAYS = (Registered, Claimed)


@dataclass(frozen=True)
class Enrolled:
    """The enrollment that started at ``generation`` was paired: its token."""
    token: str
    generation: int


@dataclass(frozen=True)
class Refused:
    """The server refused our token at connect."""
    detail: str


@dataclass(frozen=True)
class Revoked:
    """Drop the credentials and pair anew (the operator: SIGUSR2, `edge-agent unpair`)."""


@dataclass(frozen=True)
class Written:
    """The shell carried out ``effect`` (a Store or a Forget) on the disk."""
    effect: object


@dataclass(frozen=True)
class WriteFailed:
    """The disk refused ``effect`` at monotonic ``now``; ``why`` is one line, no secret."""
    effect: object
    why: str
    now: float


# -- effects --------------------------------------------------------------------
@dataclass(frozen=True)
class Store:
    """Write the credentials (atomically, durably, 0600); answered with Written or
    WriteFailed."""
    token: str
    server_device_id: str | None = None
    pairing_code: str | None = None
    claimed: bool | None = None


@dataclass(frozen=True)
class Forget:
    """Delete the stored credentials; answered with Written or WriteFailed."""


@dataclass(frozen=True)
class Note:
    """A line for the journal (effect)."""
    level: int
    message: str
    message_id: str | None = None   # a moment the journal's catalog explains


@dataclass(frozen=True)
class RestartEnrollment:
    """Pair again, for this generation of the credentials (effect)."""
    generation: int


@dataclass(frozen=True)
class PauseLink:
    """No credentials to connect with: the link waits (effect)."""
    pass


@dataclass(frozen=True)
class ResumeLink:
    """Credentials again: the link connects (effect)."""
    pass


@dataclass(frozen=True)
class Reregister:
    """Drop the link and register anew, with a fresh pairing code (ScreenTinker)."""
    why: str


@dataclass(frozen=True)
class ResumeUploads:
    """New credentials: a hold on refused ones ends."""


@dataclass(frozen=True)
class StatusChanged:
    """What the status shows of the identity changed (effect)."""
    pass


class IdentityCore:
    def __init__(self, local_device_id: str, current: Identity, preprovisioned: bool,
                 pairs_in_link: bool):
        self.local_device_id = local_device_id   # ours, derived once; a server may assign another
        self.current = current
        self.preprovisioned = preprovisioned     # a token from agent.toml: never dropped here
        self.pairs_in_link = pairs_in_link
        self.generation = 0                      # of the enrollment whose answer we would keep
        # the latest Store/Forget the disk refused, while the disk still lacks it
        self.unwritten: Store | Forget | None = None
        self.write_error: str | None = None
        self.write_failures = 0
        self.write_retry_at = math.inf           # monotonic; inf while nothing is due
        self._write_backoff = Backoff(WRITE_RETRY)
        self._budget = float(WRITE_BURST)        # writes the card may take now
        self._budget_at: float | None = None     # when it was last counted (monotonic)

    def handle(self, event, now: float | None = None) -> list:
        """Changes ``current`` as ``event`` says; returns what the shell must do, in order.
        ``now`` (monotonic) holds the writes to the budget; without it (a test of the
        disk's answers) every write goes at once."""
        effects = self._handle(event)
        # what a server's message changes is held to the budget (a real pairing, a
        # registration and its claim, fits in the burst); an enrollment's token or the
        # operator's unpair is written at once, whatever the card did
        if now is None or not isinstance(event, SERVER_SAYS):
            return effects
        out = []
        for effect in effects:
            if isinstance(effect, (Store, Forget)) and not self._spend(now):
                out += self._hold_back(effect, now)
            else:
                out.append(effect)
        return out

    def _spend(self, now: float) -> bool:
        if self._budget_at is not None:
            self._budget = min(float(WRITE_BURST),
                               self._budget + (now - self._budget_at) / WRITE_EVERY_S)
        self._budget_at = now
        if self._budget >= 1.0:
            self._budget -= 1.0
            return True
        return False

    def _budget_back_at(self, now: float) -> float:
        """When the budget holds a whole write again (monotonic)."""
        return now + (1.0 - self._budget) * WRITE_EVERY_S

    def _hold_back(self, effect, now: float) -> list:
        """The latest write waits for the budget; said once per hold."""
        first = self.unwritten is None or self.write_error != HELD_BACK
        self.unwritten, self.write_error = effect, HELD_BACK
        self.write_retry_at = self._budget_back_at(now)
        if not first:
            return []
        return [Note(logging.WARNING, f"credentials {HELD_BACK}: in use from memory, the "
                                      f"latest written in {self.write_retry_at - now:.0f}s"),
                StatusChanged()]

    def _handle(self, event) -> list:
        cur = self.current
        if isinstance(event, Registered):
            if event.token == cur.token and not (event.server_device_id
                                                 and event.server_device_id != cur.device_id):
                return []
            self.current = Identity(event.server_device_id or cur.device_id, event.token,
                                    False, event.pairing_code)
            return [Store(event.token, event.server_device_id, event.pairing_code, claimed=False),
                    Note(logging.INFO, f"registered with the server as {self.current.device_id}"),
                    StatusChanged()]
        if isinstance(event, Claimed):
            if cur.claimed or not cur.token:
                return []
            self.current = replace(cur, claimed=True, pairing_code=None)
            named = f" as {event.name!r}" if event.name else ""
            return [Store(cur.token, cur.device_id, None, claimed=True),
                    Note(logging.INFO, f"paired: an operator added this screen{named}",
                         MessageId.PAIRING_CLAIMED),
                    ResumeUploads(), StatusChanged()]
        if isinstance(event, UnpairedByServer):
            if self.preprovisioned:
                return [Note(logging.ERROR, "the server unpaired this pre-provisioned device: "
                                            "check [identity] token")]
            self.current = Identity(self.local_device_id, None, False, None)
            return [Forget(), StatusChanged()]
        if isinstance(event, Enrolled):
            if event.generation != self.generation:
                return [Note(logging.INFO, "enrollment: unpaired while the pairing answer was "
                                           "on its way; not keeping that token")]
            self.current = replace(cur, token=event.token, claimed=True)
            return [Store(event.token), Note(logging.INFO, "paired", MessageId.PAIRING_CLAIMED),
                    ResumeLink(), ResumeUploads(), StatusChanged()]
        if isinstance(event, Refused):
            if self.preprovisioned:
                return [Note(logging.ERROR, f"the server refused the pre-provisioned token "
                                            f"({event.detail}): check [identity] token; backing off")]
            if self.pairs_in_link or cur.token is None:
                return []  # ScreenTinker answers refusals with device:auth-error in the link
            return [Note(logging.WARNING, f"the server refused this device's token "
                                          f"({event.detail}): dropping it and enrolling again")
                    ] + self._revoke()
        if isinstance(event, Revoked):
            if self.preprovisioned:
                return [Note(logging.WARNING, "not unpairing: the token is pre-provisioned in "
                                              "agent.toml")]
            return self._revoke()
        if isinstance(event, Written):
            return self._written(event.effect)
        if isinstance(event, WriteFailed):
            return self._write_failed(event)
        raise TypeError(f"not an identity event: {event!r}")

    # -- the disk -------------------------------------------------------------------
    def due(self, now: float) -> list:
        """The write to try again at ``now``, if its time has come (the shell answers
        with Written or WriteFailed)."""
        if self.unwritten is None or now < self.write_retry_at:
            return []
        # a write the disk refused has its own backoff; one held back waits for the budget
        if self.write_error == HELD_BACK and not self._spend(now):
            self.write_retry_at = self._budget_back_at(now)
            return []
        self.write_retry_at = math.inf   # one attempt at a time
        return [self.unwritten]

    def flush(self) -> list:
        """The agent stops: a write held back for the budget goes now (a power cut
        before it loses only a token the server re-issues at the next registration)."""
        if self.unwritten is None or self.write_error != HELD_BACK:
            return []
        self.write_retry_at = math.inf
        return [self.unwritten]

    @property
    def next_write_at(self) -> float | None:
        """When ``due`` has a write to try again (monotonic), or None."""
        return None if self.unwritten is None else self.write_retry_at

    def _written(self, effect) -> list:
        stored = isinstance(effect, Store)
        if self.unwritten is None:
            return [Note(logging.INFO, "credentials stored")] if stored else []
        failures, held = self.write_failures, self.write_error == HELD_BACK
        self.unwritten, self.write_error, self.write_failures = None, None, 0
        self.write_retry_at = math.inf
        self._write_backoff.reset()
        what = "credentials stored" if stored else "stored credentials removed"
        if held and not failures:
            return [Note(logging.INFO, f"{what}, the latest after a hold"), StatusChanged()]
        return [Note(logging.INFO, f"{what}, after {failures} failed "
                                   f"attempt{'s' if failures != 1 else ''}"), StatusChanged()]

    def _write_failed(self, event: WriteFailed) -> list:
        first, repeated = self.unwritten is None, event.why == self.write_error
        self.unwritten, self.write_error = event.effect, event.why
        self.write_failures += 1
        delay = self._write_backoff.next_delay()
        self.write_retry_at = event.now + delay
        if repeated and not first:
            return []   # the same refusal again: said once, status shows the count
        what = ("credentials not stored yet ({}): in use from memory, writing them"
                if isinstance(event.effect, Store) else "stored credentials not removed yet ({}): "
                "removing them")
        return [Note(logging.WARNING, what.format(event.why) + f" again in {delay:.0f}s and then "
                                      "less often until it works"), StatusChanged()]

    def storage(self) -> dict | None:
        """For status: a credentials write the disk still lacks (its next try as a
        monotonic time, None while one is under way), or None."""
        if self.unwritten is None:
            return None
        return {"stored": False, "pending": "store" if isinstance(self.unwritten, Store) else "remove",
                "error": self.write_error, "failed_attempts": self.write_failures,
                "next_try_at": None if self.write_retry_at == math.inf else self.write_retry_at}

    def _revoke(self) -> list:
        self.generation += 1
        self.current = Identity(self.local_device_id if self.pairs_in_link else self.current.device_id,
                                None, False, None)
        if self.pairs_in_link:
            return [Forget(), Reregister("unpaired on this screen"), StatusChanged()]
        # the enroller first: once it knows, an answer in flight can no longer be kept
        return [RestartEnrollment(self.generation), Forget(), PauseLink(), StatusChanged()]
