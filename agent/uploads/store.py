"""The upload queue on the SD card (QueueStore): the index of a spool of append-only
segment files, and the rules for what may be queued.

Each enqueue appends one record to the newest segment and fdatasyncs it, nothing else,
before it returns, so an item the caller was told is queued survives kill -9 and a power
cut. What becomes of an item (sent, failed with its next try, refused for good, dropped)
is an outcome record appended to the segment's ``.ack`` file without a sync: losing the
tail of it to a power cut only means an item is sent again, which the server absorbs by
its Idempotency-Key, or retried sooner. A segment whose items are all settled is deleted
(after the dedupe window if it sent keyed items, so a restarted agent still knows which
keys it sent). The bytes of both files are segments.py's; an item refused for good
leaves its reason in the dead-letter file (deadletter.py). sqlite, which this replaces
(migrate_sqlite.py moves its items over), wrote each page twice (WAL, then checkpoint)
plus index and freelist pages: 19 KB per 2 KB enqueue and 26 KB per confirmed send;
`scripts/bench` measures both side by side.

Every operation holds ``lock`` (flock) and first reads what other processes appended
(`edge-agent enqueue`, the command thread): the files are the truth, memory an index.
A damaged record is skipped, counted ("damaged") and logged, never silently. An item
whose payload fails its checksum when read, the last one included, goes to the
dead-letter file with that reason.

Due times are wall-clock seconds, the only clock that survives a reboot; a due time
further away than the backoff cap (a clock that jumped) counts as due now. A Pi has no
RTC: each item records whether the wall clock was synchronised when it was stamped, and
age is judged by `schedule.expired`, so a clock that jumps when NTP syncs never empties
the queue. Such an item is aged from the first synchronised time seen after it was
queued: the first store to see the clock synchronised while such items are queued
appends a clock record to the newest segment's ``.ack`` file (no sync, once), so every
process, `edge-agent enqueue` too, ages them alike. Lost to a power cut, it is written
again later: the items only live longer.

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
import uuid
from dataclasses import dataclass

from ..base.clock import wall_synced
from ..base.card import READ_ONLY, card_failure
from ..base.upload_kinds import KINDS, LOG, PROOF_OF_PLAY, SCREENSHOT
from . import deadletter, migrate_sqlite, segments
from .schedule import UploadPolicy, expired
from .segments import CLOCK, DEAD, DROPPED, FAILED, SENT

log = logging.getLogger("edge_agent.uploads")

# An idempotency key: what a server and a header can carry, and short enough to store
KEY_RE = re.compile(r"[A-Za-z0-9._:-]{1,64}\Z")
KEY_RULE = "1 to 64 of A-Z a-z 0-9 . _ : -"
# the field of a proof-of-play JSON record that names the play: its idempotency key
PLAY_KEY_FIELD = "play_id"

SEGMENT_BYTES = 4 << 20
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
    id: str
    kind: str
    payload: bytes
    attempts: int
    next_attempt_at: float
    created_at: float


@dataclass(slots=True, eq=False)
class _Entry:
    """A queued item in the index: its record (segments.Record's fields, in that order,
    after where it is) and what its outcomes said."""
    seg: int
    off: int
    kind: str
    created_at: float
    id: str
    digest: bytes
    size: int
    payload_crc: int
    head: int
    key: str | None
    synced: bool
    aged_from: float | None = None  # not synced: when the clock was next seen synchronised
    attempts: int = 0
    next_at: float = 0.0
    settled: bool = False


class _Segment:
    def __init__(self, number: int, fd: int):
        self.number, self.fd = number, fd
        self.read_off = 0            # bytes of items parsed
        self.ack_fd: int | None = None
        self.ack_off = 0             # bytes of outcomes applied
        self.entries: dict[int, _Entry] = {}
        self.live = 0
        self.last_sent = float("-inf")

    def close(self) -> None:
        for fd in (self.fd, self.ack_fd):
            if fd is not None:
                os.close(fd)


class QueueStore:
    def __init__(self, path: str, policy: UploadPolicy, timeout_s: float = 5.0,
                 synced=wall_synced):
        self.path = path
        self.synced = synced               # () -> bool: is the wall clock trustworthy now
        self._unaged = False               # an item stamped unsynchronised may lack aged_from
        self._odd_names: set[str] = set()  # names in the spool that are none of ours, logged once
        self.timeout_s = timeout_s
        self.policy = policy
        self.dropped: dict[str, int] = {}  # reason -> count, reported in status
        self.free_bytes = lambda: free_bytes(self.path)
        self._refusing: set[str] = set()   # kinds refused for lack of space, logged once
        self._expired_at = float("-inf")
        self._segs: dict[int, _Segment] = {}
        self._live: dict[str, _Entry] = {}
        self._sent: dict[str, float] = {}  # idempotency key -> when it was sent
        self._n_items = self._n_bytes = 0
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

    # -- locking and reading what is on disk ---------------------------------------
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
            self._refresh()
        except BaseException:
            self._release()
            raise

    def _release(self) -> None:
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        self._mutex.release()

    def _refresh(self) -> None:
        """Brings the index up to what the files say, appended by whoever."""
        ours: dict[str, tuple[int, str]] = {}
        for n in os.listdir(self._dir_fd):
            parsed = segments.parse_name(n)
            if parsed is not None:
                ours[n] = parsed
            elif n.endswith((".seg", ".ack")) and n not in self._odd_names:
                self._odd_names.add(n)
                log.warning("upload queue %s: %r is not a name the queue writes; ignored",
                            self.path, n)
        present = {number for number, ext in ours.values() if ext == "seg"}
        for number in set(self._segs) - present:   # settled and deleted by another process
            self._forget(number)
        for n, (number, ext) in ours.items():
            if ext == "ack" and number not in present:
                os.unlink(n, dir_fd=self._dir_fd)  # its segment went first, then we died
        for number in sorted(present):
            seg = self._segs.get(number)
            if seg is None:
                fd = self._open(segments.file_name(number, "seg"), os.O_RDWR | os.O_APPEND)
                seg = self._segs[number] = _Segment(number, fd)
            self._read_items(seg)
            self._read_outcomes(seg)

    def _read_items(self, seg: _Segment) -> None:
        # we hold the lock, so nobody is writing it: an incomplete record at its end is cut off
        found, seg.read_off, damaged = segments.scan(seg.fd, seg.read_off,
                                                     self._file(seg.number, "seg"))
        if damaged:
            self._count("damaged", damaged)
        for pos, record in found:
            entry = seg.entries[pos] = _Entry(seg.number, pos, *record, next_at=record.created_at)
            self._add(entry)

    def _read_outcomes(self, seg: _Segment) -> None:
        if seg.ack_fd is None:
            try:
                seg.ack_fd = self._open(segments.file_name(seg.number, "ack"),
                                        os.O_RDWR | os.O_APPEND)
            except FileNotFoundError:
                return
        outcomes, seg.ack_off = segments.read_outcomes(seg.ack_fd, seg.ack_off)
        for outcome in outcomes:
            self._apply(seg, *outcome)

    def _apply(self, seg: _Segment, off: int, state: int, attempts: int, at: float,
               next_at: float) -> None:
        if state == CLOCK:
            self._clock_seen(seg.number, off, at)
            return
        entry = seg.entries.get(off)
        if entry is None or entry.settled:
            return
        if state == FAILED:
            entry.attempts, entry.next_at = attempts, next_at
            return
        if state == SENT and entry.key is not None:
            self._sent[entry.key] = max(at, self._sent.get(entry.key, at))
            seg.last_sent = max(seg.last_sent, at)  # its keys must outlive a restart
        entry.settled = True
        seg.live -= 1
        self._drop_from_index(entry)

    def _clock_seen(self, number: int, off: int, at: float) -> None:
        """The clock was synchronised at ``at``: the items stamped unsynchronised and
        queued before (``number``, ``off``) age from then, unless an earlier record said so."""
        for entry in self._live.values():
            if not entry.synced and entry.aged_from is None and (entry.seg, entry.off) < (number, off):
                entry.aged_from = at

    def _note_clock(self, now: float, synced: bool) -> None:
        """Writes a clock record if the clock is synchronised and an item stamped while it
        was not has no time to age from yet: once, not per item, and never synced."""
        if not synced or not self._unaged:
            return
        self._unaged = False
        if self._segs and any(not e.synced and e.aged_from is None for e in self._live.values()):
            seg = self._segs[max(self._segs)]
            try:
                self._write_outcome(seg, max(seg.read_off - 1, 0), CLOCK, 0, now, 0.0)
            except OSError as e:
                if card_failure(e):
                    raise
                # reading what is due must not fail for it (a full disk): not noting it
                # only means those items live longer (tried again when another is queued)
                log.warning("upload queue %s: could not note that the clock is synchronised "
                            "(%s)", self.path, e.strerror or e)

    def _add(self, entry: _Entry) -> None:
        if not entry.synced:
            self._unaged = True
        self._segs[entry.seg].live += 1
        self._live[entry.id] = entry
        self._n_items += 1
        self._n_bytes += entry.size

    def _drop_from_index(self, entry: _Entry) -> None:
        # a key sent long ago may be queued again: only the newer entry is the live one
        if self._live.get(entry.id) is entry:
            del self._live[entry.id]
        self._n_items -= 1
        self._n_bytes -= entry.size

    def _forget(self, number: int) -> None:
        seg = self._segs.pop(number)
        for entry in seg.entries.values():
            if not entry.settled:
                self._drop_from_index(entry)
        seg.close()

    # -- writing ----------------------------------------------------------------
    def _file(self, number: int, ext: str) -> str:
        """For messages: every file is opened through the directory's descriptor."""
        return os.path.join(self.path, segments.file_name(number, ext))

    def _segment_for(self, length: int) -> _Segment:
        if self._segs:
            last = self._segs[max(self._segs)]
            if last.read_off == 0 or last.read_off + length <= SEGMENT_BYTES:
                return last
        number = max(self._segs, default=0) + 1
        fd = self._open(segments.file_name(number, "seg"),
                        os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND)
        segments.reserve(fd, SEGMENT_BYTES)
        os.fsync(self._dir_fd)   # the new name must survive a power cut with its first item
        seg = self._segs[number] = _Segment(number, fd)
        return seg

    def _append_item(self, kind: str, payload: bytes, digest: bytes, now: float,
                     raw_id: bytes | None = None, key: str | None = None,
                     synced: bool = True) -> _Entry:
        data, record = segments.item_record(kind, payload, digest, now,
                                            raw_id or uuid.uuid4().bytes, key, synced)
        seg = self._segment_for(len(data))
        try:
            segments.write_all(seg.fd, data)
            os.fdatasync(seg.fd)
        except OSError:
            os.ftruncate(seg.fd, seg.read_off)  # nothing half-written stays behind
            raise
        entry = seg.entries[seg.read_off] = _Entry(seg.number, seg.read_off, *record, next_at=now)
        seg.read_off += len(data)
        self._add(entry)
        return entry

    def _settle(self, entry: _Entry, state: int, at: float, attempts: int = 0,
                next_at: float = 0.0) -> None:
        seg = self._segs.get(entry.seg)
        if seg is None or entry.settled:
            return
        self._write_outcome(seg, entry.off, state, attempts, at, next_at)

    def _write_outcome(self, seg: _Segment, off: int, state: int, attempts: int, at: float,
                       next_at: float) -> None:
        if seg.ack_fd is None:
            seg.ack_fd = self._open(segments.file_name(seg.number, "ack"),
                                    os.O_RDWR | os.O_CREAT | os.O_APPEND)
        segments.write_all(seg.ack_fd, segments.outcome_record(off, state, attempts, at, next_at))
        seg.ack_off += segments.ACK_BYTES
        self._apply(seg, off, state, attempts, at, next_at)

    def _collect(self, now: float) -> None:
        """Deletes segments whose items are all settled (never the newest, which takes
        the next item), once what they sent is out of the dedupe window."""
        newest = max(self._segs, default=None)
        for number, seg in list(self._segs.items()):
            if number == newest or seg.live or now - seg.last_sent < self.policy.dedupe_window_s:
                continue
            os.unlink(segments.file_name(number, "seg"), dir_fd=self._dir_fd)
            try:
                os.unlink(segments.file_name(number, "ack"), dir_fd=self._dir_fd)
            except FileNotFoundError:
                pass
            self._forget(number)

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
            if key is not None and (key in self._live or self._sent.get(key, float("-inf"))
                                    >= now - p.dedupe_window_s):
                self._count("duplicate")
                raise Duplicate(f"an item with key {key} is queued or was sent in the last "
                                f"{p.dedupe_window_s:g}s")
            self._note_clock(now, synced)
            self._expire(now, synced)
            if not self._make_room(kind, size, now):
                self._count(f"full:{kind}")
                raise QueueFull(f"the queue is full of items that outrank a {kind} "
                                f"({self._n_items} items, {self._n_bytes} bytes)")
            try:
                return self._append_item(kind, payload, digest, now, key=key, synced=synced).id
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
        old = [e for e in self._live.values()
               if expired(e.created_at, e.synced, now, synced, e.aged_from, max_age)]
        for entry in old:
            self._settle(entry, DROPPED, now)
        if old:
            self._count("too-old", len(old))
            log.warning("dropped %d queued uploads older than %g days", len(old),
                        self.policy.max_age_days)
        window = now - self.policy.dedupe_window_s
        self._sent = {d: t for d, t in self._sent.items() if t >= window}
        self._collect(now)

    def _make_room(self, kind: str, size: int, now: float) -> bool:
        """Drops the oldest items of the lowest-priority kinds until ``size`` fits."""
        p = self.policy
        while self._n_items >= p.max_items or self._n_bytes + size > p.max_bytes:
            victims = [e for e in self._live.values() if KINDS[e.kind] <= KINDS[kind]]
            if not victims:
                return False
            # oldest by when it was queued, not by its stamp: a clock that was wrong
            # then must not make an item look older than it is
            victim = min(victims, key=lambda e: (KINDS[e.kind], e.seg, e.off))
            self._settle(victim, DROPPED, now)
            self._count(f"evicted:{victim.kind}")
            log.warning("upload queue full: dropped the oldest queued %s", victim.kind)
        return True

    # -- the worker's side ------------------------------------------------------
    def due(self, now: float, limit: int, max_bytes: int | None = None) -> list[Item]:
        """Up to ``limit`` due items, oldest due first, whose payloads together stay
        within ``max_bytes`` (at least one): memory follows a budget, not the backlog."""
        cap = self.policy.cap_s * 1.5
        with self._locked():
            self._note_clock(now, self._unaged and self.synced())
            due = sorted((e for e in self._live.values()
                          if e.next_at <= now or e.next_at > now + cap),
                         key=lambda e: (e.next_at, e.seg, e.off))
            items, total = [], 0
            for entry in due:
                if len(items) >= limit or (items and max_bytes is not None
                                           and total + entry.size > max_bytes):
                    break
                payload = segments.read_payload(self._segs[entry.seg].fd, entry.off + entry.head,
                                                entry.size, entry.payload_crc)
                if payload is None:
                    self._dead(entry, "damaged on the SD card (checksum mismatch)", time.time())
                    continue
                items.append(Item(entry.id, entry.kind, payload, entry.attempts, entry.next_at,
                                  entry.created_at))
                total += entry.size
            return items

    def earliest_due(self) -> float | None:
        with self._locked():
            return min((e.next_at for e in self._live.values()), default=None)

    def confirmed(self, items: list[Item], now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._locked():
            for item in items:
                entry = self._live.get(item.id)
                if entry is not None:
                    self._settle(entry, SENT, now)
            self._collect(now)

    def failed(self, item: Item, next_attempt_at: float) -> None:
        with self._locked():
            entry = self._live.get(item.id)
            if entry is not None:
                self._settle(entry, FAILED, time.time(), entry.attempts + 1, next_attempt_at)

    def dead(self, item: Item, reason: str, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._locked():
            entry = self._live.get(item.id)
            if entry is not None:
                self._dead(entry, reason, now)
            self._collect(now)

    def _dead(self, entry: _Entry, reason: str, now: float) -> None:
        """The reason is on the card (fsync'd) before the item may go."""
        self._dead_letter.append(deadletter.line(entry.id, entry.kind, entry.digest.hex(),
                                                 entry.created_at, now, reason[:200]))
        self._settle(entry, DEAD, now)

    def dead_letters(self) -> list[dict]:
        return self._dead_letter.records()

    def stats(self) -> dict:
        with self._locked():
            count, total = self._n_items, self._n_bytes
            dead = self._dead_letter.count()
        return {"items": count, "bytes": total, "dead_letter": dead, "dropped": dict(self.dropped)}

    def close(self) -> None:
        with self._mutex:
            for seg in self._segs.values():
                seg.close()
            self._segs.clear()
            for name in ("_lock_fd", "_dir_fd"):
                if getattr(self, name) >= 0:
                    os.close(getattr(self, name))
                    setattr(self, name, -1)

    # -- the queue of earlier versions --------------------------------------------
    def _migrate_sqlite(self) -> None:
        """Moves what an earlier version queued in sqlite into the spool, then deletes
        the database: an upgrade loses nothing."""
        old = migrate_sqlite.old_queue(self.path)
        if old is None:
            return
        for item in old.items:
            entry = self._append_item(item.kind, item.payload,
                                      segments.digest(item.kind, item.payload),
                                      item.created_at, item.raw_id)
            if item.attempts:
                self._settle(entry, FAILED, time.time(), item.attempts, item.next_attempt_at)
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
