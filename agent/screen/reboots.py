"""The recovery ladder's reboots, counted across reboots: at most ``[screen]
reboots_per_day`` in any day, however often the screen boots.

The count is a small file in the state directory (``screen-reboots.json``), read once
when the agent starts and written, durably, only just before a reboot the ladder asks
for: never per check (the card wears), and a reboot that could not be counted is not
done. A file that cannot be read or makes no sense is told in one line and counts as
the whole day's budget spent, from the moment it was read: the failure is a screen that
is not rebooted, never one that reboots in a loop.

Why wall time with a flag, and not boots. The day is wall time, and a Pi has no RTC: it
boots at the last time it saved (fake-hwclock, timesyncd's clock file) and jumps when
NTP answers. Each entry keeps the wall time, whether the clock was synchronised then,
and the boot it was asked in (``/proc/sys/kernel/random/boot_id``, for the operator).
An entry counts against today's budget when

- it is less than a day old by the clock now, **a negative age included** (a clock that
  went back, or an entry written on a clock that ran ahead, counts until it is placed);
- or neither it nor the clock now was synchronised: nothing can place it in time.

An unsynchronised clock restarts from a time it saved, so it runs behind: an age read
on it is at most the real one, and an entry it calls older than a day is so. Counting
boots instead would need a write to the card at every boot, and still not tell a day.
The cost of the rule: a screen whose clock is never synchronised reboots at most
``reboots_per_day`` times until it is; fail safe, and said in the refusal. Entries made
before the clock is first seen synchronised are placed at that moment (the jump NTP makes
would otherwise age them out at once): a day from then, not from when they were made.
A clock synchronised by chrony or ntpsec, which leave no flag the sandboxed agent can
read, is told by ``[hours] clock = "trusted"``, as the working hours are.
"""
from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..base.boot import boot_id
from ..base.clock import wall_synced
from ..base.fsutil import atomic_write, load_state

log = logging.getLogger("edge_agent.screen")

FILE = "screen-reboots.json"
DAY = 86400.0
MAX_BYTES = 8192       # the file's bound: KEEP entries, each with its reason, are under it
KEEP = 16              # entries kept: ten a day at most, and those of the day before
MAX_BOOT_ID = 64
DAMAGED = "damaged"    # the boot of the entries that stand for a file that was not read


MAX_WHY = 120          # what an entry keeps of why the ladder rebooted, in ASCII (KEEP fit)


@dataclass(frozen=True)
class Entry:
    wall: float
    synced: bool
    boot: str
    why: str = ""          # told at the first start after it: an event in memory is lost


def counted(entries, now_wall: float, synced: bool) -> list:
    """The entries that count against the budget of the day ending now."""
    return [e for e in entries
            if now_wall - e.wall < DAY or (not e.synced and not synced)]


def parse(doc) -> list:
    """The entries of the file's document (base/fsutil.py's loader has bounded its
    numbers); ValueError for anything but the file this module writes."""
    if not isinstance(doc, dict) or not isinstance(doc.get("reboots"), list) \
            or len(doc["reboots"]) > KEEP:
        raise ValueError("not a list of reboots")
    entries = []
    for item in doc["reboots"]:
        if not isinstance(item, dict):
            raise ValueError("an entry that is not an object")
        wall, synced, boot = item.get("wall"), item.get("synced"), item.get("boot", "")
        why = item.get("why", "")
        if not isinstance(why, str) or len(why) > MAX_WHY:
            raise ValueError("an entry whose reason is not words")
        if (not isinstance(wall, (int, float)) or isinstance(wall, bool)
                or not math.isfinite(wall) or not isinstance(synced, bool)
                or not isinstance(boot, str) or len(boot) > MAX_BOOT_ID):
            raise ValueError("an entry without its time")
        entries.append(Entry(float(wall), synced, boot, why))
    return entries


class RebootBook:
    """The ladder's reboots of the last day. ``take()`` is asked just before a reboot."""

    def __init__(self, state_dir: str, per_day: int, *,
                 wall: Callable[[], float] = time.time,
                 synced: Callable[[], bool] = wall_synced,
                 boot: Callable[[], str] = boot_id):
        self.path = os.path.join(state_dir, FILE)
        self.per_day = per_day
        self.wall, self.synced, self.boot = wall, synced, boot
        self.entries = self._load()
        # take() is asked by the recovery ladder's thread and the network's healer's
        # (device/heal.py): one at a time, or both could spend the day's last reboot
        self._taking = threading.Lock()

    def left(self) -> int:
        now, synced = self._now()
        return max(0, self.per_day - len(counted(self.entries, now, synced)))

    def _now(self) -> tuple[float, bool]:
        """The clock now; the first time it reads synchronised, the entries made before
        (on a clock that could not place them, a damaged file's stand-ins) are placed
        now: the jump NTP made would otherwise age them past the day at once."""
        now, synced = self.wall(), self.synced()
        if synced and any(not e.synced for e in self.entries):
            self.entries = [e if e.synced else Entry(now, True, e.boot, e.why)
                            for e in self.entries]
        return now, synced

    def last_before_this_boot(self) -> Entry | None:
        """The ladder's newest reboot, if it was asked in another boot than this one."""
        if self.entries and self.entries[-1].boot not in (self.boot(), DAMAGED):
            return self.entries[-1]
        return None

    def take(self, why: str = "") -> tuple[bool, str]:
        """(True, words) once this reboot is counted on the card; else (False, why not):
        the budget is spent, or the count could not be written."""
        with self._taking:
            return self._take(why)

    def _take(self, why: str) -> tuple[bool, str]:
        now, synced = self._now()
        today = counted(self.entries, now, synced)
        if len(today) >= self.per_day:
            clock = "" if synced else (" (the clock is not synchronised: a reboot made "
                                       "before it cannot be placed in time)")
            return False, (f"not rebooted: {len(today)} of {self.per_day} reboots a day "
                           f"spent{clock}")
        entry = Entry(now, synced, self.boot()[:MAX_BOOT_ID],
                      why.encode("ascii", "replace").decode()[:MAX_WHY])
        keep = today[-(KEEP - 1):] + [entry]
        doc = {"reboots": [{"wall": e.wall, "synced": e.synced, "boot": e.boot, "why": e.why}
                           for e in keep]}
        try:
            atomic_write(self.path, json.dumps(doc).encode(), 0o600, durable=True)
        except OSError as e:
            return False, (f"not rebooted: the reboot could not be counted in {self.path} "
                           f"({e.strerror or type(e).__name__})")
        self.entries = [*today, entry]
        return True, f"reboot {len(today) + 1} of {self.per_day} a day"

    def _load(self) -> list:
        entries, why = load_state(self.path, MAX_BYTES, parse)
        if why is None:
            return entries or []
        log.warning("screen: %s cannot be read (%s): the day's reboots count as spent",
                    self.path, why)
        return [Entry(self.wall(), self.synced(), DAMAGED)] * self.per_day
