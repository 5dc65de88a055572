"""The server's clock as the link measures it, sans I/O: the one home of "what time the
fleet says it is", for every rule that must not be judged by this device's own clock.

A Pi has no RTC, and its wall clock can be wrong by years (a stale clock file, a
``set-time`` with 2062 typed for 2026). A rule judged on it would refuse the fleet that
could repair it: a command's ``expires_at`` is the server's time, so its expiry is
judged against the server's clock, not this one. The link measures that clock at each
handshake (the upgrade answer's ``Date``, whole seconds) and keeps it as a pair (the
server's time, this device's monotonic time then): the server's time now is that plus
the monotonic time since. A jump of the wall clock (NTP, ``set-time``) changes nothing
of it, and nothing is written to the card: it is measured again at the next handshake.

The same measure says how far this device's wall clock is from the server's
(``skew_s``: the server's minus this device's): past ``SKEWED_S`` it is a status line
and a ``clock.skewed`` event, and ``clock.ok`` when it is back within, each on a
change only. ``set-time`` refuses a time more than ``FAR_S`` from the server's unless
forced (commands/operator.py).
"""
from __future__ import annotations

# A skew worth a word in the journal and the doctor: the Date header has whole seconds
# and the answer takes a while to arrive, so less than this is noise.
NOTABLE_SKEW_S = 30.0
SKEWED_S = 120.0        # the device's clock this far from the server's is told
FAR_S = 86400.0         # set-time to a time this far from the server's is a mistake
CLOCK_SKEWED = "clock.skewed"
CLOCK_OK = "clock.ok"


class ServerClock:
    """Written by the link thread, read by any: the measure is one tuple, replaced whole."""

    def __init__(self) -> None:
        self._mark: tuple[float, float] | None = None   # (the server's wall, our monotonic)
        self._told: bool | None = None                  # skewed when last told; None: never

    def measured(self, server_wall: float, mono: float) -> None:
        """The server's wall time as measured at ``mono`` (this device's monotonic
        clock)."""
        self._mark = (float(server_wall), float(mono))

    def measured_skew(self, skew_s: float | None, wall: float, mono: float) -> None:
        """A measure as the link has it: the server's clock minus this device's wall
        clock ``wall``, read at ``mono``; None measures nothing."""
        if skew_s is not None:
            self.measured(wall + skew_s, mono)

    def now(self, mono: float) -> float | None:
        """The server's wall time at ``mono``, or None before any measure."""
        mark = self._mark
        return None if mark is None else mark[0] + (mono - mark[1])

    def skew_s(self, wall: float, mono: float) -> float | None:
        """The server's clock minus this device's (positive: this one is behind)."""
        server = self.now(mono)
        return None if server is None else server - wall

    def change(self, wall: float, mono: float) -> tuple[str, float] | None:
        """(the event's type, the skew) when the device's clock has just gone past
        ``SKEWED_S`` from the server's or come back within it; None otherwise (and
        before any measure). A first measure within is no news."""
        skew = self.skew_s(wall, mono)
        if skew is None:
            return None
        skewed = abs(skew) > SKEWED_S
        if skewed == bool(self._told):
            self._told = skewed
            return None
        self._told = skewed
        return (CLOCK_SKEWED if skewed else CLOCK_OK), skew

    def far(self, when: float, mono: float) -> float | None:
        """How far ``when`` is from the server's clock now, in seconds, when it is
        more than ``FAR_S``; None when it is within, or nothing was measured."""
        server = self.now(mono)
        if server is None or abs(when - server) <= FAR_S:
            return None
        return when - server
