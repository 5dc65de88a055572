"""The device's truth, assembled: the card's verdict, the firmware's power flags and why
the last boot ended, each decided by its core (storage.py, power.py, last_boot.py) from
what the reader (reader.py) finds in sysfs and procfs.

No thread of its own: the link thread's wake-ups (every heartbeat, at least every 30 s)
call turn(), which reads everything every ``[device] every_s`` and, between, at most
every MOUNT_EVERY_S, one small file: ext4's error count (an error is what makes ext4
read-only; a change reads everything at once), or mountinfo where no ext4 is behind the
state directory. A card ext4 made read-only is seen within a heartbeat or two.

Nothing here writes to the card but the stop mark: once, when the agent stops in order,
taken away by the next start (last_boot.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from typing import Callable

from ..base import system_watchdog
from ..base.boot import boot_id
from ..base.fsutil import atomic_write, read_bounded, read_json
from ..base.journal_fields import MessageId, journal
from ..events.model import Event
from . import last_boot, power, storage
from .reader import DeviceReader

log = logging.getLogger("edge_agent.device")

MOUNT_EVERY_S = 10.0
CAUSE_FILE = "boot-cause.json"      # in the runtime directory (tmpfs): the boot's later starts


class DevicePart:
    def __init__(self, reader: DeviceReader, *, publish: Callable[[Event], None],
                 every_s: float, state_dir: str, runtime_dir: str, cold_start: bool,
                 ladder: Callable[[], object] = lambda: None,
                 asked_by: Callable[[], str] = lambda: "",
                 on_change: Callable[[], None] = lambda: None,
                 boot: Callable[[], str] = boot_id, wall: Callable[[], float] = time.time,
                 watchdog_s: int | None = None):
        """``ladder()``: the recovery ladder's newest reboot before this boot (an entry
        with ``boot`` and ``why``) or None; ``asked_by()``: at stop, who asked for the
        reboot to come, where the agent knows (last_boot.BY_FLEET) or "";
        ``on_change()``: what the status says changed (the first read, a verdict, a flag);
        ``watchdog_s``: the system's watchdog [device] asks for (None: off), said beside
        what sysfs says of the board's."""
        self.reader, self.publish, self.every_s = reader, publish, every_s
        self.mark_path = os.path.join(state_dir, last_boot.MARK_FILE)
        self.cause_path = os.path.join(runtime_dir, CAUSE_FILE)
        self.cold_start = cold_start
        self._ladder, self._asked_by, self._boot, self._wall = ladder, asked_by, boot, wall
        self._on_change = on_change
        self.storage = storage.StorageJudge()
        self.power = power.PowerFlags()
        self.last_boot: last_boot.BootEnd | None = None
        self.watchdog_s = watchdog_s
        self.watchdog: system_watchdog.Device | None | bool = False   # False: not read yet
        self._full_due = self._mount_due = 0.0

    # -- start and stop ----------------------------------------------------------------
    def start(self) -> None:
        """Why the last boot ended: judged at the boot's first start and kept on tmpfs for
        the later ones; the previous stop's mark is taken away either way."""
        mark = self._take_mark()
        if not self.cold_start:
            with contextlib.suppress(OSError, ValueError):
                self.last_boot = last_boot.from_details(read_json(self.cause_path, 1024))
            if self.last_boot is None and mark is not None and mark.boot == self._boot():
                self.last_boot = mark.ended   # the runtime directory went with a restart
            self._on_change()   # a status file written before this start says it now
            return
        entry = self._ladder()
        ladder = (entry.boot, entry.why) if entry is not None else None
        first_run = mark is None and self.reader.first_run_here()
        end = last_boot.judge(mark, self.reader.crashes(), self.reader.watchdog_status(),
                              ladder, first_run)
        self.last_boot = end
        with contextlib.suppress(OSError):
            atomic_write(self.cause_path, json.dumps(end.details()).encode(), 0o644,
                         durable=False)
        level = logging.INFO if end.cause in (last_boot.CLEAN, last_boot.FIRST) \
            else logging.WARNING
        log.log(level, "the last boot ended with %s", end.words(),
                extra=journal(MessageId.BOOT_ENDED, CAUSE=end.cause))
        self.publish(Event(last_boot.EVENT, self._wall(), end.details()))

    def _take_mark(self) -> last_boot.StopMark | None:
        try:
            raw = read_bounded(self.mark_path, last_boot.MARK_MAX_BYTES)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("device: %s cannot be read (%s): no clean stop is known",
                        self.mark_path, getattr(e, "strerror", None) or e)
            raw = None
        with contextlib.suppress(OSError):
            os.unlink(self.mark_path)   # the boot it speaks of is over once read
        try:
            return last_boot.parse_mark(raw) if raw is not None else None
        except (ValueError, RecursionError) as e:
            log.warning("device: %s makes no sense (%s): no clean stop is known",
                        self.mark_path, e)
            return None

    def stop(self) -> None:
        """The agent stops in order: the mark the next boot's first start reads."""
        mark = last_boot.StopMark(self._wall(), self._boot(), self._asked_by() or "",
                                  self.last_boot)
        try:
            atomic_write(self.mark_path, last_boot.mark_bytes(mark), 0o600, durable=True)
        except OSError as e:
            log.warning("device: the stop mark %s could not be written (%s): the next boot "
                        "will not know this stop was clean", self.mark_path, e.strerror)

    def join(self, timeout: float | None = None) -> None:
        pass

    # -- reads -------------------------------------------------------------------------
    def turn(self, now: float) -> None:
        """On the link thread's wake-up: everything when due, else mountinfo when due."""
        if now >= self._full_due:
            self._full_due = now + self.every_s
            self._mount_due = now + min(self.every_s, MOUNT_EVERY_S)
            first = self.storage.verdict is None
            self._storage(self.reader.storage(), now)
            change = self.power.feed(self.reader.throttled(), self.reader.undervoltage())
            watchdog = self.reader.system_watchdog()
            if watchdog != self.watchdog and not first:
                self._on_change()
            self.watchdog = watchdog
            if first:
                self._on_change()   # the status says the device from the first read on
            if change is not None:
                flags = ", ".join(change["now"]) or "none now"
                log.warning("power: %s (since boot: %s)", flags,
                            ", ".join(change["since_boot"]) or "none")
                self.publish(Event(power.EVENT, self._wall(), change))
                self._on_change()
        elif now >= self._mount_due:
            self._mount_due = now + min(self.every_s, MOUNT_EVERY_S)
            count = self.reader.errors_count()
            if count is not None:   # ext4 counts the error that makes it read-only
                if count != self.storage.reading.errors.get("errors_count"):
                    self._storage(self.reader.storage(), now)
                return
            mount = self.reader.mount()
            before = self.storage.reading.mount
            if mount is not None and (before is None or mount.read_only != before.read_only):
                self._storage(dataclasses.replace(self.storage.reading, mount=mount), now)

    def _storage(self, reading: storage.Reading, now: float) -> None:
        change = self.storage.feed(reading, now)
        if change is None:
            return
        self._on_change()
        level = logging.INFO if change["verdict"] == storage.OK else logging.ERROR
        log.log(level, "storage: the card is %s (was %s): %s", change["verdict"],
                change["was"] or "not known", "; ".join(change["reasons"]) or "no fault seen")
        self.publish(Event(storage.EVENT, self._wall(), change))

    def snapshot(self) -> dict:
        return {"storage": self.storage.snapshot(), "power": self.power.snapshot(),
                "watchdog": self._watchdog_snapshot(),
                "last_boot": ({**self.last_boot.details(), "words": self.last_boot.words()}
                              if self.last_boot else None)}


    def _watchdog_snapshot(self) -> dict | None:
        if self.watchdog is False:
            return None
        state, said = system_watchdog.judge(self.watchdog_s, None, self.watchdog or None,
                                            asked=False)
        return {"configured_s": self.watchdog_s, "state": state, "said": said}


