"""The upload spool's files on disk: segment records and their outcome records.

A segment (``00000001.seg``) holds items, each record on a page of its own: a header
(139 bytes; 73 in the EAQ1 records of earlier builds, still read), the payload, zero
padding to the next page. What became of each item is a 27-byte outcome record in the
segment's ``.ack`` file. An EAQ2 header's checksum covers its length too, and records
start on page boundaries, so a record whose header is damaged is found, skipped to the
next good one on a later page and counted, never silently; so is an EAQ1 record whose
length (its checksum does not cover it) points where no record starts.

This module knows the bytes; which records are live, and when to write them, is the
spool's (spool.py). Readers run under the store's lock, where nobody is mid-append, so
an incomplete record at the end of a file is the remains of a writer that died (or of a
power cut) and is cut off.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import struct
import zlib
from typing import NamedTuple

from ..base.libc import libc
from ..base.upload_kinds import LOG, PROOF_OF_PLAY, SCREENSHOT

log = logging.getLogger("edge_agent.uploads")

# magic, payload length, crc32 of the payload, crc32 of the header: in EAQ2 of these first
# 12 bytes and the metadata that follows, so a damaged length is seen; in EAQ1 of the
# metadata only
SEG_HEAD = struct.Struct("<4sIII")
SEG_META = struct.Struct("<Bd16s32s")        # EAQ1: kind, created_at (wall), id, sha256
# EAQ2: the same, then flags (CLOCK_SYNCED: created_at was a synchronised wall time), the
# idempotency key's length and the key
SEG_META2 = struct.Struct("<Bd16s32sBB64s")
SEG_MAGIC, SEG_MAGIC2 = b"EAQ1", b"EAQ2"
_LAYOUTS = {SEG_MAGIC: SEG_META, SEG_MAGIC2: SEG_META2}
HEADER_BYTES = SEG_HEAD.size + SEG_META.size
HEADER_BYTES2 = SEG_HEAD.size + SEG_META2.size
CLOCK_SYNCED = 1
# Each item starts on a page of its own: a sync writes the pages it dirtied, so an item
# sharing its first page with the one before would write that page a second time.
PAGE = 4096
# crc32 of the rest; record offset in the segment, state, attempts, at, next try (wall)
ACK_BODY = struct.Struct("<IBHdd")
ACK_BYTES = 4 + ACK_BODY.size
SENT, FAILED, DEAD, DROPPED = 1, 2, 3, 4
# Not an item's outcome: the wall clock was seen synchronised at ``at``. Its offset, one
# byte before where the next item will start (so no item has it), says which items,
# those before it, it ages.
CLOCK = 5
# a segment's or outcome file's name, as `file_name` writes it: int() alone takes "²³" and " 7"
NAME_RE = re.compile(r"([0-9]{8,})\.(seg|ack)\Z")
# Written into every record: a code once given to a kind is never given to another.
KIND_CODES = {SCREENSHOT: 1, LOG: 2, PROOF_OF_PLAY: 3}
KIND_NAMES = {v: k for k, v in KIND_CODES.items()}


class Record(NamedTuple):
    """One item as its record's header describes it."""
    kind: str
    created_at: float
    id: str
    digest: bytes
    size: int           # of the payload
    payload_crc: int
    head: int           # header bytes: the payload starts this far into the record
    key: str | None
    synced: bool        # created_at was a synchronised wall time (EAQ1: assumed)


def file_name(number: int, ext: str) -> str:
    return f"{number:08d}.{ext}"


def parse_name(name: str) -> tuple[int, str] | None:
    """(segment number, "seg" or "ack") of a name `file_name` writes, else None."""
    m = NAME_RE.match(name)
    if m and file_name(int(m[1]), m[2]) == name:
        return int(m[1]), m[2]
    return None


def digest(kind: str, payload: bytes) -> bytes:
    return hashlib.sha256(kind.encode() + b"\0" + payload).digest()


