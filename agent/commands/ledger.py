"""The command ledger on disk: which command ids this device has started and finished.

Written durably (fsync, rename, fsync) before a command runs, so a power cut or the
reboot the command itself causes can never make it run twice. Small: a few hundred
entries at most, and written only when a command arrives, finishes or is confirmed.
"""
from __future__ import annotations

import json
import logging
import os
import time

from ..fsutil import atomic_write
from .core import Entry

log = logging.getLogger("edge_agent.commands")
MAX_BYTES = 1 << 20


def load(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return {}
    except OSError as e:
        log.error("cannot read the command ledger %s (%s): starting without it", path, e.strerror)
        return {}
    try:
        doc = json.loads(raw)
        entries = [Entry.from_dict(d) for d in doc["entries"]]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        aside = f"{path}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}"
        os.replace(path, aside)
        log.error("command ledger %s is corrupt; kept aside as %s", path, aside)
        return {}
    return {e.id: e for e in entries if e is not None}


def save(path: str, entries: dict) -> None:
    doc = {"entries": [e.to_dict() for e in entries.values()]}
    atomic_write(path, json.dumps(doc).encode(), 0o600, durable=True)
