"""Bounded reads of what the kernel exposes in sysfs and procfs: a failing card or an odd
device can put anything there, so every read is capped, cleaned, and a file that is not
there (a container, a board without it) is empty, never an error. One home for them: the
inventory (inventory/collect.py) and the device's truth (device/reader.py) read with these.
"""
from __future__ import annotations

import os
import re
import stat

from .system_watchdog import Device

READ_LIMIT = 4096
TEXT_LIMIT = 128
# eMMC 5.0+ EXT_CSD DEVICE_LIFE_TIME_EST_TYP_A/B and PRE_EOL_INFO, as JEDEC defines them
LIFE_TIME = {**{n: f"{(n - 1) * 10}-{n * 10}%" for n in range(1, 11)}, 11: "exceeded"}
PRE_EOL = {1: "normal", 2: "warning", 3: "urgent"}
EXT4_ERRORS = ("errors_count", "first_error_time", "last_error_time")


def read(path: str, limit: int = READ_LIMIT) -> bytes:
    """At most ``limit`` bytes of the regular file at ``path``, else b"". O_NONBLOCK and
    the type check: a FIFO where a sysfs file should be is never waited on."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        return b""
    try:
        with os.fdopen(fd, "rb") as f:
            return f.read(limit) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return b""


def clean(text: str, limit: int = TEXT_LIMIT) -> str:
    return "".join(ch for ch in text if ch.isprintable())[:limit].strip()


def text(path: str, limit: int = TEXT_LIMIT) -> str:
    """A one-value file (sysfs, a device-tree string), NULs and control bytes dropped."""
    return clean(read(path).replace(b"\0", b"").decode("utf-8", "replace"), limit)


def as_int(value: str) -> int | None:
    return int(value) if re.fullmatch(r"\d{1,20}", value) else None


def as_hex_byte(value: str) -> int | None:
    return int(value, 16) if re.fullmatch(r"0x[0-9a-fA-F]{1,2}", value) else None


def life_time(value: str) -> dict | None:
    """eMMC's two life time estimates (``0x01 0x02``) in words, {a, b}; None without."""
    estimates = {k: v for k, v in zip("ab", (LIFE_TIME.get(as_hex_byte(word))
                                              for word in value.split()[:2])) if v}
    return estimates or None


def ext4_errors(directory: str) -> dict:
    """ext4's error record of one mounted device (/sys/fs/ext4/<dev>): each of
    EXT4_ERRORS as a number, or None where it is not there."""
    return {key: as_int(text(os.path.join(directory, key))) for key in EXT4_ERRORS}


def watchdog(sysfs_root: str = "/sys", name: str = "watchdog0") -> Device | None:
    """What the kernel says of a watchdog device, or None where there is none (a
    container, a board without one)."""
    directory = os.path.join(sysfs_root, "class/watchdog", name)
    if not os.path.isdir(directory):
        return None
    state = text(os.path.join(directory, "state"), 16)
    return Device(identity=text(os.path.join(directory, "identity"), 64) or None,
                  timeout_s=as_int(text(os.path.join(directory, "timeout"), 16)),
                  max_timeout_s=as_int(text(os.path.join(directory, "max_timeout"), 16)),
                  active={"active": True, "inactive": False}.get(state))
