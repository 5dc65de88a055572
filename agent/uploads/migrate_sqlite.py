"""The upload queue of earlier versions: a sqlite database, ``queue.db``, beside the spool.

The store reads it when it opens the spool, moves what it holds into the spool and then
deletes it (`OldQueue.remove`): an upgrade loses nothing. A database that cannot be read
is moved aside, not deleted, for an operator to look at.
"""
from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass

from ..base.upload_kinds import KINDS
from . import deadletter

log = logging.getLogger("edge_agent.uploads")

_SUFFIXES = ("", "-wal", "-shm")


@dataclass(frozen=True)
class OldItem:
    """One upload an earlier version queued in sqlite."""
    kind: str
    payload: bytes
    created_at: float
    attempts: int
    next_attempt_at: float
    raw_id: bytes | None   # its id, so a send in flight at the upgrade is not stored twice


@dataclass(frozen=True)
class OldQueue:
    """An earlier version's sqlite queue: its items and dead letters."""
    path: str
    items: list[OldItem]
    dead_letters: str      # lines for the spool's dead-letter file

    def remove(self) -> None:
        for suffix in _SUFFIXES:
            if os.path.exists(self.path + suffix):
                os.unlink(self.path + suffix)


def old_queue(path: str) -> OldQueue | None:
    """What an earlier version queued in ``path`` (the store's OLD_QUEUE beside the
    spool), or None if there is no such queue (or it could not be read, and was moved
    aside)."""
    if not os.path.isfile(path):
        return None
    import sqlite3   # here: a start without an earlier version's queue loads no sqlite
    try:
        db = sqlite3.connect(path, timeout=30)
        try:
            rows = db.execute("SELECT id, kind, payload, created_at, attempts, next_attempt_at "
                              "FROM items ORDER BY created_at").fetchall()
            dead = db.execute("SELECT id, kind, content_hash, created_at, failed_at, reason "
                              "FROM dead_letter").fetchall()
        finally:
            db.close()
    except sqlite3.DatabaseError as e:
        aside = f"{path}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}"
        log.error("the upload queue of an earlier version (%s) cannot be read (%s); moved "
                  "aside to %s", path, e, aside)
        for suffix in _SUFFIXES:
            if os.path.exists(path + suffix):
                os.replace(path + suffix, aside + suffix)
        return None
    items = [OldItem(kind, bytes(payload), created, attempts, next_at, _raw_id(item_id))
             for item_id, kind, payload, created, attempts, next_at in rows if kind in KINDS]
    return OldQueue(path, items, "".join(deadletter.line(*row) for row in dead))


def _raw_id(item_id) -> bytes | None:
    try:
        return uuid.UUID(hex=item_id).bytes
    except (ValueError, TypeError, AttributeError):
        return None