class Off:
    """[device] enabled = false: nothing read, nothing said, no mark (and, as the
    network's healer, heal_network = false: nothing probed, nothing done)."""

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def join(self, timeout: float | None = None) -> None: ...
    def turn(self, now: float) -> None: ...
    def link_changed(self, link: dict) -> None: ...

    def snapshot(self) -> None:
        return None


def assemble(config, cold_start: bool, publish: Callable[[Event], None],
             on_change: Callable[[], None], mender: Callable[[], object],
             commands: Callable[[], object], proc: str = "/proc") -> DevicePart | Off:
    """The part [device] asks for. ``mender()``: the screen's recovery ladder (its book
    keeps the ladder's reboots, each with its boot and why), or None; ``commands()``: the
    command core, whose reboot or poweroff still running at a stop is the fleet's."""
    section = config.device
    if not section.enabled:
        return Off()

    def ladder():
        book = getattr(mender(), "book", None)
        return book.last_before_this_boot() if book is not None else None

    def asked_by() -> str:
        core = commands()
        return last_boot.BY_FLEET if core is not None and any(
            core.running(name) for name in ("reboot", "poweroff")) else ""

    return DevicePart(DeviceReader(config.state_dir, config.debug.sysfs, proc),
                      publish=publish, every_s=section.every_s, state_dir=config.state_dir,
                      runtime_dir=config.runtime.dir, cold_start=cold_start, ladder=ladder,
                      asked_by=asked_by, on_change=on_change,
                      watchdog_s=section.watchdog_s)


def assemble_on(config, cold_start: bool, publish: Callable[[Event], None],
                on_change: Callable[[], None], gate, *, screen, commands):
    """The device part and the network's healer (heal.py), built after the parts they
    read: the screen (its recovery ladder, whose book keeps the day's reboots, and its
    reboot) and the commands (a reboot or poweroff the fleet asked for)."""
    device = assemble(config, cold_start, publish, on_change, lambda: screen.mender,
                      lambda: commands)
    if not config.device.heals_network:   # off as shipped: its core and probe not loaded
        return device, Off()
    from . import heal
    network = heal.assemble(config, publish, on_change, gate,
                            lambda: screen.reboot_book(config), screen.reboot)
    return device, network
