"""Logging for journald: one record per event, with the fields a pipeline selects by.

With ``JOURNAL_STREAM`` set (systemd connected stderr to the journal) and journald's
socket there, each record is a datagram of the native protocol: its text, priority,
``SYSLOG_IDENTIFIER=edge-agent``, the screen's DEVICE_ID and VERSION, and the fields its
log call named (base/journal_fields.py). A datagram that cannot be sent at once (the
socket gone, journald's queue full) is written to stderr instead, as a line starting
with ``<N>`` so journald still records its priority: a line is never lost, and never
waits on the socket (the line to stderr is an ordinary write). Elsewhere lines carry a timestamp and level for a human at a terminal.

The client libraries' loggers go through the same handler and the same rate limit,
at the levels they log at by default (the link's own lines say when and why a
connection ended, so their warnings about it would only double them); what they log
about the server's bad input is one short line, its traceback cut to the exception
and where it was raised, so a server that sends garbage cannot fill the SD card.
"""
from __future__ import annotations

import logging
import math
import os
import re
import socket
import sys
import threading
import time
import traceback
from collections import deque
from typing import Callable

from .. import __version__
from .journal_fields import FIELD_CHARS, FIELDS, datagram
# the one sanitizer's home is text.py (light: `status` prints with it); named here too
from .text import LINE_CHARS, clean  # noqa: F401

_NUMBERS = re.compile(r"\d+(?:\.\d+)?")
_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4,
             logging.ERROR: 3, logging.CRITICAL: 2}

# Third-party loggers and the level each is taken at: socketio and engineio at ERROR,
# as they configure themselves when a client is made with logger=False.
LIBRARY_LEVELS = {"socketio": logging.ERROR, "engineio": logging.ERROR,
                  "websocket": logging.WARNING, "urllib3": logging.WARNING}
# The loggers those clients use. socketio and engineio give theirs a raw stderr handler
# unless a level is already set on it.
_LIBRARY_CLIENT_LOGGERS = ("socketio.client", "engineio.client")
LIBRARY_LINE_CHARS = 400


def _library(name: str) -> bool:
    return name.partition(".")[0] in LIBRARY_LEVELS


def _message(record: logging.LogRecord) -> str:
    """The record's text; a filter must not raise into the code that logged (a
    library's format string that does not match its arguments)."""
    try:
        return record.getMessage()
    except Exception:
        return str(record.msg)


# A traceback of the agent's own (its message already cleaned) is kept whole, joined
# into one entry, within this bound.
TRACEBACK_CHARS = 16000


class JournalFormatter(logging.Formatter):
    """One journal entry per record: its priority prefix, and nothing in it that
    journald would take for the start of another entry."""

    def format(self, record: logging.LogRecord) -> str:
        text = clean(super().format(record).replace("\n", " | "), TRACEBACK_CHARS)
        return f"<{_PRIORITY.get(record.levelno, 6)}>{text}"


class TerminalFormatter(logging.Formatter):
    """For a person at a terminal: a traceback on lines of its own, every line clean."""

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(clean(line, TRACEBACK_CHARS)
                         for line in super().format(record).split("\n"))


