"""Backoff state that survives a process restart, kept on tmpfs (the runtime directory).

When systemd restarts a wedged agent, the new process must continue the jittered
schedule instead of hitting the server at once: a site of restarted agents would
otherwise arrive together. CLOCK_MONOTONIC is system-wide, so a deadline from the
previous process stays meaningful within one boot; the boot id guards the rest.
Written only when the schedule changes (a failure, a stable link), never per
heartbeat, and never to the SD card.
"""
from __future__ import annotations

import json
import logging

from ..boot import boot_id
from ..fsutil import atomic_write, read_json

log = logging.getLogger("edge_agent.link")


class ScheduleStore:
    def __init__(self, path: str):
        self.path = path
        self._last: tuple | None = None

    def load(self) -> tuple[int, float | None]:
        """(attempts, resume_at monotonic) from a previous process of this boot."""
        try:
            doc = read_json(self.path, 4096)
        except FileNotFoundError:
            return 0, None
        except (OSError, ValueError):
            log.warning("ignoring unreadable backoff state %s", self.path)
            return 0, None
        if not isinstance(doc, dict) or doc.get("boot_id") != boot_id():
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
        try:
            atomic_write(self.path, json.dumps({"boot_id": boot_id(), "attempts": attempts,
                                                "next_attempt_mono": state[1]}).encode(),
                         0o600, durable=False)
        except OSError as e:
            log.warning("cannot keep backoff state in %s: %s", self.path, e.strerror)
