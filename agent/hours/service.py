"""The working-hours thread: asks the schedule what the display should be, and runs the
configured display command when the answer changes. No network needed.

Only on a clock it can trust: a Pi boots without an RTC at the last time it saved, so
before NTP answers (or with ``[hours] clock = "trusted"``, for a board with an RTC) the
display is left as it is: a screen lit out of hours costs less than one dark in them.
A command that fails (CEC not answered, no output) is a fault, tried again each minute;
an "off" the schedule asked for is not. After a command that ran, the display's state is
read back (agent/screen/, the ``screen`` port): the change's event says whether it was
confirmed and by what, and a display that still reads the other state once the settle
is over is a fault like a failed command (once, tried again each minute).

The thread is a Loop: a bug in a look at the clock restarts it after a backoff, seen in
the journal, and it is on the watchdog gate (it looks at least every TICK_S, and one
look is bounded by the display command's timeout and the connect grace).
"""
from __future__ import annotations

import logging
import shlex
import subprocess
import threading
import time
from datetime import datetime
from typing import Callable
from zoneinfo import ZoneInfo

from ..base import children
from ..base.clock import wall_synced
from ..base.hardware import connectors
from ..runtime.loop import Loop
from ..runtime.watchdog_gate import WatchdogGate
from ..config.model import Commands, Hours
from ..events.model import Event
from ..config.week import Schedule
from ..screen.core import Display

log = logging.getLogger("edge_agent.hours")

TICK_S = 30.0          # how often the clock is asked again, besides the next change
RETRY_S = 60.0         # a failed command, again
# a TV woken by CEC raises hot-plug detect a few seconds after it answers
CONNECT_GRACE_S = 15.0


def max_silence_s(timeout_s: float, connect_grace_s: float, read_back_s: float = 0.0) -> float:
    """What the watchdog gate allows between two looks: the wait, a command that ran to
    its timeout (and was killed), the connect grace, the read-back's bound, and a margin
    for the rest."""
    return TICK_S + timeout_s + connect_grace_s + read_back_s + 30.0


class WorkingHours:
    def __init__(self, schedule: Schedule, zone: str | None, on_command: str, off_command: str,
                 timeout_s: float, trust_clock: bool, on_fault: Callable[[dict], None],
                 on_change: Callable[[dict], None], sysfs_root: str = "/sys",
                 now: Callable[[], float] = time.time, synced: Callable[[], bool] = wall_synced,
                 monotonic: Callable[[], float] = time.monotonic,
                 connect_grace_s: float = CONNECT_GRACE_S,
                 gate: WatchdogGate | None = None, screen: Display | None = None):
        """``gate``: the thread is on the watchdog gate (the daemon's). ``screen``: reads
        the display's state back after each command that ran (None: not read)."""
        self.schedule = schedule
        self.zone = ZoneInfo(zone) if zone else None   # None: the system's local time
        self.commands = {True: shlex.split(on_command), False: shlex.split(off_command)}
        self.timeout_s = timeout_s
        self.connect_grace_s = connect_grace_s
        self.on_fault, self.on_change = on_fault, on_change
        self.sysfs_root = sysfs_root
        self.now, self.synced, self.monotonic = now, synced, monotonic
        self.screen = screen
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
                         max_silence_s=max_silence_s(timeout_s, connect_grace_s,
                                                     screen.bound_s if screen else 0.0),
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
        while not self._stop.is_set():
            self.loop.turn()
            self._stop.wait(self.step())

    def _apply(self, on: bool) -> None:
        state = "on" if on else "off"
        error = self._run_command(self.commands[on])
        if error is None and on and not self._connected_within(self.connect_grace_s):
            error = "no display is connected (HDMI unplugged?)"
        verdict = None
        if error is None and self.screen is not None:
            verdict = self.screen.read_back(state)
            self.read_back = verdict.said()
            if verdict.contrary:
                error = verdict.why
        # the state first, then the event: the status the event's refresh writes has it
        if error is None:
            changed, self.applied, self.fault = self.applied != on, on, None
            if changed:
                log.info("working hours: display %s%s", state,
                         f": {verdict.said()}" if verdict else "")
                self.on_change({"state": state, "by": "working hours",
                                **(verdict.fields() if verdict else {})})
            return
        self._retry_at = self.monotonic() + RETRY_S
        new, self.fault = self.fault != error, error
        if new:
            log.warning("working hours: the display should be %s and is not: %s", state, error)
            self.on_fault({"wanted": state, "error": error})

    def _run_command(self, argv: list[str]) -> str | None:
        """None, or why it failed (children.failure: never the command line)."""
        try:
            proc = children.spawn(argv)
        except OSError as e:
            return children.failure(argv, error=e)
        try:
            _, err = children.finish(proc, self.timeout_s)
        except subprocess.TimeoutExpired:
            return children.failure(argv, timeout_s=self.timeout_s)
        if proc.returncode != 0:
            return children.failure(argv, exited=proc.returncode, stderr=err)
        return None

    def _connected_within(self, seconds: float) -> bool:
        deadline = self.monotonic() + seconds
        while not self._display_connected():
            if self.monotonic() >= deadline or self._stop.wait(0.5):
                return False
        return True

    def _display_connected(self) -> bool:
        """A DRM connector says connected; a device with no DRM at all (a test, a board
        whose display is not DRM's) is not second-guessed."""
        statuses = connectors(self.sysfs_root).values()
        return not statuses or "connected" in statuses


def from_config(hours: Hours, commands: Commands, *, sysfs_root: str,
                publish: Callable[[Event], None],
                gate: WatchdogGate | None = None, screen: Display | None = None) -> WorkingHours:
    """Working hours as the configuration sets them, run through [commands]' display
    commands, each read back through ``screen``; what they do is told as events
    (display.scheduled, display.fault)."""
    return WorkingHours(
        Schedule.parse(list(hours.week), list(hours.exceptions)), hours.timezone,
        commands.display_on_command, commands.display_off_command, commands.timeout_s,
        trust_clock=hours.clock == "trusted",
        on_fault=lambda d: publish(Event("display.fault", time.time(), d)),
        on_change=lambda d: publish(Event("display.scheduled", time.time(), d)),
        sysfs_root=sysfs_root, gate=gate, screen=screen)
