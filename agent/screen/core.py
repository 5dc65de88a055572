"""The display's state read back, never assumed (sans I/O).

After a display command (the ``display`` command, working hours) the shell reads the
real state from each source this screen has: the DRM connector in sysfs, X11's DPMS,
the Wayland outputs, the TV over HDMI-CEC. This core decides, from what they read and a
monotonic clock, when to read again and what the answer is:

- **off** is confirmed as soon as one source reads off: any layer that is off leaves
  the screen dark (a TV in standby shows nothing, whatever the HDMI signal does).
- **on** is confirmed when at least one source reads on and none reads off: the
  picture shows only when every layer that can tell is on.
- A source that cannot tell (it failed, or its outputs disagree) counts for neither;
  one that this screen does not have (not installed, no adapter, nothing to connect to)
  is not read again. With no source left the answer is at once: unconfirmed, and why.
- Otherwise the sources are read again, each at its own pace (the CEC bus is not
  flooded), until the settle ends: then a last look, and the answer is unconfirmed,
  ``contrary`` when the display did not reach the state asked for (on: a source reads
  off; off: every source reads on), or for want of any reading that tells.
- A display asked on that still reads off is retried once, bounded: each source that
  can mend it does one rung (X11: DPMS force on; Wayland: the output enabled again;
  CEC: Image View On and Active Source),
  then it is read for one more settle. Never a second time, never for off.

Inputs: ``Asked`` (the state, the time), ``Read`` (the readings, the time), ``Mended``
(the rungs that ran, the time), ``Stopped``. Effects: ``ReadAt`` (read these sources at
that time), ``Mend`` (these sources do their rung) or one ``Verdict``.

Between commands the display is watched (``DisplayState``): a TV switched off by hand, a
cable pulled, DPMS asleep. The same sources are read every ``[screen] display_every_s``
and soon after each DRM hotplug; the readings say one state (``display_state``), and a
change of it is told once (``DisplayChanged``). A reading that cannot tell keeps the
state it had: a source that fails now and then makes no news.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generator, Protocol

ON, OFF = "on", "off"
STATES = (ON, OFF)
DISCONNECTED, UNKNOWN = "disconnected", "unknown"
DISPLAY_STATES = (ON, OFF, DISCONNECTED, UNKNOWN)   # what the watch says of the display
MAX_WHY = 300        # what a result's ``why`` keeps
# DRM's word for a card whose every connector is unplugged (the doctor fails on it)
NO_CONNECTOR_CONNECTED = "no connector is connected"
HOTPLUG_SETTLE_S = 1.0   # after a hotplug the display is read this much later: the burst
                         # of udev events one plug makes is one read, its state settled


@dataclass(frozen=True)
class Reading:
    """What one source read of the display's state, in its own words."""
    source: str              # "DRM", "X11 DPMS", "Wayland", "CEC"
    state: str | None        # ON, OFF, or None: what it read does not tell
    said: str                # what it read ("Off"), or why it could not
    present: bool = True     # False: this screen has no such source; not read again


@dataclass(frozen=True)
class Asked:
    """The display was asked for a state (event)."""
    state: str
    now: float


@dataclass(frozen=True)
class Read:
    """The sources were read (event)."""
    readings: tuple
    now: float


@dataclass(frozen=True)
class Mended:
    """The mending rungs ran (event)."""
    rungs: tuple             # what each rung did, in words ("X11 DPMS force on")
    now: float


@dataclass(frozen=True)
class Stopped:
    """The turn ended early (event)."""
    why: str


@dataclass(frozen=True)
class ReadAt:
    """Read these sources at this time (effect)."""
    at: float
    sources: tuple


@dataclass(frozen=True)
class Mend:
    """Mend these sources (effect)."""
    sources: tuple


@dataclass(frozen=True)
class Verdict:
    """Whether the state asked for is confirmed, by which readings, or why not."""
    state: str                   # what was asked
    confirmed: bool
    by: tuple = ()               # the readings that confirm it
    why: str = ""                # unconfirmed: why, in words
    contrary: bool = False       # unconfirmed: a source read the other state at the end
    retried: tuple = ()          # the rungs of the one retry, if it came to that

    def said(self) -> str:
        """"confirmed by X11 DPMS (Off)" or "unconfirmed: why"."""
        if self.confirmed:
            return "confirmed by " + ", ".join(f"{r.source} ({r.said})" for r in self.by) \
                + (f" after a retry ({', '.join(self.retried)})" if self.retried else "")
        return f"unconfirmed: {self.why}"

    def fields(self) -> dict:
        """What a command's result and an event carry."""
        retried = {"retried": list(self.retried)} if self.retried else {}
        if self.confirmed:
            return {"confirmed": True, "confirmed_by": [r.source for r in self.by],
                    "read": "; ".join(f"{r.source}: {r.said}" for r in self.by)[:MAX_WHY],
                    **retried}
        return {"confirmed": False, "why": self.why, **retried}


