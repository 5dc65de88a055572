"""The display's state read back after a display command: the shell around core.py.

``reading_back(state)`` is part of the display's turn (power.py), a job (base/steps.py)
driven by the turning thread (a look at a time by the commands thread; whole by the
working hours' and the mender's, ``read_back(state)``): it reads the sources
(sources.py) when the core says, waits between reads (ended at once by ``stop()``),
and returns the core's Verdict, within ``bound_s``. Nothing is written anywhere; one read-back shares nothing with another but
the runner that ``stop()`` ends.

Where X11 is asked: ``[screen] x_display``; unset, the display the configured display
commands name (``xset -display :0 ...``, ``env DISPLAY=:0 ...``: what they turned off
is what is read); else the agent's ``DISPLAY``.
"""
from __future__ import annotations

import logging
import shlex
import threading
import time
from typing import Callable, Iterable

from ..base.steps import Job, Until, drive
from ..config.model import Commands, Screen as ScreenSection
from .core import Asked, Mend, Mended, Read, ReadAt, ReadBack, Stopped, Verdict
from .sources import READ_TIMEOUT_S, Cec, Drm, Runner, Wayland, X11Dpms

log = logging.getLogger("edge_agent.screen")


class Screen:
    def __init__(self, sources: list, settle_s: float, runner: Runner | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.sources = {source.name: source for source in sources}
        self.settle_s = settle_s
        self.runner = runner
        self.clock = clock
        self._stop = threading.Event()
        self._last: tuple[Verdict, float] | None = None   # the last verdict, and when
        self.menders = tuple(name for name, s in self.sources.items() if hasattr(s, "mend"))
        # twice (the retry): the settle, a round of reads begun just before its end, and
        # the last look (Wayland's may be two runs of wlr-randr); the rungs between
        self.bound_s = 2 * (settle_s + 2 * (len(self.sources) + 1) * READ_TIMEOUT_S) \
            + 4 * len(self.menders) * READ_TIMEOUT_S

    def read_back(self, state: str) -> Verdict:
        return drive(self.reading_back(state))

    def reading_back(self, state: str) -> Job:
        """The read-back as a job (base/steps.py): its waits and its programs' runs
        yielded, for the thread that drives it; the Verdict its result."""
        core = ReadBack({name: s.every_s for name, s in self.sources.items()}, self.settle_s,
                        self.menders)
        effects = core.handle(Asked(state, self.clock()))
        while isinstance(effects[0], (ReadAt, Mend)):
            if isinstance(effects[0], Mend):
                rungs = []
                for name in effects[0].sources:
                    rungs.append((yield from _steps(self.sources[name], "mend")))
                log.warning("display %s: not reached, retried once: %s", state,
                            "; ".join(rungs))
                effects = core.handle(Mended(tuple(rungs), self.clock()))
                continue
            at = effects[0].at
            while not self._stop.is_set() and self.clock() < at:
                yield Until(at, self.clock, self._stop)
            if self._stop.is_set():
                effects = core.handle(Stopped("the agent is stopping"))
                break
            readings = []
            for name in effects[0].sources:
                readings.append((yield from _steps(self.sources[name], "read")))
            effects = core.handle(Read(tuple(readings), self.clock()))
        verdict = effects[0]
        self._last = (verdict, self.clock())
        (log.warning if verdict.contrary else log.info)("display %s: %s", state,
                                                          verdict.said())
        return verdict

    def snapshot(self) -> dict | None:
        """For status: the last read-back, how it was confirmed, and how long ago."""
        if self._last is None:
            return None
        verdict, at = self._last
        return {"asked": verdict.state, "confirmed": verdict.confirmed,
                "said": verdict.said(), "age_s": round(self.clock() - at, 1)}

    def stop(self) -> None:
        """From any thread, on the agent's way out: a read-back ends now, unconfirmed."""
        self._stop.set()
        if self.runner is not None:
            self.runner.stop()


def _steps(source, what: str) -> Job:
    """A source's read or mend as steps, where it has them (a program to run); else
    done at once: DRM's few sysfs attributes (a test's source)."""
    stepwise = getattr(source, {"read": "reading", "mend": "mending"}[what], None)
    if stepwise is None:
        return getattr(source, what)()
    return (yield from stepwise())


def display_in(commands: Iterable[str | None]) -> str | None:
    """The X display a configured command names: ``-display :0`` or ``DISPLAY=:0``."""
    for command in commands:
        try:
            words = shlex.split(command or "")
        except ValueError:
            continue
        for i, word in enumerate(words):
            if word == "-display" and i + 1 < len(words) and ":" in words[i + 1]:
                return words[i + 1]
            if word.startswith("DISPLAY=") and len(word) > len("DISPLAY="):
                return word.split("=", 1)[1]
    return None


def x_display_of(section: ScreenSection, commands: Commands, environ: dict) -> str | None:
    """The X display this screen is read (and captured) on, as the module's doc says."""
    return (section.x_display
            or display_in((commands.display_off_command, commands.display_on_command))
            or environ.get("DISPLAY"))


def sources_of(section: ScreenSection, commands: Commands, *, sysfs_root: str,
               environ: dict, runner: Runner) -> list:
    """Every source this screen's display is read from, each program run by ``runner``."""
    x_display = x_display_of(section, commands, environ)
    path = environ.get("PATH")
    return [Drm(sysfs_root), X11Dpms(x_display, runner, path), Wayland(environ, runner),
            Cec(section.cec_device, runner, path)]


def from_config(section: ScreenSection, commands: Commands, *, sysfs_root: str,
                environ: dict) -> Screen:
    runner = Runner()
    return Screen(sources_of(section, commands, sysfs_root=sysfs_root, environ=environ,
                             runner=runner), section.settle_s, runner)
