"""The upload queue on the SD card (QueueStore): the rules for what may be queued, what
is dropped to make room or for its age, and what is due, over the spool of append-only
segment files whose index spool.py keeps (and whose bytes are segments.py's). An item
refused for good leaves its reason in the dead-letter file (deadletter.py); the queue of
earlier versions, in sqlite, is moved over when the store opens (migrate_sqlite.py).

Every operation holds ``lock`` (flock) and first reads what other processes appended
(`edge-agent enqueue`, the command thread): the files are the truth, memory an index. An
item whose payload fails its checksum when read, the last one included, goes to the
dead-letter file with that reason.

Due times are wall-clock seconds, the only clock that survives a reboot; a due time
further away than the backoff cap (a clock that jumped) counts as due now. A Pi has no
RTC: each item records whether the wall clock was synchronised when it was stamped, and
age is judged by `schedule.expired`, so a clock that jumps when NTP syncs never empties
the queue. Such an item is aged from the first synchronised time seen after it was
queued, which a clock record in the spool keeps for every process (spool.py).

A duplicate is an item whose idempotency key (``--key``, or a proof-of-play record's
``play_id``) is queued or was sent within the dedupe window, never equal content: two
plays of the same clip are two records. The key is the item's id, and so its
Idempotency-Key on the wire; an item without one gets a uuid.

`edge-agent enqueue` may run as root in a directory the agent's user owns. Every file
here is opened relative to the queue directory's descriptor with O_NOFOLLOW and must be
a regular file with one link: a link planted in the spool is refused, never followed.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import stat
import threading
import time
from dataclasses import dataclass

from ..base.clock import wall_synced
from ..base.card import READ_ONLY, card_failure
from ..base.upload_kinds import KINDS, LOG, PROOF_OF_PLAY, SCREENSHOT
from . import deadletter, segments
from ..config.policies import UploadPolicy
from .schedule import expired
from .segments import DEAD, DROPPED, FAILED, SENT
from .spool import Entry, Spool

log = logging.getLogger("edge_agent.uploads")

# An idempotency key: what a server and a header can carry, and short enough to store
KEY_RE = re.compile(r"[A-Za-z0-9._:-]{1,64}\Z")
KEY_RULE = "1 to 64 of A-Z a-z 0-9 . _ : -"
# the field of a proof-of-play JSON record that names the play: its idempotency key
PLAY_KEY_FIELD = "play_id"
OLD_QUEUE = "queue.db"   # an earlier version's queue, beside the spool (migrate_sqlite.py)

# Old items and old dedupe records are swept at most this often, not on every enqueue.
EXPIRE_EVERY_S = 3600.0

# Free space the state partition must keep for a kind to be queued at all: as the
# disk fills, screenshots stop first, then logs; proof-of-play goes on to the end.
MIN_FREE_BYTES = {SCREENSHOT: 64 << 20, LOG: 16 << 20, PROOF_OF_PLAY: 0}


class QueueUnavailable(Exception):
    """The queue cannot be used now (locked, unreadable): nothing was touched."""


class QueueDiskFull(QueueUnavailable):
    pass


class QueueStorageFailed(QueueUnavailable):
    """The card under the queue is read-only or failing (EROFS, EIO): nothing can be
    queued or settled until it is repaired; what is queued stays where it is."""

    def __init__(self, path: str, error: OSError):
        self.state = card_failure(error)
        super().__init__(f"the state partition is "
                         f"{'read-only' if self.state == READ_ONLY else 'failing'}: "
                         f"{path}: {error.strerror or error}")


def _as_storage_failure(path: str, e: BaseException) -> BaseException:
    return QueueStorageFailed(path, e) if isinstance(e, OSError) and card_failure(e) else e


class QueueUnsafe(QueueUnavailable):
    """A name in the spool is a link or not a regular file: refused, not followed."""


class QueueRefused(Exception):
    """This item was not queued; the queue itself is fine. ``reason`` names why."""
    reason = "refused"


class TooLarge(QueueRefused):
    reason = "too-large"


class DiskLow(QueueRefused):
    reason = "disk-low"


class QueueFull(QueueRefused):
    reason = "full"


class Duplicate(QueueRefused):
    reason = "duplicate"


def check_key(key: str, field: str = "--key") -> str:
    if not isinstance(key, str) or not KEY_RE.match(key):
        raise ValueError(f"{field}: must be {KEY_RULE}")
    return key


def item_key(kind: str, payload: bytes, key: str | None = None) -> str | None:
    """The idempotency key of an item: the caller's, else a proof-of-play record's
    ``play_id``; None if it has neither (then it is never a duplicate)."""
    if key is not None:
        return check_key(key)
    if kind != PROOF_OF_PLAY or not payload.lstrip().startswith(b"{"):
        return None
    try:
        record = json.loads(payload)
    except ValueError:
        return None
    except RecursionError:   # a record nested thousands deep: refused, not a traceback
        raise ValueError(f"{PLAY_KEY_FIELD}: the record is nested too deeply to read") from None
    if not isinstance(record, dict) or PLAY_KEY_FIELD not in record:
        return None
    return check_key(record[PLAY_KEY_FIELD], PLAY_KEY_FIELD)


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@dataclass
class Item:
    """One queued upload, as the store hands it to the sender."""
    id: str
    kind: str
    payload: bytes
    attempts: int
    next_attempt_at: float
    created_at: float


class QueueStore:
    def __init__(self, path: str, policy: UploadPolicy, timeout_s: float = 5.0,
                 synced=wall_synced):
        self.path = path
        self.synced = synced               # () -> bool: is the wall clock trustworthy now
        self.timeout_s = timeout_s
        self.policy = policy
        self.dropped: dict[str, int] = {}  # reason -> count, reported in status
        self.free_bytes = lambda: free_bytes(self.path)
        self._refusing: set[str] = set()   # kinds refused for lack of space, logged once
        self._expired_at = float("-inf")
        self._mutex = threading.RLock()
        self._dir_fd = self._lock_fd = -1
        os.makedirs(path, mode=0o700, exist_ok=True)   # a link to a directory passes here...
        try:   # ...and is refused here
            self._dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise QueueUnsafe(f"{path}: a symbolic link or not a directory; "
                                  f"refusing to follow it") from None
            raise
        self._spool = Spool(path, self._dir_fd, self._open, self._count)
        self._dead_letter = deadletter.DeadLetterFile(self._dir_fd, self._open)
        try:
            self._lock_fd = self._open("lock", os.O_RDWR | os.O_CREAT)
            with self._locked():
                self._migrate_sqlite()
        except BaseException as e:
            self.close()
            failure = _as_storage_failure(path, e)
            if failure is e:
                raise
            raise failure from e

    def _open(self, name: str, flags: int, mode: int = 0o600) -> int:
        """A file of the spool, never through a link, only a regular file of one link."""
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=self._dir_fd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise QueueUnsafe(f"{os.path.join(self.path, name)}: a symbolic link; "
                                  f"refusing to follow it") from None
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            raise QueueUnsafe(f"{os.path.join(self.path, name)}: not a regular file of one "
                              f"link; refusing to use it")
        return fd

    # -- locking, and reading what is on disk (the spool's) -------------------------
    def _locked(self):
        return _Locked(self)

    def _acquire(self) -> None:
        self._mutex.acquire()
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    self._mutex.release()
                    raise QueueUnavailable(f"{self.path} is locked by another process "
                                           f"(waited {self.timeout_s:g}s)") from None
                time.sleep(0.01)
        try:
            self._spool.refresh()
        except BaseException:
            self._release()
            raise

    def _release(self) -> None:
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        self._mutex.release()

    # -- enqueue ----------------------------------------------------------------
    def enqueue(self, kind: str, payload: bytes, now: float | None = None,
                key: str | None = None) -> str | None:
        """Queues one item; returns its id, or None if it was refused (see `add`)."""
        try:
            return self.add(kind, payload, now, key)
        except QueueRefused:
            return None

    def add(self, kind: str, payload: bytes, now: float | None = None,
            key: str | None = None) -> str:
        """Queues one item and returns its id once it is on the card. Raises a
        QueueRefused (TooLarge, DiskLow, QueueFull, Duplicate) if it was not queued,
        ValueError for a bad kind or key, QueueUnavailable if the queue cannot be used."""
        if kind not in KINDS:
            raise ValueError(f"unknown upload kind {kind!r} (one of {', '.join(KINDS)})")
        key = item_key(kind, payload, key)
        now = time.time() if now is None else now
        synced = self.synced()
        digest = segments.digest(kind, payload)
        size = len(payload)
        p = self.policy
        limit = min(p.max_bytes, p.max_item_bytes)
        if size > limit:
            self._count("too-large")
            log.warning("dropping a %s of %d bytes: larger than one upload may be (%d)", kind,
                        size, limit)
            raise TooLarge(f"{size} bytes is larger than one upload may be ({limit})")
        if not self._space_for(kind, size):
            self._count(f"disk-low:{kind}")
            raise DiskLow(f"the state partition is nearly full ({self.free_bytes() >> 20} MiB "
                          f"free; a {kind} must leave {MIN_FREE_BYTES[kind] >> 20} MiB)")
        with self._locked():
            if key is not None and self._spool.known(key, now - p.dedupe_window_s):
                self._count("duplicate")
                raise Duplicate(f"an item with key {key} is queued or was sent in the last "
                                f"{p.dedupe_window_s:g}s")
            self._spool.note_clock(now, synced)
            self._expire(now, synced)
            if not self._make_room(kind, size, now):
                self._count(f"full:{kind}")
                raise QueueFull(f"the queue is full of items that outrank a {kind} "
                                f"({self._spool.n_items} items, {self._spool.n_bytes} bytes)")
            try:
                return self._spool.append_item(kind, payload, digest, now, key=key,
                                               synced=synced).id
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    self._count(f"disk-full:{kind}")
                    raise QueueDiskFull(str(e)) from None
                raise

    def _space_for(self, kind: str, size: int) -> bool:
        try:
            free = self.free_bytes()
        except OSError:
            return True
        ok = free - size > MIN_FREE_BYTES[kind]
        if not ok and kind not in self._refusing:
            self._refusing.add(kind)
            log.warning("state partition nearly full (%d MiB free): not queueing %ss until "
                        "space returns", free >> 20, kind)
        elif ok and kind in self._refusing:
            self._refusing.discard(kind)
            log.info("space is back on the state partition: queueing %ss again", kind)
        return ok

    def _expire(self, now: float, synced: bool) -> None:
        if abs(now - self._expired_at) < EXPIRE_EVERY_S:
            return
        self._expired_at = now
        max_age = self.policy.max_age_days * 86400
        old = [e for e in self._spool.live.values()
               if expired(e.created_at, e.synced, now, synced, e.aged_from, max_age)]
        for entry in old:
            self._spool.settle(entry, DROPPED, now)
        if old:
            self._count("too-old", len(old))
            log.warning("dropped %d queued uploads older than %g days", len(old),
                        self.policy.max_age_days)
        self._spool.forget_sent(now - self.policy.dedupe_window_s)
        self._spool.collect(now, self.policy.dedupe_window_s)

    def _make_room(self, kind: str, size: int, now: float) -> bool:
        """Drops the oldest items of the lowest-priority kinds until ``size`` fits."""
        p = self.policy
        spool = self._spool
        while spool.n_items >= p.max_items or spool.n_bytes + size > p.max_bytes:
            victims = [e for e in spool.live.values() if KINDS[e.kind] <= KINDS[kind]]
            if not victims:
                return False
            # oldest by when it was queued, not by its stamp: a clock that was wrong
            # then must not make an item look older than it is
            victim = min(victims, key=lambda e: (KINDS[e.kind], e.seg, e.off))
            self._spool.settle(victim, DROPPED, now)
            self._count(f"evicted:{victim.kind}")
            log.warning("upload queue full: dropped the oldest queued %s", victim.kind)
        return True

    # -- the worker's side ------------------------------------------------------
    def due(self, now: float, limit: int, max_bytes: int | None = None) -> list[Item]:
        """Up to ``limit`` due items, oldest due first, whose payloads together stay
        within ``max_bytes`` (at least one): memory follows a budget, not the backlog."""
        cap = self.policy.cap_s * 1.5
        with self._locked():
            self._spool.note_clock(now, self._spool.unaged and self.synced())
            due = sorted((e for e in self._spool.live.values()
                          if e.next_at <= now or e.next_at > now + cap),
                         key=lambda e: (e.next_at, e.seg, e.off))
            items, total = [], 0
            for entry in due:
                if len(items) >= limit or (items and max_bytes is not None
                                           and total + entry.size > max_bytes):
                    break
                payload = self._spool.payload(entry)
                if payload is None:
                    self._dead(entry, "damaged on the SD card (checksum mismatch)", time.time())
                    continue
                items.append(Item(entry.id, entry.kind, payload, entry.attempts, entry.next_at,
                                  entry.created_at))
                total += entry.size
            return items

    def earliest_due(self) -> float | None:
        with self._locked():
            return min((e.next_at for e in self._spool.live.values()), default=None)

    def confirmed(self, items: list[Item], now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._locked():
            for item in items:
                entry = self._spool.live.get(item.id)
                if entry is not None:
                    self._spool.settle(entry, SENT, now)
            self._spool.collect(now, self.policy.dedupe_window_s)

    def failed(self, item: Item, next_attempt_at: float) -> None:
        with self._locked():
            entry = self._spool.live.get(item.id)
            if entry is not None:
                self._spool.settle(entry, FAILED, time.time(), entry.attempts + 1, next_attempt_at)

    def dead(self, item: Item, reason: str, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._locked():
            entry = self._spool.live.get(item.id)
            if entry is not None:
                self._dead(entry, reason, now)
            self._spool.collect(now, self.policy.dedupe_window_s)

    def _dead(self, entry: Entry, reason: str, now: float) -> None:
        """The reason is on the card (fsync'd) before the item may go."""
        self._dead_letter.append(deadletter.line(entry.id, entry.kind, entry.digest.hex(),
                                                 entry.created_at, now, reason[:200]))
        self._spool.settle(entry, DEAD, now)

    def dead_letters(self) -> list[dict]:
        return self._dead_letter.records()

    def stats(self) -> dict:
        with self._locked():
            count, total = self._spool.n_items, self._spool.n_bytes
            dead = self._dead_letter.count()
            # the index holds items in the order they were queued: the first is the oldest
            oldest = next(iter(self._spool.live.values()), None)
        return {"items": count, "bytes": total, "dead_letter": dead, "dropped": dict(self.dropped),
                "oldest_at": oldest.created_at if oldest is not None else None}

    def close(self) -> None:
        with self._mutex:
            self._spool.close()
            for name in ("_lock_fd", "_dir_fd"):
                if getattr(self, name) >= 0:
                    os.close(getattr(self, name))
                    setattr(self, name, -1)

    # -- the queue of earlier versions --------------------------------------------
    def _migrate_sqlite(self) -> None:
        """Moves what an earlier version queued in sqlite into the spool, then deletes
        the database: an upgrade loses nothing."""
        old_path = os.path.join(os.path.dirname(os.path.abspath(self.path)), OLD_QUEUE)
        if not os.path.isfile(old_path):
            return   # as on every start after the upgrade: its reader is not even loaded
        from . import migrate_sqlite
        old = migrate_sqlite.old_queue(old_path)
        if old is None:
            return
        for item in old.items:
            entry = self._spool.append_item(item.kind, item.payload,
                                            segments.digest(item.kind, item.payload),
                                            item.created_at, item.raw_id)
            if item.attempts:
                self._spool.settle(entry, FAILED, time.time(), item.attempts, item.next_attempt_at)
        if old.dead_letters:
            self._dead_letter.append(old.dead_letters)
        old.remove()
        log.info("moved %d queued uploads from %s (an earlier version's queue) into %s",
                 len(old.items), old.path, self.path)

    # -- internals --------------------------------------------------------------
    def _count(self, reason: str, n: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + n


class _Locked:
    def __init__(self, store: QueueStore):
        self.store = store

    def __enter__(self):
        try:
            self.store._acquire()
        except OSError as e:
            failure = _as_storage_failure(self.store.path, e)
            if failure is e:
                raise
            raise failure from e

    def __exit__(self, _type, e, _tb):
        self.store._release()
        failure = _as_storage_failure(self.store.path, e) if e is not None else None
        if failure is not None and failure is not e:
            raise failure from e
        return False
