"""The picture check's thread: every ``[screen] picture_every_s`` it asks whether the
display is meant to be dark, and if not captures the screen (capture.py: every row
folded into a thumbnail, its brightest pixel, its rows' checksums) and hands the judge
(picture.py) what that measures.

What the judge decides goes out as events (``screen.black``, ``screen.frozen``,
``screen.ok``, ``screen.check_failed``), to ``on_verdict`` (the recovery ladder listens),
and, where ``[screen] upload_pictures`` is on, as the thumbnail queued for upload when
the picture turns black or frozen. Nothing is written to the card: the picture lives in
memory for the length of one check.

The thread is a Loop on the watchdog gate, as the working hours' is: it waits in slices
of at most SLICE_S and ticks at each, and one check is bounded by the capture's timeout.
A screen found black or frozen is looked at again every BAD_EVERY_S (not every
``picture_every_s``, 15 min by default for the check's cost): the recovery ladder's
second sample and its proof after a rung come within a minute, as they did.
A screen with no way to capture is said once and asked again every ABSENT_EVERY_S.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from ..base.upload_kinds import SCREENSHOT
from ..config.model import Commands, Screen as ScreenSection
from ..events.model import Event
from ..runtime.loop import Loop
from ..runtime.watchdog_gate import WatchdogGate
from . import capture as capturing
from .picture import BLACK, FROZEN, Changed, CheckFailed, Checked, Dark, Failed, Judge, measure
from .service import x_display_of

log = logging.getLogger("edge_agent.screen")

SLICE_S = 30.0          # the longest wait between two ticks of the gate
ABSENT_EVERY_S = 900.0  # no capture tool, no Pillow: looked for again this rarely
BAD_EVERY_S = 60.0      # a black or frozen screen: looked at again this often
MARGIN_S = 30.0


class PictureWatch:
    def __init__(self, capture: capturing.Capture, judge: Judge, every_s: float, *,
                 dark: Callable[[], str | None], publish: Callable[[Event], None],
                 enqueue: Callable[[str, bytes], object] | None = None,
                 on_verdict: Callable[[str], None] | None = None,
                 upload_pictures: bool = False, gate: WatchdogGate | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        """``dark()``: why the display is off by schedule or command ("off by working
        hours"), or None; while it says so nothing is captured. ``enqueue(kind, data)``
        queues an upload; ``on_verdict(name)`` hears the verdict at each look (ok, black, frozen,
        dark)."""
        self.capture, self.judge, self.every_s = capture, judge, every_s
        self.dark, self.publish = dark, publish
        self.enqueue, self.on_verdict = enqueue, on_verdict
        self.upload_pictures = upload_pictures
        self.clock, self.wall = clock, wall
        self.absent: str | None = None     # why this screen cannot be captured
        self.checks = 0
        self.uploads = 0
        self._stop = threading.Event()
        self.loop = Loop("picture", self._run, gate=gate,
                         max_silence_s=SLICE_S + capture.timeout_s + MARGIN_S,
                         pause=self._stop.wait, stopping=self._stop.is_set)

    def start(self) -> None:
        """The thread, where the check is on (``picture_every_s`` above 0)."""
        if self.every_s > 0:
            self.loop.start()

    def stop(self) -> None:
        """From any thread: a capture running is killed, the thread ends."""
        self._stop.set()
        self.capture.stop()

    def join(self, timeout: float | None = None) -> None:
        self.loop.join(timeout)

    def check(self) -> float:
        """One check; returns how long to wait before the next."""
        why_dark = self.dark()
        if why_dark:
            self._apply(self.judge.handle(Dark(why_dark, self.clock())), None, seen=True)
            return self.every_s
        shot = self.capture.take()
        self.checks += 1
        why_dark = self.dark()   # turned off while it was captured: not judged
        if why_dark:
            self._apply(self.judge.handle(Dark(why_dark, self.clock())), None, seen=True)
            return self.every_s
        if shot.absent:
            if shot.why != self.absent:
                log.info("picture check: %s", shot.why)   # a screen without one: not a fault
            self.absent = shot.why
            return max(self.every_s, ABSENT_EVERY_S)
        self.absent = None
        if shot.picture is None:
            self._apply(self.judge.handle(Failed(shot.why, self.clock())), None, seen=False)
        else:
            self._apply(self.judge.handle(Checked(measure(shot.picture), self.clock())),
                        shot.picture, seen=True)
        if self.judge.verdict in (BLACK, FROZEN):
            return min(self.every_s, BAD_EVERY_S)
        return self.every_s

    def snapshot(self) -> dict:
        """For the status: the verdict and its age, the last look, how, what it measured."""
        now, judge = self.clock(), self.judge
        age = (lambda t: None if t is None else round(now - t, 1))
        last = judge.last
        return {"verdict": "off" if self.every_s <= 0 else
                ("unavailable" if self.absent and judge.verdict is None else judge.verdict),
                "since_s": age(judge.since), "checked_s_ago": age(judge.checked_at),
                "every_s": self.every_s, "captured_by": self.capture.how,
                "mean": None if last is None else round(last.mean, 1),
                "contrast": None if last is None else round(last.contrast, 1),
                "bright": None if last is None else last.bright,
                "still_for_s": round(judge.still_for(now)) if judge.content_moves else None,
                "dark": judge.dark_why if judge.verdict == "dark" else None,
                "unavailable": self.absent, "failures": judge.failures,
                "failure": judge.failure, "uploads": self.uploads}

    # -- internals -----------------------------------------------------------------
    def _run(self) -> None:
        """The loop's body; a bug in a check raises out of it, and supervise.py restarts
        it after a backoff, seen in the journal."""
        self.loop.every(self.check, stop=self._stop, slice_s=SLICE_S)

    def _apply(self, effects: list, picture, *, seen: bool) -> None:
        """``seen``: the screen was looked at (or is meant dark): the verdict, told or
        not, is a sample for ``on_verdict`` (the ladder acts on a state that persists)."""
        for effect in effects:
            if isinstance(effect, CheckFailed):
                log.warning("picture check: the capture failed (%d so far): %s",
                            effect.failures, effect.why)
                self.publish(Event("screen.check_failed", self.wall(),
                                   {"why": effect.why, "failures": effect.failures,
                                    "captured_by": self.capture.how}))
            elif isinstance(effect, Changed):
                self._changed(effect, picture)
        if seen and self.on_verdict is not None and self.judge.verdict is not None:
            self.on_verdict(self.judge.verdict)

    def _changed(self, change: Changed, picture) -> None:
        if change.news:
            (log.info if change.verdict not in (BLACK, FROZEN) else log.warning)(
                "picture check: the screen is %s (was %s): %s", change.verdict,
                change.was or "not judged yet", change.details)
            self.publish(Event(f"screen.{change.verdict}", self.wall(),
                               {**change.details, "was": change.was,
                                "captured_by": self.capture.how}))
            if change.verdict in (BLACK, FROZEN) and self.upload_pictures \
                    and self.enqueue is not None and picture is not None:
                self.enqueue(SCREENSHOT, capturing.png_of(picture))
                self.uploads += 1


def from_config(section: ScreenSection, commands: Commands, environ: dict, *,
                dark: Callable[[], str | None], publish: Callable[[Event], None],
                enqueue: Callable[[str, bytes], object] | None = None,
                on_verdict: Callable[[str], None] | None = None,
                gate: WatchdogGate | None = None,
                temp_dir: str | None = None) -> PictureWatch:
    """The picture check as ``[screen]`` sets it; started only where picture_every_s > 0.
    ``temp_dir``: a tmpfs the capture tool's temporary files go to (the agent's runtime
    directory; default /dev/shm)."""
    capture = capturing.choose(section.capture_command,
                               x_display_of(section, commands, environ), environ,
                               temp_dir=temp_dir)
    judge = Judge(section.black_luma, section.black_contrast, section.content_moves,
                  section.frozen_after_s)
    return PictureWatch(capture, judge, section.picture_every_s, dark=dark, publish=publish,
                        enqueue=enqueue, on_verdict=on_verdict,
                        upload_pictures=section.upload_pictures, gate=gate)
