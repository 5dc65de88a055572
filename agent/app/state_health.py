"""Is the state directory usable? The rules for a dying SD card (StorageHealth, sans I/O),
and what the agent does when a part reports one (StorageAlarms).

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
from ..base.journal_fields import MessageId, journal
from ..events.model import Event, storage_failed

log = logging.getLogger("edge_agent")


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


class StorageAlarms:
    """What the agent does when a part reports that it cannot use the card, from any
    thread, once per part: the journal, the server (once per process, through the
    outbox: until ACKed, across reconnects) and the status board. What is reported
    before the link has published its first state is held until release()."""

    def __init__(self, health: StorageHealth, queue_path: str):
        self.health = health
        self._queue_path = queue_path
        self._held: list[Event] | None = []
        self._publish: Callable[[Event], None] = lambda event: None
        self._refresh: Callable[[], None] = lambda: None

    def release(self, publish: Callable[[Event], None], refresh: Callable[[], None]) -> list:
        """From now on events go out and the board is refreshed; returns what was held.
        Called once, before the parts' threads start: nothing reports while it swaps."""
        self._publish, self._refresh = publish, refresh
        held, self._held = self._held or [], None
        return held

    def credentials(self, path: str, e: OSError) -> None:
        """A full disk is not a dying card: the identity service retries and says so in
        status itself; only a card that failed is the storage alarm."""
        if card_failure(e):
            self.unavailable("credentials", path, e, "the token is used from memory and "
                             "written again when the card takes it")

    def ledger(self, path: str, e: OSError) -> None:
        if card_failure(e):
            self.unavailable("command ledger", path, e,
                             "commands are refused until it can be written")
        else:
            log.error("cannot write the command ledger %s: %s; commands are refused until "
                      "it can be", path, e.strerror)

    def queue(self, e: Exception) -> None:
        self.unavailable("upload queue", self._queue_path, e, "uploads are held and nothing "
                         "new is queued; what is queued stays on the card")

    def unavailable(self, part: str, path: str, e: Exception, holds: str) -> None:
        notice = self.health.unavailable(part, path, e, holds)
        if notice is None:
            return
        log.log(notice.level, "%s", notice.message, extra=journal(
            MessageId.STORAGE_DEGRADED, EVENT=notice.event.type if notice.event else None))
        if notice.event is not None:
            if self._held is not None:
                self._held.append(notice.event)
            else:
                self._publish(notice.event)   # refreshes the status board too
                return
        if self._held is None:
            self._refresh()
