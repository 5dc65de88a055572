"""One of the agent's threads, as every one of them is: started, supervised, on the
watchdog gate while it has work, and stopped.

A part (the link, the uploads, the events, the enrollment) gives its Loop the body
that runs its turns, how to wait between restarts of it, and how to tell that it
was asked to stop (a periodic part's body is ``every(step, ...)``: a step, then a wait
for its time, a wake or the stop). The loop is on the gate from its start; its body calls ``turn()``
at each turn: progress, which keeps the gate's pets coming. Before a wait with no
deadline (nothing to do until the kernel, the server or another thread says so) it
calls ``idle()``: its silence no longer counts, as a thread blocked on input has nothing
to wedge on; the next turn counts it again.
A body that raises is restarted (supervise.py); one that keeps dying is left
stopped, its ticks stop, the pets stop, and systemd starts a fresh process.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from .supervise import supervise
from .watchdog_gate import WatchdogGate


class Loop:
    def __init__(self, name: str, body: Callable[[], None], *, max_silence_s: float,
                 pause: Callable[[float], bool], stopping: Callable[[], bool],
                 gate: WatchdogGate | None = None,
                 clock: Callable[[], float] = time.monotonic):
        """``max_silence_s``: the longest a healthy turn takes. ``pause(seconds)`` waits
        before a restart and says whether to give up (asked to stop meanwhile)."""
        self.name = name
        self.max_silence_s = max_silence_s
        self._body, self._pause, self._stopping = body, pause, stopping
        self._gate = gate
        self._clock = clock
        self.gave_up = False   # the body kept dying: the process must end
        self._then: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # -- the owner's thread -----------------------------------------------------------
    def start(self, then: Callable[[], None] | None = None) -> None:
        """``then()`` runs on this loop's thread once it has ended, however it ended."""
        self._then = then
        if self._gate is not None:   # from now: a thread that never gets going is a stall
            self._gate.register(self.name, self.max_silence_s, self._clock())
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread.ident is not None:   # started
            self._thread.join(timeout)

    # -- the loop's own thread ----------------------------------------------------------
    def turn(self) -> None:
        if self._gate is not None:
            self._gate.tick(self.name, self._clock())

    def idle(self) -> None:
        if self._gate is not None:
            self._gate.idle(self.name)

    def every(self, step: Callable[[], float | None], *, stop: threading.Event,
              wake: threading.Event | None = None, slice_s: float | None = None) -> None:
        """A body that is one ``step()`` at a time, for a part's periodic thread: ``step()``
        says in how many seconds the next is due, or None: not before ``wake`` is set.
        Between two it waits for that time, ``wake`` or ``stop`` (whoever sets ``stop``
        sets ``wake`` too); a wait past ``slice_s`` is cut in slices, each a turn of the
        gate, and an untimed one is idle on it. ``wake`` is cleared before each step: one
        set during it runs the next at once."""
        woken = wake if wake is not None else stop
        while not stop.is_set():
            self.turn()
            if wake is not None:
                wake.clear()
            delay = step()
            if delay is None:
                self.idle()
                woken.wait()
                continue
            until = time.monotonic() + delay
            while not stop.is_set() and (left := until - time.monotonic()) > 0:
                if woken.wait(left if slice_s is None else min(left, slice_s)):
                    break
                self.turn()

    def run(self) -> None:
        """The body, supervised, on the calling thread (start() runs it on the loop's)."""
        self.gave_up = not supervise(self.name, self._body, self._stopping, self._pause)
        if self.gave_up and self._gate is not None:
            self._gate.gave_up(self.name)

    def _run(self) -> None:
        try:
            self.run()
        finally:
            if self._then is not None:
                self._then()
