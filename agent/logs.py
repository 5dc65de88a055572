"""Logging for journald: one line per event, a syslog priority prefix when under systemd.

With ``JOURNAL_STREAM`` set (systemd connected stderr to the journal), each line
starts with ``<N>`` so journald records the right priority; elsewhere lines carry a
timestamp and level for a human at a terminal.

The client libraries' loggers go through the same handler and the same rate limit,
at the levels they log at by default (the link's own lines say when and why a
connection ended, so their warnings about it would only double them); what they log
about the server's bad input is one short line, its traceback cut to the exception
and where it was raised, so a server that sends garbage cannot fill the SD card.
"""
from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
import traceback
from collections import deque

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


class JournalFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record).replace("\n", " | ")
        return f"<{_PRIORITY.get(record.levelno, 6)}>{text}"


class RepeatFilter(logging.Filter):
    """At most one line per kind of warning per window: a flapping link must not write
    thousands of lines to the SD card. The next line that passes says how many of its
    kind were held back."""

    MAX_KINDS = 256

    def __init__(self, window_s: float = 60.0, clock=time.monotonic):
        super().__init__()
        self.window_s = window_s
        self.clock = clock
        self._seen: dict[tuple, list] = {}  # kind -> [last emitted at, suppressed, ...]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
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
        kind = (record.name, record.msg, detail)
        now = self.clock()
        entry = self._seen.get(kind)
        if entry is not None and now - entry[0] < self.window_s:
            entry[1] += 1
            return False
        text = _message(record)
        if entry is not None and entry[1]:
            record.msg = f"{text} ({entry[1]} more like this in the last {now - entry[0]:.0f}s)"
            record.args = ()
        if entry is None and len(self._seen) >= self.MAX_KINDS:
            self._seen.pop(next(iter(self._seen)))
        # [last emitted at, held back since, and its level and text for held_back()]
        sample = f"{text}: {detail}" if library and detail else text
        self._seen[kind] = [now, 0, record.levelno, sample[:LIBRARY_LINE_CHARS]]
        return True

    def held_back(self) -> list[tuple[str, int, str]]:
        """What was held back and not yet told, as (logger, level, line), and forgets it:
        said when the agent stops, so a burst it ended with is counted too."""
        now = self.clock()
        lines = [(name, entry[2], f"held back {entry[1]} more like this in the last "
                                  f"{now - entry[0]:.0f}s: {entry[3]}")
                 for (name, *_), entry in self._seen.items() if entry[1]]
        self._seen.clear()
        return lines


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


def _one_line(exc_info) -> str:
    _, error, tb = exc_info
    where = ""
    frames = traceback.extract_tb(tb) if tb is not None else []
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


class JournalHandler(logging.StreamHandler):
    """stderr, rate-limited; when it is closed (the agent stops) it says what its limit
    held back since the last line of each kind."""

    def __init__(self, stream=None):
        super().__init__(stream or sys.stderr)
        self.repeats = RepeatFilter()
        # in this order: a line's kind is read off the record as its logger made it
        self.addFilter(self.repeats)
        self.addFilter(LibraryLines())

    def close(self) -> None:
        try:
            for name, level, line in self.repeats.held_back():
                self.emit(logging.LogRecord(name, level, __file__, 0, line, (), None))
        finally:
            super().close()


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
    stream.write(f"<{priority}>{text}\n" if under_journal(stream) else f"{text}\n")
    stream.flush()


class RecentLines(logging.Handler):
    """The agent's last lines in memory: what the `logs` command sends when the agent
    does not run under journald (a terminal, the demo); under systemd it reads the
    journal itself."""

    def __init__(self, capacity: int = 1000):
        super().__init__()
        self.lines = deque(maxlen=capacity)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append({"ts": record.created, "priority": _PRIORITY.get(record.levelno, 6),
                               "pid": os.getpid(), "message": record.getMessage()})
        except Exception:
            pass


RECENT = RecentLines()


def setup(level: str = "info") -> None:
    handler = JournalHandler(sys.stderr)
    if under_journal():
        handler.setFormatter(JournalFormatter("%(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
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
