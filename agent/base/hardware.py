"""What the board and the OS say about themselves: the facts a server is told at
enrollment and registration, and the basis of a stable device id.

Each is a few hundred bytes from the device tree, /etc or sysfs; a fact that is not
there (a container, a PC without a display) is empty, never an error.
"""
from __future__ import annotations

import glob
import hashlib
import os
import platform

from .. import __version__

MACHINE_ID = "/etc/machine-id"
OS_RELEASE = "/etc/os-release"
# each under the sysfs root (/sys, or a test's tree: [debug] sysfs_root) or /proc
SERIAL_PATHS = ("sys:firmware/devicetree/base/serial-number", "proc:device-tree/serial-number")
MODEL_PATHS = ("sys:firmware/devicetree/base/model", "proc:device-tree/model")
CPUINFO = "proc:cpuinfo"
PRODUCT_UUID = "sys:class/dmi/id/product_uuid"   # root's alone (0400): read where readable
# what firmware writes where it has no serial of its own: never a board's identity
PLACEHOLDERS = {"", "0" * 16, "0" * 8, "00000000-0000-0000-0000-000000000000",
                "ffffffff-ffff-ffff-ffff-ffffffffffff", "03000200-0400-0500-0006-000700080009",
                "not settable", "to be filled by o.e.m.", "default string"}


def _path(where: str, sysfs: str, proc: str) -> str:
    root, _, rest = where.partition(":")
    return os.path.join(sysfs if root == "sys" else proc, rest)


def _read(paths, limit=256, sysfs: str = "/sys", proc: str = "/proc") -> str:
    for path in paths:
        try:
            with open(_path(path, sysfs, proc) if path.startswith(("sys:", "proc:")) else path,
                      "rb") as f:
                return f.read(limit).replace(b"\0", b"").decode("ascii", "replace").strip()
        except OSError:
            continue
    return ""


def _cpuinfo_serial(proc: str) -> str:
    """A Raspberry Pi's kernel says its serial in /proc/cpuinfo too (``Serial : ...``)."""
    text = _read((CPUINFO,), 64 * 1024, proc=proc)
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Serial":
            return value.strip()
    return ""


def board_serial(sysfs: str = "/sys", proc: str = "/proc") -> str:
    """The board's serial: the device tree's, else /proc/cpuinfo's; "" where none."""
    serial = _read(SERIAL_PATHS, sysfs=sysfs, proc=proc) or _cpuinfo_serial(proc)
    return "" if serial.lower() in PLACEHOLDERS else serial


def board_fingerprint(sysfs: str = "/sys", proc: str = "/proc") -> tuple[str, str] | None:
    """What a copy of the card cannot carry to another board: (where it was read, a
    hash of it; the serial itself is never kept), or None where this board says
    nothing readable (no serial, a DMI uuid only root may read)."""
    for where, value in (("board serial", lambda: board_serial(sysfs, proc)),
                         ("DMI product_uuid", lambda: _read((PRODUCT_UUID,), sysfs=sysfs))):
        found = value()
        if found and found.lower() not in PLACEHOLDERS:
            return where, hashlib.sha256(f"edge-agent board|{found}".encode()).hexdigest()[:32]
    return None


def board_model() -> str:
    return _read(MODEL_PATHS)


def machine_id() -> str:
    return _read((MACHINE_ID,))


def os_name() -> str:
    try:
        with open(OS_RELEASE) as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')[:100]
    except OSError:
        pass
    return "linux"


def connectors(sysfs_root: str = "/sys") -> dict[str, str]:
    """Each DRM connector's directory and its status (connected, disconnected, unknown),
    in name order; empty where there is no DRM (a container, a display DRM does not drive)."""
    return {p: _read((os.path.join(p, "status"),))
            for p in sorted(glob.glob(os.path.join(sysfs_root, "class/drm/card*-*")))}


def screen_size(sysfs_root: str = "/sys") -> tuple[int, int] | None:
    """The preferred mode of the first connected display (the first line of modes)."""
    for p, status in connectors(sysfs_root).items():
        if status != "connected":
            continue
        try:
            with open(os.path.join(p, "modes")) as f:
                width, _, height = f.readline().strip().partition("x")
            return int(width), int(height.rstrip("ip"))
        except (OSError, ValueError):
            continue
    return None


def hardware_facts(sysfs: str = "/sys") -> dict:
    facts: dict[str, object] = {"model": board_model() or platform.machine(), "os": os_name(),
             "agent_version": __version__, "arch": platform.machine()}
    serial = board_serial(sysfs)
    if serial:
        facts["serial"] = serial
    size = screen_size()
    if size:
        facts["screen_width"], facts["screen_height"] = size
    return facts


def undervoltage_alarm(sysfs_root: str = "/sys") -> str | None:
    """The Pi firmware's under-voltage alarm as the raspberrypi-hwmon driver (rpi_volt)
    keeps it, "1" or "0"; None where there is no such driver. The driver asks the
    firmware every 2 s and clears its sticky bits each time: the alarm is "now"."""
    for hw in sorted(glob.glob(os.path.join(sysfs_root, "class/hwmon/hwmon*"))):
        if _read((os.path.join(hw, "name"),)) == "rpi_volt":
            return _read((os.path.join(hw, "in0_lcrit_alarm"),))
    return None
