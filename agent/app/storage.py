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

import errno
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..events.model import Event, storage_failed

READ_ONLY, FAILED, UNAVAILABLE = "read-only", "failed", "unavailable"
# What the card says when it is the card, not us: read-only after an ext4 error, an I/O
# error, a file system ext4 found corrupt (EUCLEAN), a card gone from its slot.
_CARD_ERRNOS = {errno.EROFS: READ_ONLY, errno.EIO: FAILED, errno.EUCLEAN: FAILED,
                errno.ENODEV: FAILED, errno.ENXIO: FAILED}


def card_failure(e: BaseException | None) -> str | None:
    """READ_ONLY or FAILED when ``e`` (or what it was raised from) says the card itself
    failed; None for everything else (a full disk, a permission, a bug)."""
    seen = 0
    while e is not None and seen < 5:
        if isinstance(e, OSError) and e.errno in _CARD_ERRNOS:
            return _CARD_ERRNOS[e.errno]
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


def describe(e: BaseException) -> tuple[str, str | None]:
    """(the reason in words, the errno's name) of the OSError at the root of ``e``."""
    root = e
    while not isinstance(root, OSError) and (root.__cause__ or root.__context__) is not None:
        root = root.__cause__ or root.__context__
    if isinstance(root, OSError) and root.errno is not None:
        return (root.strerror or str(root)), errno.errorcode.get(root.errno)
    return str(e) or type(e).__name__, None


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
