"""Where the screen's brightness is set and read back: a backlight in sysfs, or the
display itself over DDC/CI.

Each means answers three questions the same way (controls.py asks them):
``probe()`` is "" when this screen has it, else why not, in words; ``set(level)`` is ""
when the level was handed over, else why not; ``read()`` is (the level read, in its
own words) or (None, why it could not tell).

- Backlight: ``class/backlight/*`` under the agent's sysfs root, the first whose
  ``brightness`` the agent may write (on a Pi, the official 7" display's
  ``rpi_backlight`` or ``10-0045``); read back from ``actual_brightness``, what the
  hardware reports, not the value just written (``brightness`` where a driver has no
  ``actual_brightness``).
- DDC/CI: ``ddcutil getvcp 10 --brief`` ("VCP 10 C 40 100": now 40 of 100) and
  ``ddcutil setvcp 10 N``, where ddcutil is installed, an I2C bus exists and a display
  answers. A slow bus (a second or so a question): its program bound is its own.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
from typing import Callable

from ..base.fsutil import read_bounded

MAX_ATTRIBUTE = 32          # a sysfs number's bytes
MAX_LEVEL_VALUE = 1 << 20   # no backlight or monitor has a finer scale; more is garbage


def _number(text: str) -> int | None:
    text = text.strip()
    if not text.isdigit() or len(text) > 7:
        return None
    value = int(text)
    return value if value <= MAX_LEVEL_VALUE else None


class Backlight:
    via = "backlight"

    def __init__(self, sysfs_root: str = "/sys"):
        self.sysfs_root = sysfs_root
        self.path: str | None = None     # the backlight's directory, once probed
        self.device = ""                 # its name, for the answer
        self.maximum = 0
        self.resolution = 0.01           # one step of its scale, as a fraction

    def _attribute(self, path: str, name: str) -> int | None:
        return self._read(path, name)[0]

    def _read(self, path: str, name: str) -> tuple[int | None, str]:
        """(the number, "") or (None, why not)."""
        try:
            raw = read_bounded(os.path.join(path, name), MAX_ATTRIBUTE)
        except (OSError, ValueError) as e:
            return None, f"{name} not read: {getattr(e, 'strerror', None) or e}"
        value = _number(raw.decode("ascii", "replace"))
        return (value, "") if value is not None else (None, f"{name} is not a number")

    def probe(self) -> str:
        found = sorted(glob.glob(os.path.join(self.sysfs_root, "class/backlight/*")))
        if not found:
            return "no backlight in sysfs"
        whys = []
        for path in found[:8]:
            name = os.path.basename(path)[:64]
            maximum = self._attribute(path, "max_brightness")
            if not maximum:
                whys.append(f"{name}: no max_brightness")
            elif not os.access(os.path.join(path, "brightness"), os.W_OK):
                whys.append(f"{name}: the agent may not write its brightness")
            else:
                self.path, self.device, self.maximum = path, name, maximum
                self.resolution = 1.0 / maximum
                return ""
        return "; ".join(whys)

    def set(self, level: float) -> str:
        why = self.probe() if self.path is None else ""
        if why:
            return why
        value = round(level * self.maximum)
        try:
            # no O_CREAT: a backlight that went away is an error, never a new file
            fd = os.open(os.path.join(self.path, "brightness"),
                         os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                os.write(fd, f"{value}\n".encode())
            finally:
                os.close(fd)
        except OSError as e:
            return f"{self.device}: brightness not written: {e.strerror or e}"
        return ""

    def read(self) -> tuple[float | None, str]:
        why = self.probe() if self.path is None else ""
        if why:
            return None, why
        # what the hardware reports; brightness only where the driver has no other
        name = "actual_brightness" if os.path.exists(
            os.path.join(self.path, "actual_brightness")) else "brightness"
        value, why = self._read(self.path, name)
        if value is None:
            return None, f"{self.device}: {why}"
        if value > self.maximum:
            return None, f"{self.device}: {name} {value} is over max_brightness {self.maximum}"
        return value / self.maximum, f"{self.via} {self.device}"


VCP_BRIGHTNESS = "10"     # MCCS: luminance
_BRIEF = re.compile(r"^VCP 10 C (\d{1,7}) (\d{1,7})\s*$", re.MULTILINE)


class Ddc:
    via = "ddcutil"

    def __init__(self, run: Callable, path: str | None = None, dev_root: str = "/dev"):
        """``run(argv)`` -> (stdout or None, why): sources.Runner, bounded."""
        self.run, self.path, self.dev_root = run, path, dev_root
        self.maximum = 0
        self.resolution = 0.01

    def _tool(self) -> str | None:
        return shutil.which("ddcutil", path=self.path)

    def probe(self) -> str:
        if self._tool() is None:
            return "ddcutil is not installed"
        if not glob.glob(os.path.join(self.dev_root, "i2c-*")):
            return "no I2C bus (/dev/i2c-*) to reach a display over"
        level, said = self.read()
        return "" if level is not None else said

    def set(self, level: float) -> str:
        tool = self._tool()
        if tool is None:
            return "ddcutil is not installed"
        if not self.maximum:
            now, said = self.read()
            if now is None:
                return said
        out, why = self.run([tool, "setvcp", VCP_BRIGHTNESS, str(round(level * self.maximum))])
        return why

    def read(self) -> tuple[float | None, str]:
        tool = self._tool()
        if tool is None:
            return None, "ddcutil is not installed"
        out, why = self.run([tool, "getvcp", VCP_BRIGHTNESS, "--brief"])
        if out is None or why:
            return None, why or "ddcutil said nothing"
        level = self.parse(out.decode("ascii", "replace")[:4096])
        if level is None:
            return None, "no display answered for its brightness over DDC/CI"
        return level, "ddcutil (DDC/CI)"

    def parse(self, text: str) -> float | None:
        """"VCP 10 C 40 100" -> 0.4 (and the monitor's scale, kept for the set)."""
        m = _BRIEF.search(text)
        if m is None:
            return None
        now, maximum = int(m.group(1)), int(m.group(2))
        if not 0 < maximum <= MAX_LEVEL_VALUE or now > maximum:
            return None
        self.maximum, self.resolution = maximum, 1.0 / maximum
        return now / maximum
