"""Why the last boot ended, said once by the first start of the next: sans I/O.

What the previous boot left, each read once at that start:

- the agent's own stop mark (``device-stop.json`` in the state directory): written once,
  durably, when the agent stops in order (systemd stops it at a shutdown or a reboot), and
  taken away by the next start; it says the boot it was written in and who asked for the
  reboot where the agent knows (``fleet``: a reboot or poweroff command was running);
- the recovery ladder's reboots (screen/reboots.py's book, which keeps each with its boot
  and why): a mark written in the boot of the ladder's newest reboot says the ladder;
- pstore (``/sys/fs/pstore``, dmesg-* records the kernel kept over the reset, root's to
  read), or systemd-pstore's archive of them (``/var/lib/systemd/pstore``, readable): a
  panic or an oops newer than the mark;
- the watchdog's ``bootstatus`` (WDIOF_CARDRESET): the hardware watchdog reset the board.

The cause, most telling first: ``panic`` (pstore), ``watchdog`` (bootstatus), ``clean``
(the mark: by the ladder, the fleet, or an operator or the OS), ``first-start`` (no mark,
and nothing in the state directory is older than this boot: there was no agent in the
boot before to leave one), else ``power-loss``: the boot ended with no clean
record (a power cut, a reset, or a kill the agent did not see).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from ..config.revision import finite

PANIC, WATCHDOG, CLEAN, POWER_LOSS, FIRST = (
    "panic", "watchdog", "clean", "power-loss", "first-start")
CAUSES = (CLEAN, POWER_LOSS, WATCHDOG, PANIC, FIRST)
EVENT = "device.boot"
MARK_FILE = "device-stop.json"
MARK_MAX_BYTES = 1024
WDIOF_CARDRESET = 0x0020
BY_FLEET, BY_LADDER, BY_OPERATOR = "fleet", "ladder", "operator"
MAX_TEXT = 120


@dataclass(frozen=True)
class StopMark:
    """What an orderly stop leaves on the card for the next boot's first start."""
    wall: float            # when the agent stopped (wall time: said, never timed)
    boot: str              # the kernel's boot id then
    by: str = ""           # who asked for the reboot, where the agent knows: fleet
    # how the boot before the one it was written in ended: a start later in the same boot
    # (a service restart empties the runtime directory) says it again from here
    ended: "BootEnd | None" = None


def mark_bytes(mark: StopMark) -> bytes:
    return json.dumps({"wall": round(mark.wall, 3), "boot": mark.boot[:64],
                       "by": mark.by[:16],
                       "ended": mark.ended.details() if mark.ended else None}).encode()


def parse_mark(raw: bytes) -> StopMark:
    """The mark's bytes; ValueError for anything but what mark_bytes() writes (the agent
    user's file: a number of 400 digits is none, never an OverflowError)."""
    doc = json.loads(raw)
    if not isinstance(doc, dict):
        raise ValueError("not an object")
    wall, boot, by = doc.get("wall"), doc.get("boot"), doc.get("by", "")
    if (finite(wall) is None or not isinstance(boot, str) or len(boot) > 64
            or not isinstance(by, str) or len(by) > 16):
        raise ValueError("a mark without its time and boot")
    return StopMark(float(wall), boot, by, from_details(doc.get("ended")))


@dataclass(frozen=True)
class Crash:
    """One pstore record: its file's name, what it is (panic, oops), when (wall)."""
    name: str
    kind: str
    wall: float


def crash_kind(name: str, head: str) -> str | None:
    """A pstore record's kind from its name and first line ("Panic#1 Part1", "Oops#1
    Part1"); None for records that are no crash (a console log, a user's message)."""
    if not name.startswith("dmesg-"):
        return None
    first = head.lstrip().lower()
    if first.startswith("panic") or "kernel panic" in first:
        return "panic"
    if first.startswith("oops"):
        return "oops"
    return "panic" if first.startswith("emergency") else None


@dataclass(frozen=True)
class BootEnd:
    """How the last boot ended, as judged at this boot's first start."""
    cause: str
    by: str | None = None           # clean: ladder, fleet or operator
    why: str = ""                   # the ladder's reason, the crash record's name
    at: float | None = None         # when (the mark's or the crash's wall time)

    def details(self) -> dict:
        return {"cause": self.cause, "by": self.by, "why": self.why or None,
                "at": None if self.at is None else round(self.at, 3)}

    def words(self) -> str:
        if self.cause == CLEAN:
            who = {BY_LADDER: "the screen's recovery ladder", BY_FLEET: "the fleet",
                   BY_OPERATOR: "an operator or the OS"}.get(self.by or "", "?")
            return f"a clean shutdown or reboot, asked by {who}" + (
                f" ({self.why})" if self.why else "")
        if self.cause == PANIC:
            return f"a kernel panic or oops ({self.why}, kept by pstore)"
        if self.cause == WATCHDOG:
            return "a reset by the hardware watchdog"
        if self.cause == FIRST:
            return "nothing known: the agent's first start here"
        return "no clean record: a power loss, or a reset the agent did not see"


def judge(mark: StopMark | None, crashes: list[Crash], watchdog_status: int | None,
          ladder: tuple[str, str] | None, first_run: bool = False) -> BootEnd:
    """``mark``: the previous boot's stop mark (None: none, or one that could not be
    read); ``crashes``: pstore's records; ``watchdog_status``: bootstatus; ``ladder``: the
    (boot, why) of the ladder's newest reboot before this boot; ``first_run``: the agent
    first ran here in this boot."""
    since = mark.wall if mark is not None else -math.inf
    recent = [c for c in crashes if c.wall > since]
    if recent:
        worst = max(recent, key=lambda c: (c.kind == "panic", c.kind != "crash", c.wall))
        return BootEnd(PANIC, why=f"{worst.kind} {worst.name}"[:MAX_TEXT], at=worst.wall)
    if watchdog_status is not None and watchdog_status & WDIOF_CARDRESET:
        return BootEnd(WATCHDOG)
    if mark is None:
        return BootEnd(FIRST if first_run else POWER_LOSS)
    if ladder is not None and mark.boot and ladder[0] == mark.boot:
        return BootEnd(CLEAN, BY_LADDER, ladder[1][:MAX_TEXT], mark.wall)
    return BootEnd(CLEAN, BY_FLEET if mark.by == BY_FLEET else BY_OPERATOR, at=mark.wall)


def from_details(doc: object) -> BootEnd | None:
    """A BootEnd as details() said it (kept on tmpfs for the later starts of a boot)."""
    if not isinstance(doc, dict) or doc.get("cause") not in CAUSES:
        return None
    by, why, at = doc.get("by"), doc.get("why") or "", doc.get("at")
    if by not in (None, BY_FLEET, BY_LADDER, BY_OPERATOR) or not isinstance(why, str):
        return None
    at = finite(at)
    return BootEnd(doc["cause"], by, why[:MAX_TEXT], at)
