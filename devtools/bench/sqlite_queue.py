"""The upload queue as it was until the spool (sqlite, WAL, synchronous=FULL), kept as the
baseline the benchmark measures the spool against, and as the format an upgrade migrates
from. Not used by the agent.
"""
from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import time
import uuid

from agent.base.upload_kinds import KINDS
from agent.config.policies import UploadPolicy
# What the spool kept from this design: its errors, items and free-space rule.
from agent.uploads.store import Item, QueueDiskFull, QueueUnavailable, QueueStore as SpoolStore, free_bytes

log = logging.getLogger("edge_agent.uploads")

SCHEMA = """
CREATE TABLE IF NOT EXISTS items(
    id TEXT PRIMARY KEY, kind TEXT NOT NULL, payload BLOB NOT NULL,
    content_hash TEXT NOT NULL, size INTEGER NOT NULL, created_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0, next_attempt_at REAL NOT NULL, last_error TEXT);
CREATE INDEX IF NOT EXISTS items_due ON items(next_attempt_at);
CREATE INDEX IF NOT EXISTS items_hash ON items(content_hash);
CREATE INDEX IF NOT EXISTS items_kind_age ON items(kind, created_at);
-- expiry walks items_kind_age kind by kind, hourly: one index less to write per item
DROP INDEX IF EXISTS items_age;
-- running totals kept by triggers, so bounds are checked without scanning the queue
CREATE TABLE IF NOT EXISTS totals(id INTEGER PRIMARY KEY CHECK (id = 1),
    count INTEGER NOT NULL, bytes INTEGER NOT NULL);
INSERT OR IGNORE INTO totals SELECT 1, COUNT(*), COALESCE(SUM(size), 0) FROM items;
CREATE TRIGGER IF NOT EXISTS items_add AFTER INSERT ON items BEGIN
    UPDATE totals SET count = count + 1, bytes = bytes + NEW.size WHERE id = 1; END;
CREATE TRIGGER IF NOT EXISTS items_remove AFTER DELETE ON items BEGIN
    UPDATE totals SET count = count - 1, bytes = bytes - OLD.size WHERE id = 1; END;
CREATE TABLE IF NOT EXISTS dead_letter(
    id TEXT PRIMARY KEY, kind TEXT NOT NULL, content_hash TEXT NOT NULL,
    created_at REAL NOT NULL, failed_at REAL NOT NULL, reason TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sent(content_hash TEXT PRIMARY KEY, sent_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS sent_age ON sent(sent_at);
"""


class QueueCorrupt(sqlite3.DatabaseError):
    """sqlite's own integrity check failed."""


PAGE_SIZE = 1024
# Old items and old dedupe records are swept at most this often, not on every enqueue.
EXPIRE_EVERY_S = 3600.0
# How long opening waits for another process (`edge-agent enqueue`) to let go.
LOCKED_WAIT_S = 30.0
CORRUPTION = ("SQLITE_CORRUPT", "SQLITE_NOTADB")


