"""Logging for journald: one line per event, a syslog priority prefix when under systemd.

With ``JOURNAL_STREAM`` set (systemd connected stderr to the journal), each line
starts with ``<N>`` so journald records the right priority; elsewhere lines carry a
timestamp and level for a human at a terminal.
"""
from __future__ import annotations

import logging
import os
import re
import sys
import time

_NUMBERS = re.compile(r"\d+(?:\.\d+)?")
_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4,
             logging.ERROR: 3, logging.CRITICAL: 2}


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
        self._seen: dict[tuple, list] = {}  # kind -> [last emitted at, suppressed]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        first = record.args[0] if isinstance(record.args, tuple) and record.args else None
        # the first argument names the kind ("link lost: <why>"), its numbers do not
        # (a sequence number in every line made every line a kind of its own)
        kind = (record.name, record.msg,
                _NUMBERS.sub("#", first) if isinstance(first, str) else None)
        now = self.clock()
        entry = self._seen.get(kind)
        if entry is not None and now - entry[0] < self.window_s:
            entry[1] += 1
            return False
        if entry is not None and entry[1]:
            record.msg = f"{record.getMessage()} ({entry[1]} more like this in the last " \
                         f"{now - entry[0]:.0f}s)"
            record.args = ()
        if entry is None and len(self._seen) >= self.MAX_KINDS:
            self._seen.pop(next(iter(self._seen)))
        self._seen[kind] = [now, 0]
        return True


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
        from collections import deque
        self.lines = deque(maxlen=capacity)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append({"ts": record.created, "priority": _PRIORITY.get(record.levelno, 6),
                               "pid": os.getpid(), "message": record.getMessage()})
        except Exception:
            pass


RECENT = RecentLines()


def setup(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if under_journal():
        handler.setFormatter(JournalFormatter("%(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    handler.addFilter(RepeatFilter())
    root = logging.getLogger("edge_agent")
    root.handlers[:] = [handler, RECENT]
    root.setLevel(level.upper())
    root.propagate = False
