"""The display watched between commands: the shell around core.DisplayState.

A TV switched off by hand, a cable pulled, DPMS asleep: none of them is the agent's
doing, and the read-back after a display command (service.py) never sees them. This
thread reads the same sources (sources.py: the DRM connectors in sysfs, X11's DPMS, the
Wayland outputs, the TV over CEC) every ``[screen] display_every_s``, and about a second
after a DRM hotplug (``hotplug()``, which the udev watcher calls), and tells a change of
the display's state once: ``display.changed`` (``state``, ``was``, ``read``, and
``meant_dark`` where the display is meant off). The status board hears each change
(``on_change``); a read that changes nothing writes nothing anywhere, and a source this
screen lacks costs no program run (it is found absent before one would be).

The thread is a Loop on the watchdog gate: it waits in slices of at most SLICE_S and
ticks at each; one read is bounded by its sources' (READ_TIMEOUT_S each).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from ..events.model import Event
from ..runtime.loop import Loop
from ..runtime.watchdog_gate import WatchdogGate
from .core import UNKNOWN, DisplayChanged, DisplayState, Read
from .sources import READ_TIMEOUT_S, Runner

log = logging.getLogger("edge_agent.screen")

SLICE_S = 30.0     # the longest wait between two ticks of the gate
MARGIN_S = 30.0


class DisplayWatch:
    def __init__(self, sources: list, every_s: float, *, publish: Callable[[Event], None],
                 on_change: Callable[[], None] = lambda: None,
                 dark: Callable[[], str | None] = lambda: None,
                 runner: Runner | None = None, gate: WatchdogGate | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        """``dark()``: why the display is meant off now (the working hours, a display
        command), or None: a change is told with it, so an off that was asked for is told
        as such."""
        self.sources, self.every_s = list(sources), every_s
        self.core = DisplayState(every_s)
        self.publish, self.on_change, self.dark = publish, on_change, dark
        self.runner = runner
        self.clock, self.wall = clock, wall
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()   # the core: the udev thread's hotplug, this thread's read
        self.loop = Loop("display", self._run, gate=gate,
                         max_silence_s=SLICE_S + len(self.sources) * READ_TIMEOUT_S + MARGIN_S,
                         pause=self._stop.wait, stopping=self._stop.is_set)

    def start(self) -> None:
        if self.every_s > 0:
            self.loop.start()

    def stop(self) -> None:
        """From any thread: a read running is killed, the thread ends."""
        self._stop.set()
        self._wake.set()
        if self.runner is not None:
            self.runner.stop()

    def join(self, timeout: float | None = None) -> None:
        self.loop.join(timeout)

    def hotplug(self) -> None:
        """From the udev watcher's thread: a DRM connector changed."""
        with self._lock:
            self.core.hotplug(self.clock())
        self._wake.set()

    def check(self) -> None:
        """One read of every source; a change told."""
        readings = tuple(source.read() for source in self.sources)
        with self._lock:
            was = self.core.state
            effects = self.core.handle(Read(readings, self.clock()))
            found = was is None and self.core.state is not None   # the first state known
        for effect in effects:
            if isinstance(effect, DisplayChanged):
                why_dark = self.dark()
                (log.info if why_dark or effect.state == "on" else log.warning)(
                    "display: %s (was %s): %s", effect.state, effect.was, effect.read)
                self.publish(Event("display.changed", self.wall(), {
                    "state": effect.state, "was": effect.was, "read": effect.read,
                    **({"meant_dark": why_dark} if why_dark else {})}))
        if effects or found:
            self.on_change()   # the board says it; a read that changed nothing, nothing

    def snapshot(self) -> dict:
        """For the status: the state and since when, what found it, how often it is read.
        Written on changes only: between two, every read found the same state."""
        with self._lock:
            now, core = self.clock(), self.core
            return {"state": core.state or UNKNOWN,
                    "since_s": None if core.since is None else round(now - core.since, 1),
                    "read": core.state_read or core.read, "every_s": self.every_s}

    def _run(self) -> None:
        self.loop.every(self.step, stop=self._stop, wake=self._wake, slice_s=SLICE_S)

    def step(self) -> float:
        """A read when one is due (the interval's, a hotplug's); the seconds to the next."""
        with self._lock:
            due = self.core.due
        if self.clock() >= due:
            self.check()
        with self._lock:
            return self.core.due - self.clock()
