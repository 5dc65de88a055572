"""Is the state directory usable? The rules for a dying SD card, sans I/O.

ext4 remounts itself read-only when it meets an error, and a worn card answers with
I/O errors: either way nothing the agent writes to the state directory sticks. The
link needs no disk, so the agent stays online, degraded: each part that needs the
disk says so once and holds (the upload queue, the command ledger, the credentials),
the journal says it once at ``err``, the fleet server is told with one event per
process, and `edge-agent status` exits 1. A failure is kept until the process ends:
a card that failed once is repaired by an operator (fsck, a new card), whose restart
looks again.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..base.card import FAILED, READ_ONLY, UNAVAILABLE, card_failure, describe
from ..events.model import Event, storage_failed

@dataclass(frozen=True)
class Notice:
    """What the shell does about one report: log ``message`` at ``level``, and send
    ``event`` (only with the first report of the process)."""
    level: int
    message: str
    event: Event | None


class StorageHealth:
    """Thread-safe: the parts report from their own threads."""

    def __init__(self, state_dir: str, wall: Callable[[], float] = time.time):
        self.state_dir = state_dir
        self._wall = wall
        self._lock = threading.Lock()
        self._first: dict | None = None
        self._parts: dict[str, str] = {}

    @property
    def ok(self) -> bool:
        return self._first is None

    def unavailable(self, part: str, path: str, error: BaseException, holds: str) -> Notice | None:
        """``part`` cannot use the disk at ``path`` because of ``error``; ``holds`` says
        what that part does meanwhile. The first report of the process is the alarm
        (err, and the event); a part's first report after it a warning; repeats nothing."""
        reason, code = describe(error)
        state = card_failure(error) or UNAVAILABLE
        with self._lock:
            if part in self._parts:
                return None
            self._parts[part] = reason
            first = self._first is None
            if first:
                self._first = {"state": state, "reason": reason, "errno": code, "path": path,
                               "part": part, "since": round(self._wall(), 3)}
        if not first:
            return Notice(logging.WARNING, f"{part}: storage unavailable: {reason} ({path}); "
                                           f"{holds}", None)
        what = {READ_ONLY: "the state partition is read-only",
                FAILED: "the state partition is failing"}.get(state, "the state directory is unusable")
        remedy = ("repair or replace the card" if state in (READ_ONLY, FAILED)
                  else f"make {path} usable again")
        return Notice(logging.ERROR,
                      f"storage unavailable: {what} ({reason}: {path}); running degraded, the "
                      f"link stays up; {part}: {holds}; {remedy}, then restart the agent",
                      storage_failed(self._wall(), state, reason, path, part, code))

    def snapshot(self) -> dict:
        """For the status file: {"state": "ok"}, or the first failure and every part held."""
        with self._lock:
            if self._first is None:
                return {"state": "ok"}
            return {**self._first, "parts": dict(self._parts)}