def padded(length: int) -> int:
    return -(-length // PAGE) * PAGE


def item_record(kind: str, payload: bytes, sha256: bytes, created_at: float, raw_id: bytes,
                key: str | None, synced: bool) -> tuple[bytes, Record]:
    """The bytes to append for one item (EAQ2, padded to its last page), and what they say."""
    raw_key = (key or "").encode("ascii")
    meta = SEG_META2.pack(KIND_CODES[kind], created_at, raw_id, sha256,
                          CLOCK_SYNCED if synced else 0, len(raw_key), raw_key)
    crc = zlib.crc32(payload)
    head = struct.pack("<4sII", SEG_MAGIC2, len(payload), crc)
    header = head + struct.pack("<I", zlib.crc32(head + meta)) + meta
    length = padded(len(header) + len(payload))
    return (header + payload + bytes(length - len(header) - len(payload)),
            Record(kind, created_at, key or raw_id.hex(), sha256, len(payload), crc, len(header),
                   key, synced))


def read_payload(fd: int, at: int, size: int, crc: int) -> bytes | None:
    """The ``size`` bytes of payload at ``at``, or None if they fail their checksum."""
    payload = os.pread(fd, size, at)
    return payload if zlib.crc32(payload) == crc else None


def read_record(fd: int, pos: int, size: int) -> Record | None:
    """The record at ``pos`` of a segment of ``size`` bytes, or None if no good one starts there."""
    head = os.pread(fd, HEADER_BYTES2, pos)
    if len(head) < SEG_HEAD.size:
        return None
    magic, length, payload_crc, head_crc = SEG_HEAD.unpack_from(head)
    layout = _LAYOUTS.get(magic)
    if layout is None:
        return None
    header = SEG_HEAD.size + layout.size
    meta = head[SEG_HEAD.size:header]
    covered = meta if magic == SEG_MAGIC else head[:SEG_HEAD.size - 4] + meta
    if len(meta) < layout.size or zlib.crc32(covered) != head_crc or pos + header + length > size:
        return None
    key, flags = None, CLOCK_SYNCED
    if magic == SEG_MAGIC:
        kind, created, raw_id, sha256 = layout.unpack(meta)
    else:
        kind, created, raw_id, sha256, flags, key_len, raw_key = layout.unpack(meta)
        if key_len:
            key = raw_key[:key_len].decode("ascii", "replace")
    if kind not in KIND_NAMES:
        return None
    record = Record(KIND_NAMES[kind], created, key or raw_id.hex(), sha256, length, payload_crc,
                    header, key, bool(flags & CLOCK_SYNCED))
    if (pos + padded(header + length) > size
            and read_payload(fd, pos + header, length, payload_crc) is None):
        # short of its padding: a writer that died may have left it half-written. A
        # whole record that went bad since is indexed, and dead-lettered when due.
        return None
    return record


def scan(fd: int, pos: int, where: str) -> tuple[list[tuple[int, Record]], int, int]:
    """The records of a segment from ``pos`` on, as (offset, record); where they end; and
    how many damaged stretches were skipped or cut off (each logged). ``where`` names the
    file in messages."""
    size = os.fstat(fd).st_size
    found, damaged = [], 0
    while pos < size:
        record = read_record(fd, pos, size)
        if (record is not None and record.head == HEADER_BYTES
                and not _ends_where_the_next_begins(fd, pos, record, size)
                and read_payload(fd, pos + record.head, record.size, record.payload_crc) is None):
            record = None   # an EAQ1 length (not under its checksum) that is wrong
        if record is not None:
            found.append((pos, record))
            pos += padded(record.head + record.size)
            continue
        good = _next_good(fd, pos, size)
        if good is None:
            if (size - pos) % PAGE:   # a whole record ends on a page boundary
                log.warning("upload queue %s: cut off an incomplete item at its end "
                            "(%d bytes: an enqueue that never returned)", where, size - pos)
            else:
                damaged += 1
                log.error("upload queue %s: cut off %d damaged bytes at its end "
                          "(offset %d)", where, size - pos, pos)
            os.ftruncate(fd, pos)
            return found, pos, damaged
        damaged += 1
        log.error("upload queue %s: skipped %d damaged bytes at offset %d (the "
                  "items in them are lost)", where, good - pos, pos)
        pos = good
    if pos > size:  # a writer died in the padding of an item that is whole
        os.ftruncate(fd, pos)
    return found, pos, damaged


def _ends_where_the_next_begins(fd: int, pos: int, record: Record, size: int) -> bool:
    """Whether the record's length leads to the next record (or the end), and skips
    none on the way: records start on page boundaries."""
    end = min(pos + padded(record.head + record.size), size)
    for page in range(pos + PAGE, end + 1, PAGE):
        if page < size and (read_record(fd, page, size) is not None) != (page == end):
            return False
    return True


def _next_good(fd: int, pos: int, size: int) -> int | None:
    """Where the next good record after damage at ``pos`` starts, if one does:
    records start on page boundaries, so only those are looked at."""
    probe = padded(pos + 1)
    while probe < size:
        if os.pread(fd, 3, probe) == SEG_MAGIC[:3] and read_record(fd, probe, size) is not None:
            return probe
        probe += PAGE
    return None


def outcome_record(record_at: int, state: int, attempts: int, at: float, next_at: float) -> bytes:
    body = ACK_BODY.pack(record_at, state, min(attempts, 0xFFFF), at, next_at)
    return struct.pack("<I", zlib.crc32(body)) + body


def read_outcomes(fd: int, start: int) -> tuple[list[tuple[int, int, int, float, float]], int]:
    """The outcome records from ``start`` on, as (record offset, state, attempts, at,
    next try), and where they end. One that fails its checksum is skipped; a torn one at
    the end is cut off: its item is simply not settled."""
    size = os.fstat(fd).st_size
    if size <= start:
        return [], start
    data = os.pread(fd, size - start, start)
    whole = len(data) - len(data) % ACK_BYTES
    found = []
    for i in range(0, whole, ACK_BYTES):
        crc, = struct.unpack_from("<I", data, i)
        body = data[i + 4:i + ACK_BYTES]
        if zlib.crc32(body) == crc:
            found.append(ACK_BODY.unpack(body))
    if whole < len(data):
        os.ftruncate(fd, start + whole)
    return found, start + whole


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def reserve(fd: int, length: int) -> None:
    """Allocates the segment's blocks up front, past its end (its size still says where
    the items end): an enqueue's sync then writes its pages and the inode, not also the
    allocation bitmaps. Best effort: a file system without fallocate just allocates as
    it goes."""
    try:
        # here, not at the top: only a new segment needs it (os has no
        # FALLOC_FL_KEEP_SIZE), and most processes, `edge-agent enqueue` too, make none
        import ctypes
        fallocate = libc().fallocate
        fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
        fallocate(fd, 1, 0, length)   # 1: FALLOC_FL_KEEP_SIZE
    except (OSError, AttributeError):
        pass
