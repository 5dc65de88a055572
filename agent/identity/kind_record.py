"""Where the server's kind is kept between starts (server_kind.py's record), and the
choice it makes with the configuration: light, for the command line too."""
from __future__ import annotations

import json
import os

from ..base.fsutil import an_object, atomic_write, load_state
from ..config.model import Server
from .server_kind import Choice, choose

RECORD = "server-kind.json"
MAX_RECORD_BYTES = 4096


def load(state_dir: str) -> dict | None:
    """The kind recorded at an earlier start, or None (none, or unreadable: asked again)."""
    doc, _ = load_state(os.path.join(state_dir, RECORD), MAX_RECORD_BYTES, an_object)
    return doc


def save(state_dir: str, doc: dict) -> None:
    """Durably: a power cut leaves the old record or the new, and the next start trusts it."""
    atomic_write(os.path.join(state_dir, RECORD), json.dumps(doc).encode(), 0o644, durable=True)


def chosen(server: Server, state_dir: str) -> Choice:
    """The profile this configuration and this state directory choose now."""
    return choose(server.profile, server.url, load(state_dir))
