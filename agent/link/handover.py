"""A server's drain, make before break: sans I/O. While the link is online, a second
connection opens beside the live one at a jittered moment within the server's window
(``OpenSecond``), proves itself with an ACKed heartbeat of its own (``ProveSecond``), and
only then takes the link's place (``Switch``); one that fails or stays unproven past the
ACK timeout is dropped (``DropSecond``) and the live one stays until the drain's end
closes it. LinkCore (core.py) holds the one Handover in progress and journals the switch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from ..base import reasons as J

DRAIN_WINDOW_MAX_S = 15 * 60.0


@dataclass(frozen=True)
class OpenSecond:
    """The server drains: open a new connection beside the live one; answer with
    on_second_opened() or on_second_failed()."""


@dataclass(frozen=True)
class ProveSecond:
    """Send heartbeat ``seq`` on the second connection; its ACK: on_second_proven()."""
    seq: int


@dataclass(frozen=True)
class Switch:
    """The second connection is proven: it carries the link from now on (tell the core
    with on_switched()), and the old one is closed politely."""
    seq: int
    sent_at: float


@dataclass(frozen=True)
class DropSecond:
    """The second connection did not prove itself: abort it; the live one stays."""
    reason: str


class Handover:
    """A drain in progress: when the second connection opens, and its proof."""
    DUE, OPENING, PROVING = "due", "opening", "proving"

    def __init__(self, at: float, window_s: float):
        self.at = at
        self.window_s = window_s
        self.phase = Handover.DUE
        self.seq = 0
        self.sent_at = 0.0
        self.deadline = math.inf

    @classmethod
    def within(cls, window_s: float, now: float, ack_timeout_s: float,
               moment: Callable[[float], float]) -> "Handover":
        """At an even random moment of the window (``moment(span)``: base/backoff's, so
        a node's screens spread over it), early enough that the proof fits in."""
        window = min(DRAIN_WINDOW_MAX_S, max(0.0, window_s))
        return cls(now + moment(max(0.0, window - ack_timeout_s)), window)

    def next_deadline(self) -> float:
        return self.at if self.phase == Handover.DUE else self.deadline

    def due(self, now: float) -> tuple[list, bool]:
        """What is due at ``now``, and whether the handover goes on."""
        if self.phase == Handover.DUE and now >= self.at:
            self.phase = Handover.OPENING
            return [OpenSecond()], True
        if self.phase == Handover.PROVING and now >= self.deadline:
            return [DropSecond(J.ACK_TIMEOUT)], False
        return [], True

    def prove(self, seq: int, now: float, ack_timeout_s: float) -> list:
        self.phase, self.seq, self.sent_at = Handover.PROVING, seq, now
        self.deadline = now + ack_timeout_s
        return [ProveSecond(seq)]

    def failed(self, reason: str) -> list:
        return [DropSecond(reason)] if self.phase == Handover.PROVING else []

    def proven_by(self, seq: int) -> bool:
        return self.phase == Handover.PROVING and seq == self.seq
