"""Clocks are injected so every timing rule can be driven by a fake clock in tests.

Monotonic time drives every timer; wall time appears in reports to the server and in
the upload queue's due times and ages, which must survive a reboot. A Pi has no RTC: it
boots with a stale wall clock that jumps when NTP syncs, so `wall_synced` is the one
place that says whether the wall clock can be trusted yet.
"""
from __future__ import annotations

import os
import time
from typing import Protocol


TIME_ERROR = 5         # adjtimex(2): the clock is not synchronised (STA_UNSYNC and kin)
TIMESYNCD_FLAG = "/run/systemd/timesync/synchronized"
_TIMEX_BYTES = 512     # struct timex is 208 bytes on 64-bit; room to spare, modes = 0
# A wall time read from a file to be printed: time.localtime()/gmtime() raise past what
# the platform can say (1e18: EOVERFLOW), so a time outside (0, the year 5138) is none.
MAX_WALL = 1e11


def printable_wall(value) -> bool:
    """``value`` is a wall time since 1970 that a clock can print (a file's, any shape)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        0 < value < MAX_WALL


class Clock(Protocol):
    def monotonic(self) -> float: ...
    def wall(self) -> float: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


def kernel_synced() -> bool | None:
    """Whether the kernel says the wall clock is synchronised (adjtimex, read only: any
    NTP client sets its flag); None where that call is not allowed (the unit's
    ProtectClock=) or fails. ctypes is loaded here, by the daemon and the doctor: not by
    `edge-agent status`, which only prints times."""
    from .libc import ctypes, libc
    try:
        timex = ctypes.create_string_buffer(_TIMEX_BYTES)   # modes 0: read, set nothing
        state = libc().adjtimex(timex)
    except (OSError, AttributeError):
        return None
    return state != TIME_ERROR if state >= 0 else None


def wall_synced(flag: str = TIMESYNCD_FLAG) -> bool:
    """Whether the kernel says the wall clock is synchronised, or, where it cannot be
    asked, whether systemd-timesyncd has synchronised it since boot. Unknown counts as
    not: trusting a stale clock loses data, distrusting a good one only keeps items
    longer."""
    synced = kernel_synced()
    return synced if synced is not None else os.path.exists(flag)


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, start: float = 1000.0, wall_offset: float = 1_700_000_000.0):
        self.now = start
        self._wall_offset = wall_offset

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now + self._wall_offset

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now
