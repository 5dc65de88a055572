"""The upload spool's index: what its segment files and their outcome files say, kept up
to date with what any process appended, and the durable appends to them.

Each enqueue appends one record to the newest segment and fdatasyncs it, nothing else,
before it returns, so an item the caller was told is queued survives kill -9 and a power
cut. What becomes of an item (sent, failed with its next try, refused for good, dropped)
is an outcome record appended to the segment's ``.ack`` file without a sync: losing the
tail of it to a power cut only means an item is sent again, which the server absorbs by
its Idempotency-Key, or retried sooner. A segment whose items are all settled is deleted
(after the dedupe window if it sent keyed items, so a restarted agent still knows which
keys it sent). The bytes of both files are segments.py's. sqlite, which this replaces
(migrate_sqlite.py moves its items over), wrote each page twice (WAL, then checkpoint)
plus index and freelist pages: 19 KB per 2 KB enqueue and 26 KB per confirmed send;
`scripts/bench` measures both side by side.

The files are the truth, memory an index: `Spool.refresh` reads what other processes
appended (`edge-agent enqueue`, the command thread). A damaged record is skipped,
counted ("damaged") and logged, never silently.

An item stamped while the wall clock was not synchronised is aged from the first
synchronised time seen after it was queued: the first store to see the clock
synchronised while such items are queued appends a clock record to the newest segment's
``.ack`` file (no sync, once), so every process, `edge-agent enqueue` too, ages them
alike. Lost to a power cut, it is written again later: the items only live longer.

What may be queued, what is dropped to make room or for its age, and what is due are the
store's rules (store.py). It calls in here only under its lock, and opens every file for
the spool (``open_file``): never through a link, only a regular file of one link.
"""
from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass
from typing import Callable

from ..base.card import card_failure
from . import segments
from .segments import CLOCK, FAILED, SENT

log = logging.getLogger("edge_agent.uploads")

SEGMENT_BYTES = 4 << 20


@dataclass(slots=True, eq=False)
class Entry:
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


class Segment:
    def __init__(self, number: int, fd: int):
        self.number, self.fd = number, fd
        self.read_off = 0            # bytes of items parsed
        self.ack_fd: int | None = None
        self.ack_off = 0             # bytes of outcomes applied
        self.entries: dict[int, Entry] = {}
        self.live = 0
        self.last_sent = float("-inf")

    def close(self) -> None:
        for fd in (self.fd, self.ack_fd):
            if fd is not None:
                os.close(fd)


