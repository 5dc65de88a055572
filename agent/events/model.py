"""Events and the rules that make them from device state, sans I/O."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

_ids = itertools.count(1)


@dataclass
class Event:
    """A device event for the server: its type, when it happened, its details."""
    type: str               # display.connected, power.undervoltage, network.up, ...
    ts: float               # wall time when it happened (the original, kept through outages)
    details: dict = field(default_factory=dict)
    count: int = 1          # how many raw occurrences this one stands for
    id: int = field(default_factory=lambda: next(_ids))

    def payload(self) -> dict:
        return {"type": self.type, "ts": round(self.ts, 3), "count": self.count,
                "id": self.id, **self.details}


STORAGE_FAILED = "device.storage_failed"


def storage_failed(ts: float, state: str, reason: str, path: str, part: str,
                   errno_name: str | None) -> Event:
    """The state directory failed (docs/PROTOCOL.md): once per process, what an operator
    alerts on; the link, which needs no disk, carries it."""
    return Event(STORAGE_FAILED, ts, {"state": state, "reason": reason, "path": path,
                                      "part": part, "errno": errno_name})


def display_event(status: str) -> str | None:
    """`/sys/class/drm/card*-HDMI-A-*/status` as an event type."""
    status = status.strip()
    if status == "connected":
        return "display.connected"
    if status == "disconnected":
        return "display.disconnected"
    return None


class UndervoltageLatch:
    """The Pi firmware's undervoltage alarm, reported once per boot.

    The kernel's rpi_volt hwmon clears the firmware's sticky bit when read, so the
    alarm is latched here: the first 1 raises power.undervoltage, later ones only
    count, and the alarm going quiet is reported as power.restored once.
    """

    def __init__(self):
        self.seen = False
        self.active = False

    def feed(self, alarm: str) -> str | None:
        on = alarm.strip() == "1"
        if on and not self.active:
            self.active = True
            if not self.seen:
                self.seen = True
                return "power.undervoltage"
            return None
        if not on and self.active:
            self.active = False
            return "power.restored"
        return None


class NetworkState:
    """Is there a usable network (a non-loopback link up with carrier)? Reports edges."""

    def __init__(self):
        self.up: bool | None = None

    @staticmethod
    def usable(links: dict[str, tuple[str, str]]) -> list[str]:
        return sorted(name for name, (operstate, carrier) in links.items()
                      if name != "lo" and operstate in ("up", "unknown") and carrier == "1")

    def feed(self, links: dict[str, tuple[str, str]]) -> str | None:
        now_up = bool(self.usable(links))
        before, self.up = self.up, now_up
        if before is None:
            return None  # the first look is a baseline, not an event
        if now_up and not before:
            return "network.up"
        if before and not now_up:
            return "network.down"
        return None
