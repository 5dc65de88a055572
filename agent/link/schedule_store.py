"""Backoff state that survives a process restart, kept on tmpfs (the runtime directory).

When systemd restarts a wedged agent, the new process must continue the jittered
schedule instead of hitting the server at once: a site of restarted agents would
otherwise arrive together. CLOCK_MONOTONIC is system-wide, so a deadline from the
previous process stays meaningful within one boot; the boot id guards the rest.
Written only when the schedule changes (a failure, a stable link), never per
heartbeat, and never to the SD card. Beside it, how many watchdog restarts the
current outage has cost (runtime/watchdog_gate.py, OutagePatience): written when the pets stop
for one, and when a proven link ends it.
"""
from __future__ import annotations

import json
import logging

from ..base.boot import boot_id
from ..base.fsutil import an_object, atomic_write, load_state

log = logging.getLogger("edge_agent.link")


class ScheduleStore:
    def __init__(self, path: str):
        self.path = path
        self._last: tuple | None = None
        self._outage_restarts = 0
        self._left: dict | None = None   # what the previous process left, read once

    def _read(self) -> dict:
        if self._left is None:
            self._left = self._read_file()
        return self._left

    def _read_file(self) -> dict:
        doc, why = load_state(self.path, 4096, an_object)
        if why is not None:
            log.warning("ignoring unreadable backoff state %s (%s)", self.path, why)
        return doc if doc is not None and doc.get("boot_id") == boot_id() else {}

    def outage_restarts(self) -> int:
        """The watchdog restarts the current outage has cost, as a previous process of
        this boot left the count (read once, at start)."""
        n = self._read().get("outage_restarts")
        self._outage_restarts = n if isinstance(n, int) and not isinstance(n, bool) \
            and 0 <= n < 10_000 else 0
        return self._outage_restarts

    def keep_outage_restarts(self, n: int) -> None:
        if n != self._outage_restarts:
            self._outage_restarts = n
            self._write(*(self._last or (0, 0.0)))

    def load(self) -> tuple[int, float | None]:
        """(attempts, resume_at monotonic) from a previous process of this boot."""
        doc = self._read()
        if not doc:
            return 0, None
        attempts, resume_at = doc.get("attempts"), doc.get("next_attempt_mono")
        if isinstance(attempts, bool) or not isinstance(attempts, int) or not 0 <= attempts < 10_000:
            return 0, None
        if isinstance(resume_at, bool) or not isinstance(resume_at, (int, float)):
            resume_at = None
        return attempts, resume_at

    def save(self, attempts: int, next_attempt_mono: float) -> None:
        state = (attempts, round(next_attempt_mono, 3))
        if state == self._last:
            return
        self._last = state
        self._write(*state)

    def _write(self, attempts: int, next_attempt_mono: float) -> None:
        try:
            atomic_write(self.path, json.dumps({
                "boot_id": boot_id(), "attempts": attempts, "next_attempt_mono": next_attempt_mono,
                "outage_restarts": self._outage_restarts}).encode(), 0o600, durable=False)
        except OSError as e:
            log.warning("cannot keep backoff state in %s: %s", self.path, e.strerror)
