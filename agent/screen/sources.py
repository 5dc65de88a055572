"""Where the display's state is read from: each source one bounded read, told as a
core.Reading (on, off, or cannot tell, in the source's own words).

- DRM: each connected connector's ``dpms`` and ``enabled`` in sysfs (a few bytes each,
  read bounded); no connector at all is no source.
- X11 DPMS: ``xset -display D q`` ("Monitor is Off"); no display to ask, or no xset,
  is no source.
- Wayland: ``wlr-randr --json`` (each output's ``enabled``; its text form where the
  installed wlr-randr has no --json); no ``WAYLAND_DISPLAY`` or no wlr-randr is no source.
- CEC: ``cec-ctl -d DEV --to 0 --give-device-power-status`` (the TV's ``pwr-state``);
  no adapter or no cec-ctl is no source.

The sources that can wake a display asked on that still reads off have one rung each
(``mend()``, run once by the core's retry): X11, DPMS forced on; Wayland, each output
that reads disabled enabled again; CEC, the TV woken (Image View On) and switched to
this input (Active Source).

A program runs through base/children.py: its own session, a bound, its group killed at
the bound or when the agent stops, a failure told without its command line.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import threading
from typing import Callable

from ..base import children
from ..base.fsutil import read_bounded
from ..base.steps import Job, Program, drive
from .core import NO_CONNECTOR_CONNECTED, OFF, ON, Reading

READ_TIMEOUT_S = 5.0     # one source's read, at most (cec-ctl waits on the TV's answer)
MAX_ATTRIBUTE = 64       # a sysfs attribute's bytes
# cec-ctl's adapter status: "Physical Address              : 1.0.0.0"
PHYSICAL_ADDRESS = re.compile(r"Physical Address\s*:\s*([0-9a-f]\.[0-9a-f]\.[0-9a-f]\.[0-9a-f])")


class Runner:
    """Runs a source's program, bounded; ``stop()`` from any thread kills the one
    running and refuses the next."""

    def __init__(self, timeout_s: float = READ_TIMEOUT_S,
                 refused: str = "not read: the agent is stopping"):
        self.timeout_s, self.refused = timeout_s, refused
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen] = set()
        self._stopping = False

    def __call__(self, argv: list[str], env: dict | None = None) -> tuple[bytes | None, str]:
        """(stdout, "") when it exited 0, else (None, why in children.failure's words);
        the exit status aside, a program that printed its answer is read (stdout, why)."""
        started = self.start(argv, env)
        return started if isinstance(started, tuple) else started.wait()

    def start(self, argv: list[str], env: dict | None = None):
        """The same run, a children.Started to look at now and then (base/steps.py), or
        the answer at once when it cannot start."""
        try:
            with self._lock:
                if self._stopping:
                    return None, self.refused
                child = children.spawn(argv, env=env)
                self._running.add(child)
        except OSError as e:
            return None, children.failure(argv, error=e)
        except ValueError as e:   # a NUL byte in an argument
            return None, f"{children.program(argv)}: cannot be run ({e})"

        def ended(started: children.Started) -> None:
            with self._lock:
                self._running.discard(started.child)
        return children.Started(child, argv, self.timeout_s, ended)

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            running = list(self._running)
        for child in running:
            children.kill_group(child)


def _absent(source: str, why: str) -> Reading:
    return Reading(source, None, why, present=False)


class Drm:
    name = "DRM"
    every_s = 0.5

    def __init__(self, sysfs_root: str = "/sys"):
        self.sysfs_root = sysfs_root

    def _attribute(self, connector: str, name: str) -> str:
        try:
            return read_bounded(os.path.join(connector, name), MAX_ATTRIBUTE).decode(
                "ascii", "replace").strip()
        except (OSError, ValueError):
            return ""

    def read(self) -> Reading:
        found = sorted(glob.glob(os.path.join(self.sysfs_root, "class/drm/card*-*")))
        if not found:
            return _absent(self.name, "no DRM connector in sysfs")
        states, said = set(), []
        for path in found:
            if self._attribute(path, "status") != "connected":
                continue
            dpms, enabled = self._attribute(path, "dpms"), self._attribute(path, "enabled")
            if enabled == "disabled" or dpms in ("Off", "Standby", "Suspend"):
                states.add(OFF)
            elif dpms == "On" and enabled in ("enabled", ""):
                states.add(ON)
            else:
                states.add(None)
            shown = ", ".join(x for x in (enabled, dpms) if x) or "?"
            said.append(f"{os.path.basename(path)} {shown}")
        if not said:
            return Reading(self.name, None, NO_CONNECTOR_CONNECTED)
        state = states.pop() if len(states) == 1 else None
        return Reading(self.name, state, "; ".join(said))


class X11Dpms:
    name = "X11 DPMS"
    every_s = 0.5

    def __init__(self, display: str | None, run: Callable, path: str | None = None):
        self.display, self.run, self.path = display, run, path

    def read(self) -> Reading:
        return drive(self.reading())

    def reading(self) -> Job:
        if not self.display:
            return _absent(self.name, "no X display to ask ([screen] x_display, DISPLAY)")
        xset = shutil.which("xset", path=self.path)
        if xset is None:
            return _absent(self.name, "xset is not installed (x11-xserver-utils)")
        out, why = yield Program(self.run, [xset, "-display", self.display, "q"])
        if why:
            return Reading(self.name, None, why)
        return self.parse(out.decode(errors="replace"))

    def mend(self) -> str:
        return drive(self.mending())

    def mending(self) -> Job:
        xset = shutil.which("xset", path=self.path) or "xset"
        _, why = yield Program(self.run, [xset, "-display", self.display or "", "dpms", "force",
                                      "on"])
        return "DPMS force on" + (f" failed: {why}" if why else "")

    @classmethod
    def parse(cls, text: str) -> Reading:
        m = re.search(r"Monitor is (?:in )?(On|Off|Standby|Suspend|Unknown State)", text)
        if m:
            word = m.group(1)
            return Reading(cls.name, ON if word == "On" else None if word.startswith(
                "Unknown") else OFF, word)
        if "DPMS is Disabled" in text:   # nothing can have put it to sleep
            return Reading(cls.name, ON, "DPMS disabled")
        return _absent(cls.name, "the X server has no DPMS")


class Wayland:
    name = "Wayland"
    every_s = 0.5

    def __init__(self, env: dict, run: Callable):
        self.env, self.run = env, run
        self.disabled: list[str] = []   # the outputs the last read found disabled

    def read(self) -> Reading:
        return drive(self.reading())

    def reading(self) -> Job:
        if not self.env.get("WAYLAND_DISPLAY"):
            return _absent(self.name, "WAYLAND_DISPLAY is not set")
        tool = shutil.which("wlr-randr", path=self.env.get("PATH"))
        if tool is None:
            return _absent(self.name, "wlr-randr is not installed")
        out, why = yield Program(self.run, [tool, "--json"], dict(self.env))
        if why and out is not None and not out.strip():   # a wlr-randr without --json
            out, why = yield Program(self.run, [tool], dict(self.env))
            if why:
                return Reading(self.name, None, why)
            outputs = self.outputs_in_text(out.decode(errors="replace"))
        elif why:
            return Reading(self.name, None, why)
        else:
            try:
                outputs = [(str(o["name"]), bool(o["enabled"]),
                            _sized([(m["width"], m["height"]) for m in o.get("modes", ())]))
                           for o in json.loads(out)]
            except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
                return Reading(self.name, None, "wlr-randr's JSON is not a list of outputs")
        self.disabled = [name for name, on, sized in outputs if not on and sized]
        return self._judge(outputs)

    def mend(self) -> str:
        return drive(self.mending())

    def mending(self) -> Job:
        tool = shutil.which("wlr-randr", path=self.env.get("PATH")) or "wlr-randr"
        done = []
        for name in self.disabled[:4]:
            _, why = yield Program(self.run, [tool, "--output", name, "--on"], dict(self.env))
            done.append(f"output {name} enabled again" + (f" failed: {why}" if why else ""))
        return "; ".join(done) or "no output to enable"

    @staticmethod
    def outputs_in_text(text: str) -> list[tuple[str, bool, bool]]:
        """(name, enabled, sized) of each output in wlr-randr's text (0.2's and later's:
        a name line, then indented ``Enabled:`` and ``Modes:`` with a ``WxH px`` line a
        mode)."""
        heads: dict[str, list] = {}
        name = None
        for line in text.splitlines():
            if line and not line[0].isspace():
                name = line.split()[0]
                heads[name] = [None, []]
            elif name is None:
                continue
            elif line.strip().startswith("Enabled:"):
                heads[name][0] = line.split(":", 1)[1].strip() == "yes"
            elif (m := _MODE.match(line)) is not None:
                heads[name][1].append((int(m.group(1)), int(m.group(2))))
        return [(n, on, _sized(modes)) for n, (on, modes) in heads.items() if on is not None]

    @classmethod
    def parse_text(cls, text: str) -> Reading:
        return cls._judge(cls.outputs_in_text(text))

    @classmethod
    def _judge(cls, outputs: list[tuple[str, bool, bool]]) -> Reading:
        """On, off, or cannot tell. An output that reads disabled with modes all of 0x0
        cannot be told: a wlroots 0.15 compositor (bookworm's sway 1.7) says that of
        every output of a custom size (headless, nested, virtual) whatever it shows, and
        a real connector has the sizes its EDID gives."""
        if not outputs:
            return Reading(cls.name, None, "no output")
        said, states = [], set()
        for name, on, sized in outputs:
            if on or sized:
                said.append(f"{name} {'enabled' if on else 'disabled'}")
                states.add(ON if on else OFF)
            else:
                said.append(f"{name} reads disabled with no mode of any size: cannot tell")
                states.add(None)
        state = states.pop() if len(states) == 1 else None
        return Reading(cls.name, state, "; ".join(said)[:200])


_MODE = re.compile(r"\s+(\d+)x(\d+) px")   # wlr-randr's text: "    1920x1080 px, 60.0 Hz"


def _sized(modes: list) -> bool:
    """Whether an output's modes say its size: none listed, or one not 0x0."""
    return not modes or any(int(w) > 0 and int(h) > 0 for w, h in modes)


class Cec:
    name = "CEC"
    every_s = 2.0     # a question on the CEC bus each time: not flooded

    def __init__(self, device: str, run: Callable, path: str | None = None):
        self.device, self.run, self.path = device, run, path

    def read(self) -> Reading:
        return drive(self.reading())

    def reading(self) -> Job:
        tool = shutil.which("cec-ctl", path=self.path)
        if tool is None:
            return _absent(self.name, "cec-ctl is not installed (v4l-utils)")
        if not os.path.exists(self.device):
            return _absent(self.name, f"no CEC adapter ({self.device})")
        out, why = yield Program(self.run, [tool, "-d", self.device, "--to", "0",
                                        "--give-device-power-status"])
        if out is None:
            return Reading(self.name, None, why)
        return self.parse(out.decode(errors="replace"), why)

    def mend(self) -> str:
        """The TV woken and shown this input: Image View On to the TV, then Active
        Source with this adapter's physical address (as `cec-ctl -d DEV` shows it) to
        every device, which switches a TV left on another input."""
        return drive(self.mending())

    def mending(self) -> Job:
        tool = shutil.which("cec-ctl", path=self.path) or "cec-ctl"
        _, why = yield Program(self.run, [tool, "-d", self.device, "--to", "0", "--image-view-on"])
        if why:
            return f"CEC Image View On failed: {why}"
        out, why = yield Program(self.run, [tool, "-d", self.device])
        m = PHYSICAL_ADDRESS.search(out.decode(errors="replace")) if out is not None else None
        if m is None:
            return "CEC Image View On; no Active Source: " + (why or "no physical address")
        _, why = yield Program(self.run, [tool, "-d", self.device, "--to", "15", "--active-source",
                                      f"phys-addr={m.group(1)}"])
        return "CEC Image View On, Active Source" + (f" failed: {why}" if why else "")

    @classmethod
    def parse(cls, text: str, why: str = "") -> Reading:
        m = re.search(r"pwr-state:\s*([a-z-]+)", text)
        if m is None:
            lines = text.strip().splitlines()
            return Reading(cls.name, None, why or "the TV gave no power status"
                           + (f" ({lines[-1].strip()[:100]})" if lines else ""))
        word = m.group(1)
        return Reading(cls.name, {"on": ON, "standby": OFF}.get(word), word)
