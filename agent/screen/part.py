"""The screen's truth, assembled: what the daemon builds from ``[screen]`` and wires.

- the display's power, one owner (power.py): the ``display`` command, the working
  hours and the recovery ladder's wake each turn it there, one at a time, and it is
  read back (service.py) every time; the verdict is an event, ``display.read_back``
  (the hours tell theirs in ``display.scheduled``);
- the picture checked black, frozen or ok (watch.py), never while the display is meant
  to be dark: off by working hours, or last turned off by a display command;
- the player unit watched and the recovery ladder (mender.py), which hears each
  picture verdict, wakes the display through its owner and reboots as the reboot
  command does (base/boot.py's ``ask_logind``);
- the screen's controls for restart-player, brightness, volume and poweroff
  (controls.py), each read back;
- the screenshot, where no ``[commands] screenshot_command`` is set: the screen full
  size, taken by the picture check's means (capture.py), offered to a server only where
  this screen has one (``screenshot_means``).
- the display watched between commands (display_watch.py): a TV switched off by hand
  or a cable pulled is told once, ``display.changed``.

Each is built only where this screen has a use for it; ``snapshot()`` is the status
document's ``screen``.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from ..base.boot import ask_logind
from ..base.vocabulary import SCREEN_CONTROLS, SCREEN_MEANS
from ..config.model import Config
from ..events.model import Event
from ..runtime.threads import start_worker
from ..runtime.watchdog_gate import WatchdogGate
from typing import TYPE_CHECKING

from .power import DisplayPower
from .sources import Runner

if TYPE_CHECKING:   # each is imported where this screen has a use for it
    from . import capture as capturing, controls as controlling, display_watch, \
        mender as mending, watch

log = logging.getLogger("edge_agent.screen")


class ScreenPart:
    def __init__(self, power: DisplayPower | None, picture: "watch.PictureWatch | None",
                 timeout_s: float):
        """``power``: the display's owner, where a display command is configured;
        ``timeout_s``: a reboot's bound ([commands] timeout_s)."""
        self.power = power
        self.picture = picture
        self.controls: "controlling.Controls | None" = None
        self.mender: "mending.Mender | None" = None
        self.watched: "display_watch.DisplayWatch | None" = None
        self._prober = None   # the worker probing the controls' means, while it runs
        self.cold_start = False   # the boot's first start of the agent
        self.shot_means: tuple[str | None, str] = (None, "screenshot is not allowed")
        self.shooter: "capturing.Capture | None" = None   # the screenshot's own capture
        self._book = None   # reboot_book()'s, where the ladder keeps none
        self.started_at: float | None = None
        self._rebooter = Runner(timeout_s, refused="not run: the agent is stopping")

    def dark(self) -> str | None:
        """Why the display is meant to be dark now (its owner knows), or None."""
        return self.power.meant_dark() if self.power is not None else None

    def reboot(self) -> tuple[bool, str]:
        """The recovery ladder's last rung, as the reboot command asks: (asked, words)."""
        from .ladder import REBOOT   # the ladder's core loads where it mends, or here
        why = ask_logind(REBOOT, lambda argv: self._rebooter(argv)[1])
        return (False, why) if why else (True, "logind asked to reboot")

    def start(self) -> None:
        self.started_at = time.monotonic()
        if self.mender is not None:
            self.mender.start(self.cold_start)
        if self.picture is not None:
            self.picture.start()
        if self.watched is not None:
            self.watched.start()
        self._probe()

    def hotplug(self) -> None:
        """From the udev watcher: a DRM connector changed; the display is read soon."""
        if self.watched is not None:
            self.watched.hotplug()

    def turn(self, now: float) -> None:
        """On a wake-up the link thread has anyway: the means looked for again when stale."""
        if self.controls is not None and self.controls.stale():
            self._probe()

    def _probe(self) -> None:
        """What the server is told this screen can do, found on a worker of its own: a
        probe runs programs (each bounded), never on the caller's thread."""
        if self.controls is not None and (self._prober is None or not self._prober.alive()):
            self._prober = start_worker("screen-means", self.controls.probe,
                                        reason="the screen's means probed")

    def means(self) -> frozenset:
        """The screen's commands it has the means for: the controls' as last probed (no
        controls: the others are not probed, and not held back), and the screenshot
        where this screen has a way to take one."""
        have = set(self.controls.known() if self.controls is not None else SCREEN_MEANS)
        have.discard("screenshot")
        if self.shot_means[0] is not None:
            have.add("screenshot")
        return frozenset(have)

    def screenshot(self) -> tuple[bytes | None, str]:
        """The screen full size (shrunk only past the capture's bound), as a JPEG the
        servers take; or (None, why not). On the command's thread: bounded in time by
        the capture's timeout."""
        if self.shooter is None:
            return None, self.shot_means[1] or "no capture for the screenshot"
        fold, shot = self.shooter.grab(keep=True)
        if fold is None:
            return None, shot.why
        from . import capture as capturing
        return capturing.jpeg_of(fold.kept), ""

    def stop(self) -> None:
        """From any thread: a read-back or a capture in progress ends now."""
        if self.power is not None:
            self.power.stop()
        self._rebooter.stop()
        if self.picture is not None:
            self.picture.stop()
        if self.controls is not None:
            self.controls.stop()
        if self.mender is not None:
            self.mender.stop()
        if self.shooter is not None:
            self.shooter.stop()
        if self.watched is not None:
            self.watched.stop()

    def join(self, timeout: float | None = None) -> None:
        for loop in (self.picture, self.mender, self.watched):
            if loop is not None:
                loop.join(timeout)

    def reboot_book(self, config: Config):
        """The day's reboots for another part that reboots (device/heal.py): the recovery
        ladder's own book where it keeps one, so that every reboot the agent asks for
        counts against one [screen] reboots_per_day; else one book on the same file,
        made once (the ladder then never reboots)."""
        if self.mender is not None and self.mender.book is not None:
            return self.mender.book
        if self._book is None:
            from .reboots import RebootBook
            self._book = RebootBook(config.state_dir, config.screen.reboots_per_day, **(
                {"synced": lambda: True} if config.hours.clock == "trusted" else {}))
        return self._book

    def snapshot(self) -> dict | None:
        doc = {"display": self.power.snapshot() if self.power else None,
               "picture": self._picture(), "watched": self._watched(),
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

    def _watched(self) -> dict | None:
        """The display as the watch last found it, and whether it is meant dark now."""
        if self.watched is None:
            return None
        shot = self.watched.snapshot()
        why_dark = self.dark()
        return {**shot, "meant_dark": why_dark} if why_dark else shot

    def _picture(self) -> dict | None:
        """The picture check's snapshot as it stands now: a display meant dark is dark
        from the moment it is (the check says so only at its next look), and a screen not
        judged yet says why."""
        if self.picture is None:
            return None
        shot = self.picture.snapshot()
        why_dark = self.dark() if shot.get("verdict") != "off" else None
        if why_dark and shot.get("verdict") != "dark":
            return {**shot, "verdict": "dark", "dark": why_dark, "since_s": None,
                    "mean": None, "contrast": None}
        if shot.get("verdict") is None:
            shot["pending"] = (
                f"the capture failed: {shot['failure']}" if shot.get("failure") else
                "the first check is under way" if self.started_at is not None else
                "the check starts with the agent")
        return shot


def assemble(config: Config, *, sysfs: str, environ: dict, runtime_dir: str,
             publish: Callable[[Event], None], enqueue: Callable[[str, bytes], object],
             gate: WatchdogGate | None, means_changed: Callable[[], None] = lambda: None,
             cold_start: bool = False,
             on_change: Callable[[], None] = lambda: None) -> ScreenPart:
    """``means_changed()``: a probe found what the
    screen can do changed (the server that was told at registration hears it again).
    ``on_change()``: a check is done (a picture judged, the display read): the status
    board says it now, on tmpfs, so every line of `edge-agent status` is as of its last
    check, not of the last event."""
    section, commands = config.screen, config.commands
    power = None
    if commands.display_on_command or commands.display_off_command:
        from . import service
        power = DisplayPower(commands.display_on_command, commands.display_off_command,
                             commands.timeout_s, service.from_config(
                                 section, commands, sysfs_root=sysfs, environ=environ),
                             publish, sysfs_root=sysfs)
    part = ScreenPart(power, None, commands.timeout_s)
    part.cold_start = cold_start

    def queue_thumbnail(kind: str, data: bytes) -> None:
        # the verdict is told whatever the queue says: a full or failed card refuses the
        # picture, in one line, and never stops the check
        try:
            enqueue(kind, data)
        except Exception as e:   # the queue's refusals (NotQueued), each a line of words
            log.warning("picture check: the thumbnail was not queued: %s", e)
    if section.player_unit or section.recovery:
        # a wake is a turn of the display (the command, its read-back); a reboot, the
        # command's bound
        rung_s = max(commands.timeout_s, power.bound_s if power is not None else 0.0) + 10.0
        from . import mender as mending
        part.mender = mending.from_config(
            section, commands.allow, config.state_dir, publish=publish,
            wake=power.wake if power is not None and commands.display_on_command else None,
            reboot=part.reboot, meant_dark=lambda: part.dark() is not None, gate=gate,
            rung_bound_s=rung_s, clock_trusted=config.hours.clock == "trusted")
    if set(SCREEN_CONTROLS) & set(commands.allow):
        from . import controls as controlling
        part.controls = controlling.from_config(
            section, sysfs_root=sysfs, environ=environ,
            player=part.mender.player if part.mender else None)
        part.controls.on_change = means_changed
    if "screenshot" in commands.allow:
        part.shot_means = screenshot_means(config, environ)
        if part.shot_means[0] is not None and not commands.screenshot_command:
            part.shooter = _capture(config, environ, runtime_dir)
    if section.display_every_s > 0:
        part.watched = _display_watch(config, sysfs=sysfs, environ=environ, publish=publish,
                                      on_change=on_change, gate=gate,
                                      dark=part.dark)
    if section.picture_every_s > 0 and (something_to_capture(config, environ)
                                        or _kms_screen(sysfs)):

        from . import watch
        part.picture = watch.from_config(
            section, commands, environ, dark=part.dark,
            publish=publish, gate=gate, temp_dir=runtime_dir,
            enqueue=queue_thumbnail if "screenshot" in commands.allow else None,
            on_verdict=lambda verdict: _checked(part, verdict, on_change))
    return part


def _display_watch(config: Config, *, sysfs: str, environ: dict,
                   publish: Callable[[Event], None], on_change: Callable[[], None],
                   gate: WatchdogGate | None,
                   dark: Callable[[], str | None]) -> "display_watch.DisplayWatch | None":
    """The display's watch, where there is a display to watch: one this agent is told of,
    or a DRM connector in sysfs (a headless box starts no thread for it)."""
    from .sources import Drm, Runner
    if not (something_to_capture(config, environ) or Drm(sysfs).read().present):
        return None
    from . import display_watch, service
    runner = Runner()
    return display_watch.DisplayWatch(
        service.sources_of(config.screen, config.commands, sysfs_root=sysfs,
                           environ=environ, runner=runner),
        config.screen.display_every_s, publish=publish, on_change=on_change, dark=dark,
        runner=runner, gate=gate)


def _checked(part: ScreenPart, verdict: str, on_change: Callable[[], None]) -> None:
    """Each look of the picture check: the ladder hears it, the board says it."""
    if part.mender is not None:
        part.mender.on_picture(verdict)
    on_change()


def _kms_screen(sysfs: str) -> bool:
    """A DRM connector reads connected: a screen, maybe with no compositor (a player
    drawing straight to KMS), whose picture check then says why it is unavailable."""
    from .core import NO_CONNECTOR_CONNECTED
    from .sources import Drm
    reading = Drm(sysfs).read()
    return reading.present and reading.said != NO_CONNECTOR_CONNECTED


def something_to_capture(config: Config, environ: dict) -> bool:
    """A display this agent is told of: a capture command, an X display (the key, the
    display commands', the environment's) or a Wayland one. A box without one (an IoT
    player, a headless test) loads no picture check at all."""
    commands = config.commands
    return bool(config.screen.capture_command or config.screen.x_display
                or commands.display_on_command or commands.display_off_command
                or environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY"))


def _capture(config: Config, environ: dict, runtime_dir: str | None = None):
    from . import capture as capturing
    from .service import x_display_of
    return capturing.choose(config.screen.capture_command,
                            x_display_of(config.screen, config.commands, environ), environ,
                            temp_dir=runtime_dir)


def screenshot_means(config: Config, environ: dict) -> tuple[str | None, str]:
    """How this screen's screenshot is taken ("xwd on :0", "grim ([commands]
    screenshot_command)"), or (None, why none): the command is then not offered to a
    server. Nothing is run and Pillow is not imported (it is only looked for)."""
    import importlib.util
    command = config.commands.screenshot_command
    if command:
        import shlex
        from ..base import children
        return f"{children.program(shlex.split(command))} ([commands] screenshot_command)", ""
    capture = _capture(config, environ)
    if capture.argv is None:
        return None, capture.how
    if importlib.util.find_spec("PIL") is None:
        from .capture import NO_PILLOW
        return None, NO_PILLOW
    return capture.how, ""
