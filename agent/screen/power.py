"""The display's power, one owner: every turn on or off (the ``display`` command, the
working hours, the recovery ladder's wake) runs here, one at a time, and is read back.

``turn(state)`` (or ``turning(state)``, the same turn as a job that the commands thread
drives a look at a time: base/steps.py) runs ``[commands] display_on_command`` or
``display_off_command`` (bounded by ``[commands] timeout_s``, in a session of its
own, killed when the agent stops, a failure said without its command line), then reads the display back
(service.py) and answers a ``Turned`` (core.py): failed, done (nothing here reads the
display back), confirmed or unconfirmed, in words. Two callers that ask at once are
served one after the other: the second's command never runs between the first's
command and its read-back.

The working hours' turn (``scheduled``) waits, after an on, for a DRM connector to say
connected (a TV woken by CEC raises hot-plug detect seconds after it answers), and the
hours tell it themselves (``display.scheduled``); every other turn's read-back is told
as ``display.read_back``.

What the display is meant to be is known here too (``meant_dark``): off by the working
hours (``schedule``, which they say at each look) or last turned off (a display
command): the picture check, the display's watch and the recovery ladder do not judge
a display meant dark.
"""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Callable

from ..base import children
from ..base.hardware import connectors
from ..base.steps import Acquire, Job, Program, Until, drive
from ..events.model import Event
from .core import OFF, ON, STATES, Turned, not_configured
from .sources import Runner

if TYPE_CHECKING:
    from .service import Screen

# a TV woken by CEC raises hot-plug detect a few seconds after it answers
CONNECT_GRACE_S = 15.0
NOT_CONNECTED = "no display is connected (HDMI unplugged?)"


class DisplayPower:
    def __init__(self, on_command: str | None, off_command: str | None, timeout_s: float,
                 read_back: "Screen | None", publish: Callable[[Event], None], *,
                 sysfs_root: str = "/sys", connect_grace_s: float = CONNECT_GRACE_S,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        """``read_back``: reads the display's state (None: nothing here reads it)."""
        self.commands = {ON: on_command or "", OFF: off_command or ""}
        self.read_back = read_back
        self.publish = publish
        self.sysfs_root, self.connect_grace_s = sysfs_root, connect_grace_s
        self.clock, self.wall = clock, wall
        self.runner = Runner(timeout_s, refused="not run: the agent is stopping")
        self.meant: str | None = None       # the state last turned to (its command ran)
        self.scheduled: str | None = None   # what the working hours want now, if any
        self._turning = threading.Lock()
        self._stop = threading.Event()

    @property
    def bound_s(self) -> float:
        """A turn at most: its own (the command, the connect grace, the read-back) and
        one it waits behind (no longer: it is given up, said)."""
        one = self.runner.timeout_s + self.connect_grace_s + (
            self.read_back.bound_s if self.read_back is not None else 0.0)
        return 2 * one

    def turn(self, state: str, *, scheduled: bool = False) -> Turned:
        """On the caller's thread (the hours', the mender's), after any turn in
        progress."""
        return drive(self.turning(state, scheduled=scheduled))

    def turning(self, state: str, *, scheduled: bool = False) -> Job:
        """The same turn as a job (base/steps.py), for a thread that drives it a look at
        a time (the commands thread); the Turned its result."""
        if state not in STATES:
            raise ValueError(f"state: {state!r}")
        if not (yield Acquire(self._turning, self.bound_s / 2)):
            return Turned(state, f"not turned: the display was still being turned after "
                                 f"{self.bound_s / 2:g} s (another turn's bound)")
        try:
            error = yield from self._run(state)
            if error:
                return Turned(state, error)
            self.meant = state   # from now: the picture check counts an off as dark
            if scheduled and state == ON and not (
                    (yield from self._connected_within(self.connect_grace_s))):
                return Turned(state, NOT_CONNECTED)
            if self.read_back is None:
                return Turned(state)
            turned = Turned(state, read=(yield from self.read_back.reading_back(state)))
        finally:
            self._turning.release()
        if not scheduled:
            self.publish(Event("display.read_back", self.wall(),
                               {"state": state, **turned.fields()}))
        return turned

    def wake(self) -> tuple[bool, str]:
        """The recovery ladder's wake: on, read back; (on as far as can be told, words)."""
        turned = self.turn(ON)
        return turned.ok, turned.said()

    def schedule(self, wanted: str | None) -> None:
        """From the working hours, at each look: on, off, or None (no clock to trust)."""
        self.scheduled = wanted

    def meant_dark(self) -> str | None:
        """Why the display is meant to be dark now, or None."""
        if self.scheduled == OFF:
            return "off by working hours"
        if self.meant == OFF:
            return "turned off by a display command"
        return None

    def snapshot(self) -> dict | None:
        return self.read_back.snapshot() if self.read_back is not None else None

    def stop(self) -> None:
        """From any thread, on the agent's way out: a command or read-back in progress
        ends now, and none starts."""
        self._stop.set()
        self.runner.stop()
        if self.read_back is not None:
            self.read_back.stop()

    # -- internals -----------------------------------------------------------------
    def _run(self, state: str) -> Job:
        """"" once the configured command ran and exited 0, else why not."""
        command = self.commands[state]
        if not command:
            return not_configured(state)
        argv, why = children.split(command)
        if why:
            return why
        _, why = yield Program(self.runner, argv)
        return why

    def _connected_within(self, seconds: float) -> Job:
        deadline = self.clock() + seconds
        while not self._display_connected():
            if self.clock() >= deadline or self._stop.is_set():
                return False
            yield Until(min(self.clock() + 0.5, deadline), self.clock, self._stop)
            if self._stop.is_set():
                return False
        return True

    def _display_connected(self) -> bool:
        """A DRM connector says connected; a device with no DRM at all (a test, a board
        whose display is not DRM's) is not second-guessed."""
        statuses = connectors(self.sysfs_root).values()
        return not statuses or "connected" in statuses