class OneLine(logging.Filter):
    """Every record's message made one clean line within LINE_CHARS: the handler's last
    filter, after the others have read the record as its logger made it."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = clean(_message(record)), ()
        return True


# The fields that make a line a kind of its own: a pipeline selects by them
# (journalctl REASON=proxy-unreachable), so one reason's lines are never held back
# behind another's, and what is held back is told where that selection finds it.
KIND_FIELDS = ("REASON",)


def _kind_fields(record: logging.LogRecord) -> dict:
    given = getattr(record, "journal", None)
    if not isinstance(given, dict):
        return {}
    return {name: given[name] for name in KIND_FIELDS if given.get(name) is not None}


class RepeatFilter(logging.Filter):
    """At most one line per kind of warning per window, and a burst of ``INFO_BURST``
    per kind of info line: a flapping link, or a server repeating itself, must not
    write thousands of lines to the SD card. The next line of its kind that passes
    says how many were held back, in its words and in its HELD_BACK field (a kind
    includes its REASON field: KIND_FIELDS). Kinds a server can vary without end (each line its
    own text) meet a budget of ``LINES_PER_WINDOW`` lines a window, one budget per
    level (debug, info, warning, error and worse), so a flood of one level never holds
    back the lines of another: the agent's own errors are still written when a server
    has spent the info budget."""

    MAX_KINDS = 256
    INFO_BURST = 10
    LINES_PER_WINDOW = 120

    def __init__(self, window_s: float = 60.0, clock=time.monotonic):
        super().__init__()
        self.window_s = window_s
        self.clock = clock
        # kind -> [window began at, held back since, level, text for held_back(), passed,
        #          the kind's fields]
        self._seen: dict[tuple, list] = {}
        # level class -> [window began at, lines passed, held back]
        self._budgets: dict[int, list] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.INFO:
            return self._within_budget(record.levelno, self.clock())
        first = record.args[0] if isinstance(record.args, tuple) and record.args else None
        # the first argument names the kind ("link lost: <why>"), its numbers do not
        # (a sequence number in every line made every line a kind of its own); a
        # library's arguments are what the server sent, as many kinds as it likes, so
        # there the kind of exception it logs stands in
        library = _library(record.name)
        if library:
            detail = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] \
                else None
        else:
            detail = _NUMBERS.sub("#", first) if isinstance(first, str) else None
        fields = _kind_fields(record)
        kind = (record.name, record.msg, detail, tuple(sorted(fields.items())))
        now = self.clock()
        entry = self._seen.get(kind)
        if entry is not None and now - entry[0] < self.window_s:
            allowance = 1 if record.levelno >= logging.WARNING else self.INFO_BURST
            if entry[4] >= allowance or not self._within_budget(record.levelno, now):
                entry[1] += 1
                return False
            entry[4] += 1
            return True
        if not self._within_budget(record.levelno, now):
            return False
        text = _message(record)
        notes = []
        if entry is not None and entry[1]:
            notes.append(f"{entry[1]} more like this in the last {now - entry[0]:.0f}s")
            given = getattr(record, "journal", None)
            record.journal = {**(given if isinstance(given, dict) else {}),
                              "HELD_BACK": entry[1]}
        budget = self._budgets[_level_class(record.levelno)]
        if budget[2] and budget[1] == 1:
            notes.append(f"{budget[2]} lines of other kinds held back in the last "
                         f"window: over {self.LINES_PER_WINDOW} a window")
            budget[2] = 0
        if notes:
            record.msg, record.args = f"{text} ({'; '.join(notes)})", ()
        if entry is None and len(self._seen) >= self.MAX_KINDS:
            self._seen.pop(next(iter(self._seen)))
        sample = f"{text}: {detail}" if library and detail else text
        self._seen[kind] = [now, 0, record.levelno, sample[:LIBRARY_LINE_CHARS], 1, fields]
        return True

    def _within_budget(self, level: int, now: float) -> bool:
        """Counts a line against its level's budget for the window; False (and counted
        as held back) once it is spent."""
        budget = self._budgets.setdefault(_level_class(level), [-math.inf, 0, 0])
        if now - budget[0] >= self.window_s:
            budget[0], budget[1] = now, 0
        if budget[1] >= self.LINES_PER_WINDOW:
            budget[2] += 1
            return False
        budget[1] += 1
        return True

    def held_back(self) -> list[tuple[str, int, str, dict]]:
        """What was held back and not yet told, as (logger, level, line, journal fields:
        the kind's and HELD_BACK), and forgets it: said when the agent stops, so a burst
        it ended with is counted too."""
        now = self.clock()
        lines = [(name, entry[2], f"held back {entry[1]} more like this in the last "
                                  f"{now - entry[0]:.0f}s: {entry[3]}",
                  {**entry[5], "HELD_BACK": entry[1]})
                 for (name, *_), entry in self._seen.items() if entry[1]]
        for level, budget in sorted(self._budgets.items()):
            if budget[2]:
                lines.append(("edge_agent", max(level, logging.INFO),
                              f"held back {budget[2]} {logging.getLevelName(level).lower()} "
                              f"lines over the budget of {self.LINES_PER_WINDOW} a window",
                              {"HELD_BACK": budget[2]}))
        self._seen.clear()
        self._budgets.clear()
        return lines


def _level_class(level: int) -> int:
    """The budget a line counts against: debug, info, warning, or error and worse."""
    for bound in (logging.ERROR, logging.WARNING, logging.INFO):
        if level >= bound:
            return bound
    return logging.DEBUG


class LibraryLines(logging.Filter):
    """A client library's line, made one short line: its traceback cut to the exception
    and where it was raised (40 lines of the library's internals, per bad packet, say
    nothing the exception does not), its text cut to a bound."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _library(record.name):
            return True
        text = _message(record)
        if record.exc_info and record.exc_info[1] is not None:
            text = f"{text}: {_one_line(record.exc_info)}"
        text = text.replace("\n", " | ")
        if len(text) > LIBRARY_LINE_CHARS:
            text = text[:LIBRARY_LINE_CHARS] + "..."
        record.msg, record.args = text, ()
        record.exc_info = record.exc_text = record.stack_info = None
        return True


def crash_line(error: BaseException) -> str:
    """An exception nobody caught, as one line: its type, text and where it was raised
    (the innermost frame of the agent's own code, else the innermost of all)."""
    return _one_line((type(error), error, error.__traceback__), ours_first=True)


def _one_line(exc_info, ours_first: bool = False) -> str:
    _, error, tb = exc_info
    where = ""
    frames: list[traceback.FrameSummary] = list(traceback.extract_tb(tb)) if tb else []
    if ours_first:
        frames = [f for f in frames if "/agent/" in f.filename] or frames
    if frames:
        last = frames[-1]
        where = f" (at {'/'.join(last.filename.split('/')[-2:])}:{last.lineno} in {last.name})"
    return f"{type(error).__name__}: {error}{where}"


def thread_died(args) -> None:
    """``threading.excepthook``: an exception nobody caught on a thread is a line in the
    log like any other, not Python's raw traceback on stderr. The libraries run each
    inbound message on a thread of its own, and one they cannot decode kills it, so the
    line belongs to the library whose code the thread ran, and is rate-limited and cut
    short as that library's lines are."""
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger(_owner(args.exc_traceback)).error(
        "thread %s died", name, exc_info=(args.exc_type, args.exc_value, args.exc_traceback))


def _owner(tb) -> str:
    """The module of the code the thread was started to run (its first frame that is
    not the threading module's), as a logger name: a library's, or the agent's."""
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        if module != "threading":
            return module if _library(module) else "edge_agent"
        tb = tb.tb_next
    return "edge_agent"


JOURNAL_SOCKET = "/run/systemd/journal/socket"
IDENTIFIER = "edge-agent"
# Fields every record carries, set once at start (stamp()): which screen, which release.
_STAMP: dict = {"VERSION": __version__}


def stamp(**fields) -> None:
    """Fields for every record from now on (VERSION, the ids: stamp_ids); a value may
    be a function, read at each record (an id the server may change)."""
    _STAMP.update({name: value for name, value in fields.items() if name in FIELDS})


def stamp_ids(own: str, current: Callable[[], str]) -> None:
    """The screen's ids on every record from now on: DEVICE_ID its own (the configured
    or derived id, one for the whole process and the same in the next), so a pipeline
    that groups by it never sees a screen split in two when a server (ScreenTinker)
    assigns an id of its own at registration; that id, ``current()`` at each record, in
    SERVER_DEVICE_ID wherever it is another."""
    stamp(DEVICE_ID=own, SERVER_DEVICE_ID=lambda: _another(current(), own))


def _another(value: str, own: str) -> str | None:
    return None if value == own else value


def _stamped() -> dict[str, str]:
    out = {}
    for name, value in _STAMP.items():
        try:
            value = value() if callable(value) else value
        except Exception:   # a record is never lost for a field
            continue
        if value is not None:
            out[name] = clean(str(value), FIELD_CHARS)
    return out


class NativeJournal:
    """journald's own socket, a datagram per record. Unconnected, so a journald that
    restarts is found again at the next record; non-blocking, so a full queue is an
    answer (False), not a wait."""

    def __init__(self, path: str = JOURNAL_SOCKET):
        self.path = path
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._socket.setblocking(False)

    def send(self, data: bytes) -> bool:
        try:
            self._socket.sendto(data, self.path)
            return True
        except OSError:   # no socket, nobody on it, EAGAIN, a record too large
            return False

    def close(self) -> None:
        self._socket.close()


def _given_fields(record: logging.LogRecord) -> dict[str, str]:
    """The fields the log call named (``extra=journal(...)``): known names only, each
    value one clean bounded line."""
    given = getattr(record, "journal", None)
    if not isinstance(given, dict):
        return {}
    return {name: clean(str(value), FIELD_CHARS) for name, value in given.items()
            if name in FIELDS and value is not None}


def record_fields(record: logging.LogRecord, text: str) -> list[tuple[str, str]]:
    fields = {**_stamped(), **_given_fields(record)}
    return [("MESSAGE", text), ("PRIORITY", str(_PRIORITY.get(record.levelno, 6))),
            ("SYSLOG_IDENTIFIER", IDENTIFIER), *sorted(fields.items())]


class JournalHandler(logging.StreamHandler):
    """journald's socket when ``native`` is given, else (and whenever a send fails)
    stderr; rate-limited; when it is closed (the agent stops) it says what its limit
    held back since the last line of each kind."""

    def __init__(self, stream=None, native: NativeJournal | None = None):
        super().__init__(stream or sys.stderr)
        self.native = native
        # the record's own text: the datagram carries the priority, and a traceback
        # keeps its lines (a value with newlines is still one record there)
        self._text = logging.Formatter("%(message)s")
        self.repeats = RepeatFilter()
        # in this order: a line's kind is read off the record as its logger made it
        self.addFilter(self.repeats)
        self.addFilter(LibraryLines())
        self.addFilter(OneLine())

    def emit(self, record: logging.LogRecord) -> None:
        if self.native is not None:
            try:
                text = "\n".join(clean(line, TRACEBACK_CHARS)
                                 for line in self._text.format(record).split("\n"))
                data = datagram(record_fields(record, clean_bound(text)))
            except Exception:
                self.handleError(record)
                return
            if self.native.send(data):
                return
        super().emit(record)

    def close(self) -> None:
        try:
            for name, level, line, fields in self.repeats.held_back():
                record = logging.LogRecord(name, level, __file__, 0, line, (), None)
                record.journal = fields
                self.emit(record)
        finally:
            if self.native is not None:
                self.native.close()
            super().close()


def clean_bound(text: str) -> str:
    """A record's whole text within TRACEBACK_CHARS, its lines already clean."""
    return text if len(text) <= TRACEBACK_CHARS else text[:TRACEBACK_CHARS] + "..."


def under_journal(stream=None) -> bool:
    stream = stream or sys.stderr
    value = os.environ.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in value.split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return st.st_dev == dev and st.st_ino == ino


def early(text: str, priority: int = 3, stream=None) -> None:
    """One line written before logging is set up (a configuration that cannot be read):
    under systemd with its syslog priority, so `journalctl -p err` finds a bad config."""
    stream = stream or sys.stderr
    text = clean(text)
    stream.write(f"<{priority}>{text}\n" if under_journal(stream) else f"{text}\n")
    stream.flush()


class RecentLines(logging.Handler):
    """The agent's last lines in memory: what the `logs` command sends when the agent
    does not run under journald (a terminal, the demo); under systemd it reads the
    journal itself."""

    def __init__(self, capacity: int = 1000):
        super().__init__()
        self.lines: deque[dict] = deque(maxlen=capacity)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append({"ts": record.created, "priority": _PRIORITY.get(record.levelno, 6),
                               "pid": os.getpid(), "message": record.getMessage()})
        except Exception:
            pass


RECENT = RecentLines()


def setup(level: str = "info", journal_socket: str = JOURNAL_SOCKET) -> None:
    handler = JournalHandler(sys.stderr)
    if under_journal():
        handler.setFormatter(JournalFormatter("%(message)s"))
        if os.path.exists(journal_socket):
            handler.native = NativeJournal(journal_socket)
    else:
        handler.setFormatter(TerminalFormatter("%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger("edge_agent")
    root.handlers[:] = [handler, RECENT]
    root.setLevel(level.upper())
    root.propagate = False
    for name, library_level in LIBRARY_LEVELS.items():
        library = logging.getLogger(name)
        library.handlers[:] = [handler]
        library.setLevel(library_level)
        library.propagate = False
    for name in _LIBRARY_CLIENT_LOGGERS:
        client = logging.getLogger(name)
        client.handlers[:] = []
        client.setLevel(LIBRARY_LEVELS[name.partition(".")[0]])
        client.propagate = True
    threading.excepthook = thread_died
