"""The inventory, kept: read now and then on a wake-up the link thread has anyway, read
again soon after the network returns (a new lease, maybe a new network), and sent only
when it is not what this process sent last. Reading it may take seconds (iw), so it is
read on a one-shot thread of its own, never two at once; what it costs the agent is
bounded by collect.py's limits, and a failure costs only that reading."""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from ..events.model import Event
from ..runtime.threads import start_worker

log = logging.getLogger("edge_agent")

# how often the inventory is read again (and sent if it changed)
EVERY_S = 600.0
# after the network returns: once DHCP had its moment
AFTER_NETWORK_S = 15.0


class Inventory:
    """``publish(event)`` sends a changed inventory; ``summary()`` is the dashboard's
    list columns (a profile's telemetry carries them)."""

    def __init__(self, publish: Callable[[Event], None], sysfs_root: str = "/sys",
                 clock: Callable[[], float] = time.monotonic):
        self._publish = publish
        self._sysfs_root = sysfs_root
        self._clock = clock
        self._digest: str | None = None
        self._summary: dict = {}
        self._due = 0.0
        self._busy = threading.Lock()

    def summary(self) -> dict:
        return self._summary

    def turn(self, now: float) -> None:
        """On a wake-up of the link thread: read it when it is due."""
        if now >= self._due:
            self._due = now + EVERY_S
            self._read_aside()

    def network_returned(self) -> None:
        self._due = self._clock() + AFTER_NETWORK_S

    def _read_aside(self) -> None:
        if not self._busy.acquire(blocking=False):
            return
        try:
            start_worker("inventory", self._read,
                         reason="iw and the sysfs reads may take seconds; each is bounded "
                                "by collect.py and one reading runs at a time")
        except BaseException:
            self._busy.release()
            raise

    def _read(self) -> None:
        from . import collect   # on this worker, after the start it would slow
        try:
            inv = collect.collect(sysfs_root=self._sysfs_root)
            self._summary = collect.summary(inv)
            digest = collect.digest(inv)
            if digest != self._digest:
                self._digest = digest
                self._publish(Event("device.inventory", time.time(),
                                    {"inventory": inv, "digest": digest}))
        except Exception:   # an inventory must never cost the agent
            log.exception("reading the inventory failed")
        finally:
            self._busy.release()