class QueueStore:
    def __init__(self, path: str, policy: UploadPolicy, timeout_s: float = 5.0):
        self.path = path
        self.timeout_s = timeout_s
        self.policy = policy
        self.dropped: dict[str, int] = {}  # reason -> count, reported in status
        self.free_bytes = lambda: free_bytes(os.path.dirname(self.path) or ".")
        self._refusing: set[str] = set()   # kinds refused for lack of space, logged once
        self._expired_at = float("-inf")
        self.db = self._open()

    # -- opening ----------------------------------------------------------------
    def _open(self) -> sqlite3.Connection:
        """Only a database sqlite itself calls corrupt is moved aside (kept for
        inspection) for a fresh one; a locked or unreadable one is left as it is."""
        os.makedirs(os.path.dirname(self.path) or ".", mode=0o700, exist_ok=True)
        deadline = time.monotonic() + LOCKED_WAIT_S
        while True:
            try:
                return self._connect()
            except QueueCorrupt as e:
                return self._move_aside(e)
            except sqlite3.DatabaseError as e:
                name = getattr(e, "sqlite_errorname", "")
                if name in CORRUPTION:
                    return self._move_aside(e)
                if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                raise QueueUnavailable(f"{self.path}: {e}") from None

    def _move_aside(self, e: Exception) -> sqlite3.Connection:
        aside = f"{self.path}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}"
        log.error("upload queue %s is corrupt (%s); moved aside to %s, starting a fresh "
                  "queue", self.path, e, aside)
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(self.path + suffix):
                os.replace(self.path + suffix, aside + suffix)
        return self._connect()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None,
                             check_same_thread=False)
        try:
            # Small pages for a new queue: every commit writes each page it touches,
            # so a 2 KiB item costs a few KiB, not a few 4 KiB pages (no effect on an
            # existing file).
            db.execute(f"PRAGMA page_size={PAGE_SIZE}")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            ok = db.execute("PRAGMA quick_check").fetchone()
            if not ok or ok[0] != "ok":
                raise QueueCorrupt(f"quick_check: {ok[0] if ok else 'no answer'}")
            db.executescript(SCHEMA)
        except sqlite3.DatabaseError:
            db.close()
            raise
        os.chmod(self.path, 0o600)
        return db

    def close(self) -> None:
        self.db.close()

    # -- enqueue ----------------------------------------------------------------
    def enqueue(self, kind: str, payload: bytes, now: float | None = None) -> str | None:
        """Queues one item; returns its id, or None if it was a duplicate or dropped."""
        if kind not in KINDS:
            raise ValueError(f"unknown upload kind {kind!r} (one of {', '.join(KINDS)})")
        now = time.time() if now is None else now
        digest = hashlib.sha256(kind.encode() + b"\0" + payload).hexdigest()
        size = len(payload)
        p = self.policy
        if not self._space_for(kind, size):
            self._count(f"disk-low:{kind}")
            return None
        if size > min(p.max_bytes, p.max_item_bytes):
            self._count("too-large")
            log.warning("dropping a %s of %d bytes: larger than one upload may be (%d)", kind,
                        size, min(p.max_bytes, p.max_item_bytes))
            return None
        try:
            with self._tx():
                if self.db.execute("SELECT 1 FROM items WHERE content_hash=? LIMIT 1",
                                   (digest,)).fetchone() or self.db.execute(
                        "SELECT 1 FROM sent WHERE content_hash=? AND sent_at>=?",
                        (digest, now - p.dedupe_window_s)).fetchone():
                    self._count("duplicate")
                    return None
                self._expire(now)
                if not self._make_room(kind, size):
                    self._count(f"full:{kind}")
                    return None
                item_id = uuid.uuid4().hex
                self.db.execute(
                    "INSERT INTO items(id, kind, payload, content_hash, size, created_at,"
                    " next_attempt_at) VALUES(?,?,?,?,?,?,?)",
                    (item_id, kind, sqlite3.Binary(payload), digest, size, now, now))
                return item_id
        except sqlite3.OperationalError as e:
            if "full" in str(e).lower():
                self._count(f"disk-full:{kind}")
                raise QueueDiskFull(str(e)) from None
            raise

    _space_for = SpoolStore._space_for   # the same rule, kept in one place

    def _expire(self, now: float) -> None:
        if abs(now - self._expired_at) < EXPIRE_EVERY_S:
            return
        self._expired_at = now
        cutoff = now - self.policy.max_age_days * 86400
        n = sum(self.db.execute("DELETE FROM items WHERE kind = ? AND created_at < ?",
                                (kind, cutoff)).rowcount for kind in KINDS)
        if n:
            self._count("too-old", n)
            log.warning("dropped %d queued uploads older than %g days", n, self.policy.max_age_days)
        self.db.execute("DELETE FROM sent WHERE sent_at < ?", (now - self.policy.dedupe_window_s,))

    def _make_room(self, kind: str, size: int) -> bool:
        """Evicts the oldest items of the lowest-priority kinds until ``size`` fits."""
        p = self.policy
        while True:
            count, total = self._totals()
            if count < p.max_items and total + size <= p.max_bytes:
                return True
            victim = None
            for victim_kind in sorted(KINDS, key=KINDS.get):
                if KINDS[victim_kind] > KINDS[kind]:
                    break
                victim = self.db.execute(
                    "SELECT id FROM items WHERE kind=? ORDER BY created_at LIMIT 1",
                    (victim_kind,)).fetchone()
                if victim:
                    self.db.execute("DELETE FROM items WHERE id=?", victim)
                    self._count(f"evicted:{victim_kind}")
                    log.warning("upload queue full: dropped the oldest queued %s", victim_kind)
                    break
            if not victim:
                return False

    # -- the worker's side ------------------------------------------------------
    def due(self, now: float, limit: int, max_bytes: int | None = None) -> list[Item]:
        """Up to ``limit`` due items, oldest due first, whose payloads together stay
        within ``max_bytes`` (at least one): memory follows a budget, not the backlog."""
        cap = self.policy.cap_s * 1.5
        meta = "SELECT id, size FROM items WHERE next_attempt_at {} ? ORDER BY next_attempt_at LIMIT ?"
        rows = self.db.execute(meta.format("<="), (now, limit)).fetchall()
        if len(rows) < limit:
            # due times beyond the cap come from a clock that jumped back: due now
            rows += self.db.execute(meta.format(">"), (now + cap, limit - len(rows))).fetchall()
        chosen, total = [], 0
        for item_id, size in rows:
            if chosen and max_bytes is not None and total + size > max_bytes:
                break
            chosen.append(item_id)
            total += size
        items = []
        for item_id in chosen:  # one payload at a time into the list: no double copy
            r = self.db.execute("SELECT id, kind, payload, attempts, next_attempt_at, created_at "
                                "FROM items WHERE id=?", (item_id,)).fetchone()
            if r is not None:
                items.append(Item(r[0], r[1], bytes(r[2]), r[3], r[4], r[5]))
        return items

    def earliest_due(self) -> float | None:
        row = self.db.execute("SELECT MIN(next_attempt_at) FROM items").fetchone()
        return row[0] if row else None

    def confirmed(self, items: list[Item], now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._tx():
            for item in items:
                row = self.db.execute("SELECT content_hash FROM items WHERE id=?", (item.id,)).fetchone()
                self.db.execute("DELETE FROM items WHERE id=?", (item.id,))
                if row:
                    self.db.execute("INSERT OR REPLACE INTO sent(content_hash, sent_at) VALUES(?,?)",
                                    (row[0], now))

    def failed(self, item: Item, next_attempt_at: float, error: str = "") -> None:
        self.db.execute("UPDATE items SET attempts=attempts+1, next_attempt_at=?, last_error=? "
                        "WHERE id=?", (next_attempt_at, error[:200], item.id))

    def dead(self, item: Item, reason: str, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._tx():
            row = self.db.execute("SELECT content_hash FROM items WHERE id=?", (item.id,)).fetchone()
            self.db.execute("DELETE FROM items WHERE id=?", (item.id,))
            self.db.execute("INSERT OR REPLACE INTO dead_letter VALUES(?,?,?,?,?,?)",
                            (item.id, item.kind, row[0] if row else "", item.created_at, now,
                             reason[:200]))

    def _totals(self) -> tuple[int, int]:
        return self.db.execute("SELECT count, bytes FROM totals WHERE id = 1").fetchone()

    def stats(self) -> dict:
        count, total = self._totals()
        dead = self.db.execute("SELECT COUNT(*) FROM dead_letter").fetchone()[0]
        return {"items": count, "bytes": total, "dead_letter": dead, "dropped": dict(self.dropped)}

    # -- internals --------------------------------------------------------------
    _count = SpoolStore._count

    def _tx(self):
        return _Transaction(self.db)


class _Transaction:
    def __init__(self, db):
        self.db = db

    def __enter__(self):
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, *_):
        self.db.execute("COMMIT" if exc_type is None else "ROLLBACK")
        return False
