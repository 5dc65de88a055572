"""The screen's truth, assembled: what the daemon builds from ``[screen]`` and wires.

- the display's state read back after every on/off (service.py), for the ``display``
  command and the working hours; a display command's verdict is also an event,
  ``display.read_back`` (the hours tell theirs in ``display.scheduled``);
- the picture checked black, frozen or ok (watch.py), never while the display is meant
  to be dark: off by working hours, or last turned off by a display command;
- the player unit watched and the recovery ladder (mender.py), which hears each
  picture verdict;
- the screen's controls for restart-player, brightness, volume and poweroff
  (controls.py), each read back.

Each is built only where this screen has a use for it; ``snapshot()`` is the status
document's ``screen``.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from ..config.model import Config
from ..events.model import Event
from ..runtime.threads import start_worker
from ..runtime.watchdog_gate import WatchdogGate
from . import controls as controlling, mender as mending, service, watch
from .core import Verdict

log = logging.getLogger("edge_agent.screen")


class CommandDisplay:
    """The read-back as the display command sees it: the verdict, also told as an event."""

    def __init__(self, display: service.Screen, publish: Callable[[Event], None]):
        self.display, self.publish = display, publish
        self.bound_s = display.bound_s

    def read_back(self, state: str) -> Verdict:
        verdict = self.display.read_back(state)
        self.publish(Event("display.read_back", time.time(),
                           {"state": state, **verdict.fields()}))
        return verdict


class ScreenPart:
    def __init__(self, display: service.Screen | None, picture: watch.PictureWatch | None,
                 publish: Callable[[Event], None]):
        self.display = display          # the hours' read-back
        self.command_display = CommandDisplay(display, publish) if display else None
        self.picture = picture
        self.controls: controlling.Controls | None = None
        self.mender: mending.Mender | None = None

    def dark(self, scheduled_off: Callable[[], bool]) -> str | None:
        """Why the display is meant to be dark now, or None."""
        if scheduled_off():
            return "off by working hours"
        if self.display is not None and self.display.asked == "off":
            return "turned off by a display command"
        return None

    def start(self) -> None:
        if self.mender is not None:
            self.mender.start()
        if self.picture is not None:
            self.picture.start()
        if self.controls is not None:   # what the server is told this screen can do
            start_worker("screen-means", self.controls.probe, reason="the screen's means probed")

    def means(self) -> frozenset | None:
        """The screen's commands it has the means for, as last probed; None: no controls."""
        return self.controls.known() if self.controls is not None else None

    def stop(self) -> None:
        """From any thread: a read-back or a capture in progress ends now."""
        if self.display is not None:
            self.display.stop()
        if self.picture is not None:
            self.picture.stop()
        if self.controls is not None:
            self.controls.stop()
        if self.mender is not None:
            self.mender.stop()

    def join(self, timeout: float | None = None) -> None:
        for loop in (self.picture, self.mender):
            if loop is not None:
                loop.join(timeout)

    def snapshot(self) -> dict | None:
        doc = {"display": self.display.snapshot() if self.display else None,
               "picture": self.picture.snapshot() if self.picture else None,
               "controls": {"via": self.controls.via(), "lacking": self.controls.why_not()}
               if self.controls else None, "player": None, "recovery": None}
        if self.mender is not None:
            mended = self.mender.snapshot()
            recovery = mended.get("recovery") or {}
            doc["recovery"] = recovery
            if mended.get("player"):
                doc["player"] = {**mended["player"], "recovery": (
                    recovery.get("state") if recovery.get("enabled") else "off")}
        return doc if any(doc.values()) else None


def assemble(config: Config, *, sysfs: str, environ: dict, runtime_dir: str,
             publish: Callable[[Event], None], enqueue: Callable[[str, bytes], object],
             gate: WatchdogGate | None, scheduled_off: Callable[[], bool],
             wake: Callable[[], tuple[bool, str]], reboot: Callable[[], tuple[bool, str]]
             ) -> ScreenPart:
    """``scheduled_off()``: the working hours have the display off now. ``wake()`` turns
    the display on and reads it back, ``reboot()`` asks for a reboot: the recovery
    ladder's rungs, each (done, in words)."""
    section, commands = config.screen, config.commands
    display = None
    if commands.display_on_command or commands.display_off_command:
        display = service.from_config(section, commands, sysfs_root=sysfs, environ=environ)
    part = ScreenPart(display, None, publish)

    def queue_thumbnail(kind: str, data: bytes) -> None:
        # the verdict is told whatever the queue says: a full or failed card refuses the
        # picture, in one line, and never stops the check
        try:
            enqueue(kind, data)
        except Exception as e:   # the queue's refusals (NotQueued), each a line of words
            log.warning("picture check: the thumbnail was not queued: %s", e)
    if section.player_unit or section.recovery:
        part.mender = mending.from_config(
            section, commands.allow, config.state_dir, publish=publish, wake=wake,
            reboot=reboot, meant_dark=lambda: part.dark(scheduled_off) is not None, gate=gate)
    if {"restart-player", "brightness", "volume"} & set(commands.allow):
        part.controls = controlling.from_config(
            section, sysfs_root=sysfs, environ=environ,
            player=part.mender.player if part.mender else None)
    if section.picture_every_s > 0:
        part.picture = watch.from_config(
            section, commands, environ, dark=lambda: part.dark(scheduled_off),
            publish=publish, enqueue=queue_thumbnail, gate=gate, temp_dir=runtime_dir,
            on_verdict=part.mender.on_picture if part.mender else None)
    return part