FAILED, DONE, CONFIRMED, UNCONFIRMED = "failed", "done", "confirmed", "unconfirmed"


def not_configured(state: str) -> str:
    """Why the display cannot be turned ``state`` here."""
    return f"no display_{state}_command configured ([commands] in agent.toml)"


@dataclass(frozen=True)
class Turned:
    """What turning the display gave (its one owner, agent/screen/power.py): ``failed``
    (the command did not run, or failed: ``error`` says why, never its command line),
    ``done`` (it ran, and nothing here reads the display back), ``confirmed`` or
    ``unconfirmed`` (it ran and was read back: ``read``, the Verdict)."""
    state: str                   # what was asked
    error: str = ""
    read: Verdict | None = None

    @property
    def outcome(self) -> str:
        if self.error:
            return FAILED
        if self.read is None:
            return DONE
        return CONFIRMED if self.read.confirmed else UNCONFIRMED

    @property
    def ok(self) -> bool:
        """The display is as asked, as far as anything here can tell."""
        return self.outcome in (DONE, CONFIRMED)

    def said(self) -> str:
        """"display off: confirmed by DRM (...)", "display on", or why it failed."""
        if self.error:
            return self.error
        return f"display {self.state}" + (f": {self.read.said()}" if self.read else "")

    def fields(self) -> dict:
        """What a command's result and an event carry of the read-back."""
        return self.read.fields() if self.read is not None else {}


class Power(Protocol):
    """What a part that turns the display on or off asks of the screen part, the
    display's one owner (agent/screen/power.py): ``turn`` runs the configured command
    and reads the display back, one turn at a time, within ``bound_s`` seconds at most
    (one turn it waits behind included). ``scheduled``: the working hours' turn (see
    power.py). ``schedule(wanted)``: the working hours say what they want now (on,
    off, or None: no clock to trust yet)."""

    bound_s: float

    def turn(self, state: str, *, scheduled: bool = False) -> Turned: ...

    def turning(self, state: str, *, scheduled: bool = False) -> Generator[Any, Any, Turned]:
        """The same turn as a job (base/steps.py): for a thread that drives it a look
        at a time and serves other work between its looks (the commands thread)."""

    def schedule(self, wanted: str | None) -> None: ...


def _listed(readings) -> str:
    return "; ".join(f"{r.source}: {r.said}" for r in readings)


