"""The command ledger on disk: which command ids this device has started and finished.

One JSON object a line, appended: a header with the horizon (``floor``, ``closed``:
core.py says what they mean), then each change of an entry (``{"e": entry}``) and each
id forgotten (``{"forget": id, "floor", "closed"}``); the last line about an id wins.
A command's start and its result are synced (fdatasync) before anything else is done
about them, so a power cut or the reboot the command itself causes can never make it
run twice; a confirmation is only appended. When the next line would take the file past
``MAX_BYTES`` it is rewritten to its header and live entries (temp file, fsync, rename),
which the core keeps far below that, so what a command costs the card is its few lines
plus a share of an occasional rewrite, never a rewrite per command, and the file never
grows past what ``load`` reads.

What ``load`` cannot read is never taken as "nothing ran": a line cut short at the end
(a power cut in the middle of an append that was therefore never synced, so its command
never ran) is dropped; anything else unreadable raises the horizon over everything that
may have been in it (``LOST_HOLD_S``), so a forgotten id is refused, not run again.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Callable

from ..base.fsutil import FileTooLarge, atomic_write, loads, read_bounded, retrying, set_aside
from .core import Entry

log = logging.getLogger("edge_agent.commands")
MAX_BYTES = 1 << 20            # the file never grows past this (the writer compacts)
MIGRATE_MAX_BYTES = 64 << 20   # read at start: an older build's ledger could be larger
# After a damaged ledger, unknown commands that expire before this much after the start
# are refused: whatever the lost lines held had been received before the start, and its
# time to live (the reference server's default is 300 s) was most likely shorter.
LOST_HOLD_S = 3600.0


@dataclass
class Loaded:
    entries: dict = field(default_factory=dict)
    floor: float | None = None
    closed: bool = False
    size: int = 0                # bytes on disk, 0 when there is no file
    rewrite: bool = False        # older format, a torn tail, damage: rewrite at start


def load(path: str, now: float) -> Loaded:
    """``now``: wall time, for the hold after damage."""
    try:
        raw = retrying(lambda: read_bounded(path, MIGRATE_MAX_BYTES))
    except FileNotFoundError:
        return Loaded()
    except OSError as e:
        # a read error is not an empty ledger: the hold refuses what may be in it, and the
        # file is kept aside (a rename needs no read) rather than written over
        aside = set_aside(path, "unreadable")
        log.error("cannot read the command ledger %s (%s)%s: refusing commands that may be "
                  "in it", path, e.strerror, f", kept aside as {aside}" if aside else "")
        return _lost(Loaded(rewrite=True), now)
    except FileTooLarge:
        log.error("command ledger %s is over %d bytes: refusing commands that may be in it",
                  path, MIGRATE_MAX_BYTES)
        set_aside(path, "toolarge")
        return _lost(Loaded(rewrite=True), now)
    out = Loaded(size=len(raw))
    if raw.startswith(b'{"entries"'):
        return _load_v1(path, raw, now)
    lines = raw.split(b"\n")
    if lines[-1]:
        log.warning("command ledger %s: a line cut short at the end (a write the power or "
                    "a kill interrupted) is dropped", path)
        out.rewrite = True
    damaged = 0
    for line in lines[:-1]:
        if not _apply(out, line):
            damaged += 1
    if damaged:
        aside = set_aside(path, "corrupt")
        log.error("command ledger %s: %d damaged line(s)%s; refusing commands that may be "
                  "in them", path, damaged, f", kept aside as {aside}" if aside else "")
        _lost(out, now)
    if out.size > MAX_BYTES:
        out.rewrite = True
    return out


def _apply(out: Loaded, line: bytes) -> bool:
    try:
        rec = loads(line)
        if "e" in rec:
            entry = Entry.from_dict(rec["e"])
            if entry is None:
                return False
            out.entries.pop(entry.id, None)
            out.entries[entry.id] = entry
        else:
            if "forget" in rec:
                out.entries.pop(str(rec["forget"]), None)
            elif rec.get("v") != 2:
                return False
            floor = rec.get("floor")
            if floor is not None:
                floor = float(floor)
                out.floor = floor if out.floor is None else max(out.floor, floor)
            out.closed = out.closed or bool(rec.get("closed"))
        return True
    except (ValueError, KeyError, TypeError, AttributeError, ArithmeticError, RecursionError):
        return False    # UnicodeDecodeError is a ValueError


def _load_v1(path: str, raw: bytes, now: float) -> Loaded:
    """The single JSON document of earlier builds, which a flood could grow past 1 MiB."""
    out = Loaded(size=len(raw), rewrite=True)
    try:
        for d in loads(raw)["entries"]:
            e = Entry.from_dict(d) if isinstance(d, dict) else None
            if e is not None:
                out.entries[e.id] = e
    except (ValueError, KeyError, TypeError, ArithmeticError, RecursionError):
        aside = set_aside(path, "corrupt")
        log.error("command ledger %s is corrupt%s; refusing commands that may be in it", path,
                  f", kept aside as {aside}" if aside else "")
        return _lost(out, now)
    log.info("command ledger %s: %d entries taken over from the earlier format", path,
             len(out.entries))
    return out


def _lost(out: Loaded, now: float) -> Loaded:
    out.floor = max(out.floor or now, now + LOST_HOLD_S)
    out.closed = True
    out.rewrite = True
    return out


class Ledger:
    """Appends to the ledger, and rewrites it when it would outgrow MAX_BYTES."""

    def __init__(self, path: str, loaded: Loaded):
        self.path = path
        self.size = loaded.size
        self.rewrite = loaded.rewrite

    def write(self, changes: list, horizon: dict, durable: bool,
              snapshot: Callable[[], list]) -> None:
        """``changes``: [(id, Entry | None)] from the core; ``snapshot()``: the live
        entries, for a rewrite."""
        if not changes and not self.rewrite:
            return
        data = b"".join(_line({"e": e.to_dict()} if e is not None
                              else {"forget": cid, **horizon}) for cid, e in changes)
        if self.rewrite or self.size == 0 or self.size + len(data) > MAX_BYTES:
            self.compact(horizon, snapshot())
            return
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                if durable:
                    os.fdatasync(fd)
            finally:
                os.close(fd)
        except OSError:
            self.rewrite = True  # a line may be half written: the next write starts afresh
            raise
        self.size += len(data)

    def compact(self, horizon: dict, entries: list) -> None:
        data = _line({"v": 2, **horizon}) + b"".join(_line({"e": e.to_dict()}) for e in entries)
        atomic_write(self.path, data, 0o600, durable=True)
        self.size, self.rewrite = len(data), False


def _line(doc: dict) -> bytes:
    # ASCII: a lone surrogate from the server's JSON stays writable, and readable
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"
