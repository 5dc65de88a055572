"""Logging for journald: one line per event, a syslog priority prefix when under systemd.

With ``JOURNAL_STREAM`` set (systemd connected stderr to the journal), each line
starts with ``<N>`` so journald records the right priority; elsewhere lines carry a
timestamp and level for a human at a terminal.
"""
from __future__ import annotations

import logging
import os
import sys

_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4,
             logging.ERROR: 3, logging.CRITICAL: 2}


class JournalFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record).replace("\n", " | ")
        return f"<{_PRIORITY.get(record.levelno, 6)}>{text}"


def under_journal(stream=None) -> bool:
    stream = stream or sys.stderr
    value = os.environ.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in value.split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return st.st_dev == dev and st.st_ino == ino


def setup(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if under_journal():
        handler.setFormatter(JournalFormatter("%(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger("edge_agent")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