class ReadBack:
    """One read-back: a new one for each display command."""

    def __init__(self, every_s: dict[str, float], settle_s: float, menders: tuple = ()):
        """``every_s``: each source's name and how often it may be read; ``menders``:
        the sources that have a rung to retry with."""
        self.every_s = dict(every_s)
        self.settle_s = settle_s
        self.menders = tuple(menders)
        self.retried: tuple = ()     # the rungs of the retry, once it ran
        self.mending = False         # the retry was asked for: never a second one
        self.state = ON
        self.deadline = 0.0
        self.live: list[str] = []
        self.last: dict[str, Reading] = {}
        self.due: dict[str, float] = {}
        self.done: Verdict | None = None

    def handle(self, event) -> list:
        if self.done is not None:
            return [self.done]
        if isinstance(event, Asked):
            if event.state not in STATES:
                raise ValueError(f"state: {event.state!r}")
            self.state, self.deadline = event.state, event.now + self.settle_s
            self.live = list(self.every_s)
            self.due = {name: event.now for name in self.live}
            if not self.live:
                return self._end(False, why="no source to read the display from")
            return [ReadAt(event.now, tuple(self.live))]
        if isinstance(event, Stopped):
            return self._end(False, why=f"not read back: {event.why}")
        if isinstance(event, Read):
            return self._read(event)
        if isinstance(event, Mended) and self.mending and not self.retried:
            self.retried = tuple(event.rungs)
            self.deadline = event.now + self.settle_s
            self.due = {name: event.now for name in self.live}
            return [ReadAt(event.now, tuple(self.live))]
        raise TypeError(f"not an input of the read-back: {event!r}")

    def _read(self, event: Read) -> list:
        for r in event.readings:
            self.last[r.source] = r
            if r.source in self.due:
                self.due[r.source] = event.now + self.every_s[r.source]
            if not r.present and r.source in self.live:
                self.live.remove(r.source)
        current = [self.last[name] for name in self.live if name in self.last]
        ons = [r for r in current if r.state == ON]
        offs = [r for r in current if r.state == OFF]
        if self.state == OFF and offs:
            return self._end(True, by=tuple(offs))
        if self.state == ON and ons and not offs:
            return self._end(True, by=tuple(ons))
        if not self.live:
            return self._end(False, why="nothing here reads the display: "
                                        + _listed(self.last.values()))
        if event.now >= self.deadline:
            # on: one layer off leaves the screen dark. Off: a layer on proves the screen
            # lit only when no other layer it passes through is left untold (a TV that
            # does not answer over CEC may be in standby under a live HDMI signal)
            against = offs if self.state == ON else (
                ons if len(ons) == len(self.live) else [])
            menders = tuple(name for name in self.menders if name in self.live)
            if self.state == ON and against and menders and not self.mending:
                self.mending = True
                return [Mend(menders)]
            if against:
                again = f", and again after a retry ({', '.join(self.retried)})" \
                    if self.retried else ""
                return self._end(False, contrary=True, why=(
                    f"the display reads {OFF if self.state == ON else ON} "
                    f"{self.settle_s:g} s after it was turned {self.state}{again}: "
                    + _listed(against)))
            return self._end(False, why=f"no source read {self.state} within "
                                        f"{self.settle_s:g} s: " + _listed(current))
        nxt = min(min(self.due[name] for name in self.live), self.deadline)
        if nxt >= self.deadline:   # the last look: every source once more
            return [ReadAt(self.deadline, tuple(self.live))]
        return [ReadAt(nxt, tuple(name for name in self.live if self.due[name] <= nxt))]

    def _end(self, confirmed: bool, by: tuple = (), why: str = "",
             contrary: bool = False) -> list:
        self.done = Verdict(self.state, confirmed, by, why[:MAX_WHY], contrary,
                            self.retried)
        return [self.done]


# -- the display watched between commands ------------------------------------------------
def display_state(readings) -> str:
    """What the readings say of the display as a whole: ``disconnected`` where DRM has
    connectors and none is connected (a cable pulled, a TV whose HDMI is down); ``off``
    where any layer reads off (a TV in standby shows nothing whatever the signal does);
    ``on`` where one reads on and none off; else ``unknown``."""
    present = [r for r in readings if r.present]
    if any(r.source == "DRM" and r.said == NO_CONNECTOR_CONNECTED for r in present):
        return DISCONNECTED
    states = {r.state for r in present}
    return OFF if OFF in states else ON if ON in states else UNKNOWN


@dataclass(frozen=True)
class DisplayChanged:
    """The display's state changed, from what, as its sources read it."""
    state: str               # on, off, disconnected
    was: str
    read: str                # what each source read, in its words


class DisplayState:
    """The display's state between commands: when to read it, and what is news."""

    def __init__(self, every_s: float):
        self.every_s = every_s
        self.state: str | None = None      # the last state a reading told; None: none yet
        self.since: float | None = None    # when it became that
        self.read = ""                     # what the last reading said
        self.state_read = ""               # ... and the one that found the state
        self.checked_at: float | None = None
        self.due = 0.0                     # the next read: at once

    def hotplug(self, now: float) -> None:
        """A DRM connector changed: read it again soon, once for the whole burst."""
        self.due = min(self.due, now + HOTPLUG_SETTLE_S)

    def handle(self, event: Read) -> list:
        self.checked_at, self.due = event.now, event.now + self.every_s
        self.read = _listed(r for r in event.readings if r.present)[:MAX_WHY] \
            or "no source reads the display here"
        state = display_state(event.readings)
        if state == UNKNOWN or state == self.state:
            return []
        was, self.state, self.since, self.state_read = self.state, state, event.now, self.read
        if was is None:
            return []   # the first reading: what the display is, no change
        return [DisplayChanged(state, was, self.read)]
