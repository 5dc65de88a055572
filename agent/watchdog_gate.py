"""Decides, sans I/O, whether the agent may tell systemd it is healthy (WATCHDOG=1).

systemd restarts a service whose pets stop. The agent pets only while it is really
doing its job: every internal loop (link, uploads, events, enrollment: loop.py) has
reported progress recently, and, when ``require_link`` is set, the link is proven
live by a recent heartbeat ACK. A wedged thread or a link the agent cannot heal by
itself then ends in a fresh process: fresh sockets, fresh DNS, fresh library state.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Loop:
    max_silence_s: float
    last_tick: float
    idle: bool = False


class WatchdogGate:
    def __init__(self, require_link: bool = True):
        self.require_link = require_link
        self._loops: dict[str, _Loop] = {}

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

    def verdict(self, now: float, link_live: bool) -> tuple[bool, str]:
        """(may pet, why not)."""
        stalled = self.stalled(now)
        if stalled:
            return False, "stalled: " + ", ".join(stalled)
        if self.require_link and not link_live:
            return False, "link not proven live"
        return True, ""
