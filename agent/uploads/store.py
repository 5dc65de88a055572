"""The upload queue on the SD card: a spool of append-only segment files.

Each enqueue appends one record to the newest segment, starting on a page of its own, and
fdatasyncs it: the payload and a 73-byte header, nothing else, before it returns, so an item the caller was
told is queued survives kill -9 and a power cut. What becomes of an item (sent, failed
with its next try, refused for good, dropped) is a 27-byte record appended to the
segment's ``.ack`` file without a sync: losing the tail of it to a power cut only means
an item is sent again, which the server absorbs by its Idempotency-Key, or retried
sooner. A segment whose items are all settled is deleted (after the dedupe window, so a
restarted agent still knows what it sent). sqlite, which this replaces, wrote each page
twice (WAL, then checkpoint) plus index and freelist pages: 19 KB per 2 KB enqueue and
26 KB per confirmed send; `scripts/bench` measures both side by side.

Every operation holds ``lock`` (flock) and first reads what other processes appended
(`edge-agent enqueue`, the command thread): the files are the truth, memory an index.
Under the lock nobody is mid-append, so an incomplete record at the end of a file is the
remains of a writer that died (or of a power cut) and is cut off; a damaged record in
the middle is skipped to the next good one, and an item whose payload fails its checksum
when read goes to the dead-letter file with that reason, never silently.

Due times are wall-clock seconds, the only clock that survives a reboot; a due time
further away than the backoff cap (a clock that jumped) counts as due now.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import sqlite3
import struct
import threading
import time
import uuid
import zlib
from dataclasses import dataclass

from .schedule import KINDS, UploadPolicy

log = logging.getLogger("edge_agent.uploads")

# magic, payload length, crc32 of the payload, crc32 of the metadata that follows
SEG_HEAD = struct.Struct("<4sIII")
SEG_META = struct.Struct("<Bd16s32s")        # kind, created_at (wall), id, sha256
SEG_MAGIC = b"EAQ1"
HEADER_BYTES = SEG_HEAD.size + SEG_META.size
# Each item starts on a page of its own: a sync writes the pages it dirtied, so an item
# sharing its first page with the one before would write that page a second time.
PAGE = 4096
# crc32 of the rest; record offset in the segment, state, attempts, at, next try (wall)
ACK_BODY = struct.Struct("<IBHdd")
ACK_BYTES = 4 + ACK_BODY.size
SENT, FAILED, DEAD, DROPPED = 1, 2, 3, 4
KIND_CODES = {"screenshot": 1, "log": 2, "proof-of-play": 3}
KIND_NAMES = {v: k for k, v in KIND_CODES.items()}

SEGMENT_BYTES = 4 << 20
# Old items and old dedupe records are swept at most this often, not on every enqueue.
EXPIRE_EVERY_S = 3600.0
DEAD_LETTER = "dead-letter.jsonl"
DEAD_LETTER_MAX_BYTES = 1 << 20     # then it becomes .1: the last ~10,000 reasons are kept

# Free space the state partition must keep for a kind to be queued at all: as the
# disk fills, screenshots stop first, then logs; proof-of-play goes on to the end.
MIN_FREE_BYTES = {"screenshot": 64 << 20, "log": 16 << 20, "proof-of-play": 0}


class QueueUnavailable(Exception):
    """The queue cannot be used now (locked, unreadable): nothing was touched."""


class QueueDiskFull(QueueUnavailable):
    pass


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
    seg: int
    off: int
    kind: str
    created_at: float
    id: str
    digest: bytes
    size: int
    payload_crc: int
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
    def __init__(self, path: str, policy: UploadPolicy, timeout_s: float = 5.0):
        self.path = path
        self.timeout_s = timeout_s
        self.policy = policy
        self.dropped: dict[str, int] = {}  # reason -> count, reported in status
        self.free_bytes = lambda: free_bytes(self.path)
        self._refusing: set[str] = set()   # kinds refused for lack of space, logged once
        self._expired_at = float("-inf")
        self._segs: dict[int, _Segment] = {}
        self._live: dict[str, _Entry] = {}
        self._hashes: dict[bytes, int] = {}
        self._sent: dict[bytes, float] = {}
        self._n_items = self._n_bytes = 0
        self._dead_counted: tuple[list, int] = ([], 0)   # (files' stat, lines)
        self._mutex = threading.RLock()
        os.makedirs(path, mode=0o700, exist_ok=True)
        self._lock_fd = os.open(os.path.join(path, "lock"),
                                os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._own(os.path.join(path, "lock"))
        with self._locked():
            self._migrate_sqlite()

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
        names = set(os.listdir(self.path))
        present = {int(n[:-4]) for n in names if n.endswith(".seg") and n[:-4].isdigit()}
        for number in set(self._segs) - present:   # settled and deleted by another process
            self._forget(number)
        for n in names:
            if n.endswith(".ack") and n[:-4].isdigit() and int(n[:-4]) not in present:
                os.unlink(os.path.join(self.path, n))  # its segment went first, then we died
        for number in sorted(present):
            seg = self._segs.get(number)
            if seg is None:
                fd = os.open(self._file(number, "seg"), os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
                seg = self._segs[number] = _Segment(number, fd)
            self._read_items(seg)
            self._read_outcomes(seg)

    def _read_items(self, seg: _Segment) -> None:
        size = os.fstat(seg.fd).st_size
        pos = seg.read_off
        while pos < size:
            entry = self._parse(seg, pos, size)
            if entry is None:
                good = self._next_good(seg, pos, size)
                if good is None:
                    # the end of a torn append; we hold the lock, so nobody is writing it
                    log.warning("upload queue %s: cut off an incomplete item at its end (%d "
                                "bytes: an enqueue that never returned)",
                                self._file(seg.number, "seg"), size - pos)
                    os.ftruncate(seg.fd, pos)
                    break
                pos = good
                continue
            seg.entries[pos] = entry
            self._add(entry)
            pos += _padded(HEADER_BYTES + entry.size)
        if pos > size:  # a writer died in the padding of an item that is whole
            os.ftruncate(seg.fd, pos)
        seg.read_off = pos

    def _parse(self, seg: _Segment, pos: int, size: int) -> _Entry | None:
        head = os.pread(seg.fd, HEADER_BYTES, pos)
        if len(head) < HEADER_BYTES:
            return None
        magic, length, payload_crc, meta_crc = SEG_HEAD.unpack_from(head)
        meta = head[SEG_HEAD.size:]
        if magic != SEG_MAGIC or zlib.crc32(meta) != meta_crc or pos + HEADER_BYTES + length > size:
            return None
        kind, created, raw_id, digest = SEG_META.unpack(meta)
        if kind not in KIND_NAMES:
            return None
        if pos + _padded(HEADER_BYTES + length) >= size:
            # the last record is where a writer that died left its work: check it whole
            if zlib.crc32(os.pread(seg.fd, length, pos + HEADER_BYTES)) != payload_crc:
                return None
        return _Entry(seg.number, pos, KIND_NAMES[kind], created, raw_id.hex(), digest,
                      length, payload_crc, next_at=created)

    def _next_good(self, seg: _Segment, pos: int, size: int) -> int | None:
        """Where the next good record after damage at ``pos`` starts, if one does."""
        probe = pos + 1
        while probe < size:
            chunk = os.pread(seg.fd, min(1 << 20, size - probe), probe)
            at = chunk.find(SEG_MAGIC)
            if at < 0:
                probe += max(1, len(chunk) - len(SEG_MAGIC) + 1)
                continue
            if self._parse(seg, probe + at, size) is not None:
                self._count("damaged")
                log.error("upload queue %s: skipped %d damaged bytes at offset %d",
                          self._file(seg.number, "seg"), probe + at - pos, pos)
                return probe + at
            probe += at + 1
        return None

    def _read_outcomes(self, seg: _Segment) -> None:
        if seg.ack_fd is None:
            try:
                seg.ack_fd = os.open(self._file(seg.number, "ack"),
                                     os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
            except FileNotFoundError:
                return
        size = os.fstat(seg.ack_fd).st_size
        if size <= seg.ack_off:
            return
        data = os.pread(seg.ack_fd, size - seg.ack_off, seg.ack_off)
        whole = len(data) - len(data) % ACK_BYTES
        for i in range(0, whole, ACK_BYTES):
            crc, = struct.unpack_from("<I", data, i)
            body = data[i + 4:i + ACK_BYTES]
            if zlib.crc32(body) == crc:
                self._apply(seg, *ACK_BODY.unpack(body))
        if whole < len(data):  # a torn outcome: the item is simply not settled
            os.ftruncate(seg.ack_fd, seg.ack_off + whole)
        seg.ack_off += whole

    def _apply(self, seg: _Segment, off: int, state: int, attempts: int, at: float,
               next_at: float) -> None:
        entry = seg.entries.get(off)
        if entry is None or entry.settled:
            return
        if state == FAILED:
            entry.attempts, entry.next_at = attempts, next_at
            return
        if state == SENT:
            self._sent[entry.digest] = max(at, self._sent.get(entry.digest, at))
            seg.last_sent = max(seg.last_sent, at)
        entry.settled = True
        seg.live -= 1
        self._drop_from_index(entry)

    def _add(self, entry: _Entry) -> None:
        self._segs[entry.seg].live += 1
        self._live[entry.id] = entry
        self._hashes[entry.digest] = self._hashes.get(entry.digest, 0) + 1
        self._n_items += 1
        self._n_bytes += entry.size

    def _drop_from_index(self, entry: _Entry) -> None:
        if self._live.pop(entry.id, None) is None:
            return
        left = self._hashes.get(entry.digest, 1) - 1
        if left:
            self._hashes[entry.digest] = left
        else:
            self._hashes.pop(entry.digest, None)
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
        return os.path.join(self.path, f"{number:08d}.{ext}")

    def _own(self, path: str) -> None:
        """`edge-agent enqueue` run as root must leave files the agent's user can use."""
        if os.geteuid() == 0:
            st = os.stat(self.path)
            if st.st_uid != 0:
                os.chown(path, st.st_uid, st.st_gid)

    def _segment_for(self, length: int) -> _Segment:
        if self._segs:
            last = self._segs[max(self._segs)]
            if last.read_off == 0 or last.read_off + length <= SEGMENT_BYTES:
                return last
        number = max(self._segs, default=0) + 1
        path = self._file(number, "seg")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self._own(path)
        _reserve(fd, SEGMENT_BYTES)
        _fsync_dir(self.path)   # the new name must survive a power cut with its first item
        seg = self._segs[number] = _Segment(number, fd)
        return seg

    def _append_item(self, kind: str, payload: bytes, digest: bytes, now: float,
                     raw_id: bytes | None = None) -> _Entry:
        raw_id = raw_id or uuid.uuid4().bytes
        meta = SEG_META.pack(KIND_CODES[kind], now, raw_id, digest)
        crc = zlib.crc32(payload)
        record = SEG_HEAD.pack(SEG_MAGIC, len(payload), crc, zlib.crc32(meta)) + meta
        length = _padded(len(record) + len(payload))
        seg = self._segment_for(length)
        try:
            _write_all(seg.fd, record + payload + bytes(length - len(record) - len(payload)))
            os.fdatasync(seg.fd)
        except OSError:
            os.ftruncate(seg.fd, seg.read_off)  # nothing half-written stays behind
            raise
        entry = _Entry(seg.number, seg.read_off, kind, now, raw_id.hex(), digest, len(payload),
                       crc, next_at=now)
        seg.entries[seg.read_off] = entry
        seg.read_off += length
        self._add(entry)
        return entry

    def _settle(self, entry: _Entry, state: int, at: float, attempts: int = 0,
                next_at: float = 0.0) -> None:
        seg = self._segs.get(entry.seg)
        if seg is None or entry.settled:
            return
        if seg.ack_fd is None:
            path = self._file(seg.number, "ack")
            seg.ack_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            self._own(path)
        body = ACK_BODY.pack(entry.off, state, min(attempts, 0xFFFF), at, next_at)
        _write_all(seg.ack_fd, struct.pack("<I", zlib.crc32(body)) + body)
        seg.ack_off += ACK_BYTES
        self._apply(seg, entry.off, state, attempts, at, next_at)

    def _collect(self, now: float) -> None:
        """Deletes segments whose items are all settled (never the newest, which takes
        the next item), once what they sent is out of the dedupe window."""
        newest = max(self._segs, default=None)
        for number, seg in list(self._segs.items()):
            if number == newest or seg.live or now - seg.last_sent < self.policy.dedupe_window_s:
                continue
            os.unlink(self._file(number, "seg"))
            try:
                os.unlink(self._file(number, "ack"))
            except FileNotFoundError:
                pass
            self._forget(number)

    # -- enqueue ----------------------------------------------------------------
    def enqueue(self, kind: str, payload: bytes, now: float | None = None) -> str | None:
        """Queues one item; returns its id, or None if it was a duplicate or dropped."""
        if kind not in KINDS:
            raise ValueError(f"unknown upload kind {kind!r} (one of {', '.join(KINDS)})")
        now = time.time() if now is None else now
        digest = hashlib.sha256(kind.encode() + b"\0" + payload).digest()
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
        with self._locked():
            if digest in self._hashes or self._sent.get(digest, float("-inf")) >= now - p.dedupe_window_s:
                self._count("duplicate")
                return None
            self._expire(now)
            if not self._make_room(kind, size, now):
                self._count(f"full:{kind}")
                return None
            try:
                return self._append_item(kind, payload, digest, now).id
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

    def _expire(self, now: float) -> None:
        if abs(now - self._expired_at) < EXPIRE_EVERY_S:
            return
        self._expired_at = now
        cutoff = now - self.policy.max_age_days * 86400
        old = [e for e in self._live.values() if e.created_at < cutoff]
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
            victim = min(victims, key=lambda e: (KINDS[e.kind], e.created_at))
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
            due = sorted((e for e in self._live.values()
                          if e.next_at <= now or e.next_at > now + cap),
                         key=lambda e: (e.next_at, e.seg, e.off))
            items, total = [], 0
            for entry in due:
                if len(items) >= limit or (items and max_bytes is not None
                                           and total + entry.size > max_bytes):
                    break
                payload = os.pread(self._segs[entry.seg].fd, entry.size, entry.off + HEADER_BYTES)
                if zlib.crc32(payload) != entry.payload_crc:
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

    def failed(self, item: Item, next_attempt_at: float, error: str) -> None:
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
        path = os.path.join(self.path, DEAD_LETTER)
        line = json.dumps({"id": entry.id, "kind": entry.kind, "sha256": entry.digest.hex(),
                           "created_at": entry.created_at, "failed_at": now,
                           "reason": reason[:200]}) + "\n"
        try:
            if os.path.getsize(path) > DEAD_LETTER_MAX_BYTES:
                os.replace(path, path + ".1")
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self._own(path)
        self._settle(entry, DEAD, now)

    def dead_letters(self) -> list[dict]:
        out = []
        for name in (DEAD_LETTER + ".1", DEAD_LETTER):
            try:
                with open(os.path.join(self.path, name), encoding="utf-8") as f:
                    out += [json.loads(line) for line in f if line.endswith("\n")]
            except (FileNotFoundError, ValueError):
                pass
        return out

    def _dead_letter_count(self) -> int:
        """Lines in the dead-letter files, counted again only when they changed: stats()
        runs on every status refresh, the files hold up to ~20,000 reasons."""
        key, paths = [], [os.path.join(self.path, n) for n in (DEAD_LETTER + ".1", DEAD_LETTER)]
        for path in paths:
            try:
                st = os.stat(path)
                key.append((st.st_ino, st.st_size, st.st_mtime_ns))
            except FileNotFoundError:
                key.append(None)
        if key != self._dead_counted[0]:
            count = 0
            for path, stamp in zip(paths, key):
                if stamp is not None:
                    with open(path, "rb") as f:
                        count += f.read().count(b"\n")
            self._dead_counted = (key, count)
        return self._dead_counted[1]

    def stats(self) -> dict:
        with self._locked():
            count, total = self._n_items, self._n_bytes
            dead = self._dead_letter_count()
        return {"items": count, "bytes": total, "dead_letter": dead, "dropped": dict(self.dropped)}

    def close(self) -> None:
        with self._mutex:
            for seg in self._segs.values():
                seg.close()
            self._segs.clear()
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1

    # -- the queue of earlier versions --------------------------------------------
    def _migrate_sqlite(self) -> None:
        """Moves what an earlier version queued in ``queue.db`` next to the spool into
        it, then deletes the database: an upgrade loses nothing."""
        old = os.path.join(os.path.dirname(os.path.abspath(self.path)), "queue.db")
        if not os.path.isfile(old):
            return
        try:
            db = sqlite3.connect(old, timeout=30)
            try:
                rows = db.execute("SELECT id, kind, payload, created_at, attempts, next_attempt_at "
                                  "FROM items ORDER BY created_at").fetchall()
                dead = db.execute("SELECT id, kind, content_hash, created_at, failed_at, reason "
                                  "FROM dead_letter").fetchall()
            finally:
                db.close()
        except sqlite3.DatabaseError as e:
            aside = f"{old}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}"
            log.error("the upload queue of an earlier version (%s) cannot be read (%s); moved "
                      "aside to %s", old, e, aside)
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(old + suffix):
                    os.replace(old + suffix, aside + suffix)
            return
        moved = 0
        for _id, kind, payload, created, attempts, next_at in rows:
            if kind not in KIND_CODES:
                continue
            payload = bytes(payload)
            digest = hashlib.sha256(kind.encode() + b"\0" + payload).digest()
            try:  # the same Idempotency-Key: a send in flight at the upgrade is not stored twice
                raw_id = uuid.UUID(hex=_id).bytes
            except (ValueError, TypeError, AttributeError):
                raw_id = None
            entry = self._append_item(kind, payload, digest, created, raw_id)
            if attempts:
                self._settle(entry, FAILED, time.time(), attempts, next_at)
            moved += 1
        if dead:
            with open(os.path.join(self.path, DEAD_LETTER), "a", encoding="utf-8") as f:
                for row in dead:
                    f.write(json.dumps(dict(zip(("id", "kind", "sha256", "created_at",
                                                 "failed_at", "reason"), row))) + "\n")
                f.flush()
                os.fsync(f.fileno())
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(old + suffix):
                os.unlink(old + suffix)
        log.info("moved %d queued uploads from %s (an earlier version's queue) into %s",
                 moved, old, self.path)

    # -- internals --------------------------------------------------------------
    def _count(self, reason: str, n: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + n


class _Locked:
    def __init__(self, store: QueueStore):
        self.store = store

    def __enter__(self):
        self.store._acquire()

    def __exit__(self, *_):
        self.store._release()
        return False


def _padded(length: int) -> int:
    return -(-length // PAGE) * PAGE


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


_libc = None


def _reserve(fd: int, length: int) -> None:
    """Allocates the segment's blocks up front, past its end (its size still says where
    the items end): an enqueue's sync then writes its pages and the inode, not also the
    allocation bitmaps. Best effort: a file system without fallocate just allocates as
    it goes."""
    global _libc
    try:
        if _libc is None:
            import ctypes
            import ctypes.util
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
        _libc.fallocate(fd, 1, 0, length)   # 1: FALLOC_FL_KEEP_SIZE
    except (OSError, AttributeError):
        pass


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