class Spool:
    """The index of the spool in the directory ``dir_fd`` (``path``, for messages).
    ``open_file`` (name, flags) -> fd is the store's; ``count`` (reason, n) counts what
    the index skips in the store's dropped counts."""

    def __init__(self, path: str, dir_fd: int, open_file: Callable[[str, int], int],
                 count: Callable[[str, int], None]):
        self.path = path
        self._dir_fd, self._open, self._count = dir_fd, open_file, count
        self.unaged = False                # an item stamped unsynchronised may lack aged_from
        self._odd_names: set[str] = set()  # names in the spool that are none of ours, logged once
        self._segs: dict[int, Segment] = {}
        self.live: dict[str, Entry] = {}
        self.sent: dict[str, float] = {}   # idempotency key -> when it was sent
        self.n_items = self.n_bytes = 0

    # -- reading what is on disk ------------------------------------------------------
    def refresh(self) -> None:
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
                seg = self._segs[number] = Segment(number, fd)
            self._read_items(seg)
            self._read_outcomes(seg)

    def _read_items(self, seg: Segment) -> None:
        # we hold the lock, so nobody is writing it: an incomplete record at its end is cut off
        found, seg.read_off, damaged = segments.scan(seg.fd, seg.read_off,
                                                     self._file(seg.number, "seg"))
        if damaged:
            self._count("damaged", damaged)
        for pos, record in found:
            entry = seg.entries[pos] = Entry(seg.number, pos, *record, next_at=record.created_at)
            self._add(entry)

    def _read_outcomes(self, seg: Segment) -> None:
        if seg.ack_fd is None:
            try:
                seg.ack_fd = self._open(segments.file_name(seg.number, "ack"),
                                        os.O_RDWR | os.O_APPEND)
            except FileNotFoundError:
                return
        outcomes, seg.ack_off = segments.read_outcomes(seg.ack_fd, seg.ack_off)
        for outcome in outcomes:
            self._apply(seg, *outcome)

    def _apply(self, seg: Segment, off: int, state: int, attempts: int, at: float,
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
            self.sent[entry.key] = max(at, self.sent.get(entry.key, at))
            seg.last_sent = max(seg.last_sent, at)  # its keys must outlive a restart
        entry.settled = True
        seg.live -= 1
        self._drop_from_index(entry)

    def _clock_seen(self, number: int, off: int, at: float) -> None:
        """The clock was synchronised at ``at``: the items stamped unsynchronised and
        queued before (``number``, ``off``) age from then, unless an earlier record said so."""
        for entry in self.live.values():
            if not entry.synced and entry.aged_from is None and (entry.seg, entry.off) < (number, off):
                entry.aged_from = at

    def note_clock(self, now: float, synced: bool) -> None:
        """Writes a clock record if the clock is synchronised and an item stamped while it
        was not has no time to age from yet: once, not per item, and never synced."""
        if not synced or not self.unaged:
            return
        self.unaged = False
        if self._segs and any(not e.synced and e.aged_from is None for e in self.live.values()):
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

    # -- the index ----------------------------------------------------------------
    def known(self, key: str, since: float) -> bool:
        """An item with idempotency key ``key`` is queued, or was sent at ``since`` or after."""
        return key in self.live or self.sent.get(key, float("-inf")) >= since

    def forget_sent(self, before: float) -> None:
        """Forgets the keys sent before ``before``: they may be queued again."""
        self.sent = {d: t for d, t in self.sent.items() if t >= before}

    def payload(self, entry: Entry) -> bytes | None:
        """The item's payload, None if it fails its checksum."""
        return segments.read_payload(self._segs[entry.seg].fd, entry.off + entry.head,
                                     entry.size, entry.payload_crc)

    def _add(self, entry: Entry) -> None:
        if not entry.synced:
            self.unaged = True
        self._segs[entry.seg].live += 1
        self.live[entry.id] = entry
        self.n_items += 1
        self.n_bytes += entry.size

    def _drop_from_index(self, entry: Entry) -> None:
        # a key sent long ago may be queued again: only the newer entry is the live one
        if self.live.get(entry.id) is entry:
            del self.live[entry.id]
        self.n_items -= 1
        self.n_bytes -= entry.size

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

    def _segment_for(self, length: int) -> Segment:
        if self._segs:
            last = self._segs[max(self._segs)]
            if last.read_off == 0 or last.read_off + length <= SEGMENT_BYTES:
                return last
        number = max(self._segs, default=0) + 1
        fd = self._open(segments.file_name(number, "seg"),
                        os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND)
        segments.reserve(fd, SEGMENT_BYTES)
        os.fsync(self._dir_fd)   # the new name must survive a power cut with its first item
        seg = self._segs[number] = Segment(number, fd)
        return seg

    def append_item(self, kind: str, payload: bytes, digest: bytes, now: float,
                    raw_id: bytes | None = None, key: str | None = None,
                    synced: bool = True) -> Entry:
        data, record = segments.item_record(kind, payload, digest, now,
                                            raw_id or uuid.uuid4().bytes, key, synced)
        seg = self._segment_for(len(data))
        try:
            segments.write_all(seg.fd, data)
            os.fdatasync(seg.fd)
        except OSError:
            os.ftruncate(seg.fd, seg.read_off)  # nothing half-written stays behind
            raise
        entry = seg.entries[seg.read_off] = Entry(seg.number, seg.read_off, *record, next_at=now)
        seg.read_off += len(data)
        self._add(entry)
        return entry

    def settle(self, entry: Entry, state: int, at: float, attempts: int = 0,
               next_at: float = 0.0) -> None:
        seg = self._segs.get(entry.seg)
        if seg is None or entry.settled:
            return
        self._write_outcome(seg, entry.off, state, attempts, at, next_at)

    def _write_outcome(self, seg: Segment, off: int, state: int, attempts: int, at: float,
                       next_at: float) -> None:
        if seg.ack_fd is None:
            seg.ack_fd = self._open(segments.file_name(seg.number, "ack"),
                                    os.O_RDWR | os.O_CREAT | os.O_APPEND)
        segments.write_all(seg.ack_fd, segments.outcome_record(off, state, attempts, at, next_at))
        seg.ack_off += segments.ACK_BYTES
        self._apply(seg, off, state, attempts, at, next_at)

    def collect(self, now: float, dedupe_window_s: float) -> None:
        """Deletes segments whose items are all settled (never the newest, which takes
        the next item), once what they sent is out of the dedupe window."""
        newest = max(self._segs, default=None)
        for number, seg in list(self._segs.items()):
            if number == newest or seg.live or now - seg.last_sent < dedupe_window_s:
                continue
            os.unlink(segments.file_name(number, "seg"), dir_fd=self._dir_fd)
            try:
                os.unlink(segments.file_name(number, "ack"), dir_fd=self._dir_fd)
            except FileNotFoundError:
                pass
            self._forget(number)

    def close(self) -> None:
        for seg in self._segs.values():
            seg.close()
        self._segs.clear()
