"""Decides, sans I/O, whether the agent may tell systemd it is healthy (WATCHDOG=1).

systemd restarts a service whose pets stop. The agent pets only while it is really
doing its job: every internal loop (link, uploads, events, enrollment, commands,
working hours, the alarms' threads: loop.py) has reported progress recently, and, when ``require_link`` is set, the link is proven
live by a recent heartbeat ACK. A wedged thread or a link the agent cannot heal by
itself then ends in a fresh process: fresh sockets, fresh DNS, fresh library state.

A fresh process does not mend a site whose network is out: while the link is down
for such a reason (base/reasons.py's OUTAGE_REASONS), each restart in one outage
comes later than the last (OutagePatience), and a proven link starts the count
again. A stalled loop is restarted at once whatever the link's reason.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Loop:
    """One loop on the gate: its longest silence, its last tick, whether it idles."""
    max_silence_s: float
    last_tick: float
    idle: bool = False


# Restarts in one outage, as multiples of WatchdogSec (5, 10, 20, 40, 60 minutes at
# the unit's 5 min): an 8-hour outage costs 11 restarts, not 94 (scripts/bench), and a
# fleet behind one failed ISP spreads out instead of restarting in step every 5 minutes.
OUTAGE_PATIENCE = (1, 2, 4, 8, 12)


class OutagePatience:
    """How long the link may stay unproven through an outage before the pets stop:
    ``restarts`` is how many watchdog restarts this outage has cost already (kept by
    the shell across them), ``period_s`` the watchdog's period."""

    def __init__(self, period_s: float, restarts: int, now: float):
        self.period_s = period_s
        self.restarts = restarts
        self.unproven_since: float | None = now   # a new process has proven nothing
        self.counted = False       # this process's restart, once its pets stop

    def multiple(self) -> int:
        return OUTAGE_PATIENCE[min(self.restarts, len(OUTAGE_PATIENCE) - 1)]

    def patient(self, now: float, outage: bool) -> bool:
        """Pets go on though the link is unproven: the outage is the network's, and
        this restart's turn has not come."""
        if self.unproven_since is None:
            self.unproven_since = now
        return outage and now - self.unproven_since < (self.multiple() - 1) * self.period_s

    def proven(self) -> bool:
        """The link is proven: the count starts again. True if it was not at 0."""
        had = self.restarts > 0 or self.counted
        self.restarts, self.counted, self.unproven_since = 0, False, None
        return had


class WatchdogGate:
    def __init__(self, require_link: bool = True, patience: OutagePatience | None = None):
        self.require_link = require_link
        self.patience = patience
        self._loops: dict[str, _Loop] = {}
        # the restarts this outage will have cost when the next process starts, for the
        # shell to keep across it; None while unchanged
        self.restarts_to_keep: int | None = None

    def register(self, name: str, max_silence_s: float, now: float) -> None:
        """A loop that must tick at least every ``max_silence_s`` while healthy."""
        self._loops[name] = _Loop(max_silence_s, now)

    def unregister(self, name: str) -> None:
        self._loops.pop(name, None)

    def tick(self, name: str, now: float) -> None:
        loop = self._loops.get(name)
        if loop is not None:
            if now > loop.last_tick:
                loop.last_tick = now
            loop.idle = False   # after the time: never a stale tick that counts

    def gave_up(self, name: str) -> None:
        """The loop was left stopped after dying again and again: stalled from now on,
        idle or not, so the pets stop and systemd starts a fresh process."""
        loop = self._loops.get(name)
        if loop is not None:
            loop.last_tick, loop.idle = float("-inf"), False

    def idle(self, name: str) -> None:
        """The loop waits for input with no deadline (nothing to do until told): it has
        nothing to wedge on, so no silence counts against it until its next tick."""
        loop = self._loops.get(name)
        if loop is not None:
            loop.idle = True

    def stalled(self, now: float) -> list[str]:
        # the loops tick and go idle from their own threads meanwhile
        loops = list(self._loops.items())
        return sorted(n for n, l in loops
                      if not l.idle and now - l.last_tick > l.max_silence_s)

    def verdict(self, now: float, link_live: bool, outage: bool = False) -> tuple[bool, str]:
        """(may pet, why not). ``outage``: the link is down for a reason of the network's
        or the server's (OUTAGE_REASONS)."""
        stalled = self.stalled(now)
        if stalled:
            return False, "stalled: " + ", ".join(stalled)
        patience = self.patience
        if self.require_link and not link_live:
            if patience is None:
                return False, "link not proven live"
            if patience.patient(now, outage):
                return True, ""
            if outage and not patience.counted:
                patience.counted = True
                self.restarts_to_keep = patience.restarts + 1
            return False, (f"link not proven live (an outage: restart {patience.restarts + 1}, "
                           f"after {patience.multiple():g} x WatchdogSec)" if outage
                           else "link not proven live")
        if patience is not None and link_live and patience.proven():
            self.restarts_to_keep = 0
        return True, ""
