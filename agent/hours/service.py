"""The working-hours thread: asks the schedule what the display should be, and turns
the display through its one owner (the screen part's ``Power``, agent/screen/power.py)
when the answer changes. No network needed.

Only on a clock it can trust: a Pi boots without an RTC at the last time it saved, so
before NTP answers (or with ``[hours] clock = "trusted"``, for a board with an RTC) the
display is left as it is: a screen lit out of hours costs less than one dark in them.
A command that fails (CEC not answered, no output) is a fault, tried again each minute;
an "off" the schedule asked for is not. After a command that ran, the display's state is
read back (the owner's turn): the change's event says whether it was confirmed and by
what, and a display that still reads the other state once the settle is over is a
fault like a failed command (once, tried again each minute). At each look the owner is
told what the schedule wants (``schedule``): a display off by the hours is not judged.

The thread is a Loop: a bug in a look at the clock restarts it after a backoff, seen in
the journal, and it is on the watchdog gate (it looks at least every TICK_S, and one
look is bounded by the owner's turn).
"""
from __future__ import annotations

import logging
import threading
import time
from datetime import datetime
from typing import Callable
from zoneinfo import ZoneInfo

from ..base.clock import wall_synced
from ..runtime.loop import Loop
from ..runtime.watchdog_gate import WatchdogGate
from ..config.model import Hours
from ..events.model import Event
from ..config.week import Schedule
from ..screen.core import OFF, ON, Power

log = logging.getLogger("edge_agent.hours")

TICK_S = 30.0          # how often the clock is asked again, besides the next change
RETRY_S = 60.0         # a failed command, again


def max_silence_s(turn_s: float) -> float:
    """What the watchdog gate allows between two looks: the wait, a turn of the display
    to its bound (a command that ran to its timeout, the connect grace, the read-back,
    one turn it waited behind), and a margin for the rest."""
    return TICK_S + turn_s + 30.0


class WorkingHours:
    def __init__(self, schedule: Schedule, zone: str | None, power: Power, trust_clock: bool,
                 on_fault: Callable[[dict], None], on_change: Callable[[dict], None],
                 now: Callable[[], float] = time.time, synced: Callable[[], bool] = wall_synced,
                 monotonic: Callable[[], float] = time.monotonic,
                 gate: WatchdogGate | None = None):
        """``power``: the display's owner, which turns it and reads it back. ``gate``:
        the thread is on the watchdog gate (the daemon's)."""
        self.schedule = schedule
        self.zone = ZoneInfo(zone) if zone else None   # None: the system's local time
        self.power = power
        self.on_fault, self.on_change = on_fault, on_change
        self.now, self.synced, self.monotonic = now, synced, monotonic
        self.read_back: str | None = None   # what the last read-back said
        self.applied: bool | None = None    # what the last command that worked set
        self.waiting_for_clock = False
        # once NTP set the clock it is trusted until the next boot: the kernel calls it
        # unsynchronised again after some hours without NTP (an offline site), while its
        # drift is seconds a day
        self._clock_trusted = trust_clock
        self._wanted_before: bool | None = None
        self.fault: str | None = None
        self._retry_at = 0.0
        self._stop = threading.Event()
        self.loop = Loop("hours", self._run, gate=gate,
                         max_silence_s=max_silence_s(power.bound_s),
                         pause=self._stop.wait, stopping=self._stop.is_set)

    def local_now(self) -> datetime:
        return datetime.fromtimestamp(self.now(), self.zone).replace(tzinfo=None)

    def wanted(self, local: datetime | None = None) -> bool | None:
        """On or off by the schedule at ``local`` (default: now); None while the clock
        cannot be trusted."""
        if not self._clock_trusted:
            self._clock_trusted = self.synced()
            if not self._clock_trusted:
                return None
        return self.schedule.wanted(local or self.local_now())

    def expected_off(self) -> bool:
        """The display is off because the schedule says so (a disconnect is no fault)."""
        return self.wanted() is False

    def start(self) -> None:
        self.loop.start()

    def join(self, timeout: float | None = None) -> None:
        self.loop.join(timeout)

    def stop(self) -> None:
        self._stop.set()

    def step(self) -> float:
        """One look at the clock; returns how long to wait before the next."""
        local = self.local_now()
        wanted = self.wanted(local)
        self.power.schedule(None if wanted is None else ON if wanted else OFF)
        if wanted is None:
            if not self.waiting_for_clock:
                log.warning("working hours: the clock is not synchronised yet; the display "
                            "is left as it is until it is")
            self.waiting_for_clock = True
            return TICK_S
        self.waiting_for_clock = False
        if local.fold and self.applied is not None:
            # the hour the clocks went back, lived a second time: its changes happened
            # the first time (off at 02:30 must not come on again at 02:00)
            return TICK_S
        if wanted != self._wanted_before:   # a new state is not held back by the last one's retry
            self._wanted_before, self._retry_at = wanted, 0.0
        if wanted == self.applied:
            self.fault = None
        elif self.fault is None or self.monotonic() >= self._retry_at:
            self._apply(wanted)
        local = self.local_now()   # again: a command may have taken its seconds
        change = self.schedule.next_change(local)
        if change is None:
            return TICK_S
        return max(1.0, min(TICK_S, (change - local).total_seconds()))

    def snapshot(self) -> dict:
        local = self.local_now()
        wanted = self.wanted(local)
        change = self.schedule.next_change(local) if wanted is not None else None
        return {"wanted": None if wanted is None else ("on" if wanted else "off"),
                "applied": None if self.applied is None else ("on" if self.applied else "off"),
                "next_change": change.isoformat(timespec="minutes") if change else None,
                "waiting_for_clock": self.waiting_for_clock, "fault": self.fault,
                "read_back": self.read_back}

    # -- internals -----------------------------------------------------------------
    def _run(self) -> None:
        """The loop's body. A bug in step() raises out of it: supervise.py logs it,
        restarts the body after a backoff, and leaves it stopped (the pets stop with it)
        if it keeps dying, where a catch-all here hid it in a retry every minute."""
        self.loop.every(self.step, stop=self._stop)

    def _apply(self, on: bool) -> None:
        state = ON if on else OFF
        turned = self.power.turn(state, scheduled=True)
        error, verdict = turned.error, turned.read
        if verdict is not None:
            self.read_back = verdict.said()
            if verdict.contrary:
                error = verdict.why
        # the state first, then the event: the status the event's refresh writes has it
        if not error:
            changed, self.applied, self.fault = self.applied != on, on, None
            if changed:
                log.info("working hours: display %s%s", state,
                         f": {verdict.said()}" if verdict else "")
                self.on_change({"state": state, "by": "working hours", **turned.fields()})
            return
        self._retry_at = self.monotonic() + RETRY_S
        new, self.fault = self.fault != error, error
        if new:
            log.warning("working hours: the display should be %s and is not: %s", state, error)
            self.on_fault({"wanted": state, "error": error})


def from_config(hours: Hours, power: Power, *, publish: Callable[[Event], None],
                gate: WatchdogGate | None = None) -> WorkingHours:
    """Working hours as the configuration sets them, the display turned through
    ``power`` (its owner: [commands]' display commands, each read back); what they do is
    told as events (display.scheduled, display.fault)."""
    return WorkingHours(
        Schedule.parse(list(hours.week), list(hours.exceptions)), hours.timezone, power,
        trust_clock=hours.clock == "trusted",
        on_fault=lambda d: publish(Event("display.fault", time.time(), d)),
        on_change=lambda d: publish(Event("display.scheduled", time.time(), d)),
        gate=gate)
