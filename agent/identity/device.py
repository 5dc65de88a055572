"""A stable device id: created once, kept in the state directory.

Derived from /etc/machine-id and the board serial where present (hashed: neither is
sent as such), else random. Derivation makes it survive even a purge and reinstall
of the package on the same board and OS; the file makes it survive everything else.
"""
from __future__ import annotations

import hashlib
import logging
import os
import secrets

from ..base.fsutil import atomic_write
from ..base.hardware import board_serial, machine_id
from ..base.identifiers import usable_device_id

log = logging.getLogger("edge_agent.identity")


def derive(board: str | None = None) -> str:
    """``board``: what tells this board apart (identity/board.py's fingerprint), when
    the id must differ from the one a card copied from another board carries."""
    basis = f"{machine_id()}|{board_serial() if board is None else board}"
    if basis == "|":
        return "ea-" + secrets.token_hex(8)
    return "ea-" + hashlib.sha256(basis.encode()).hexdigest()[:16]


def load_or_create(state_dir: str, board: str | None = None) -> str:
    path = os.path.join(state_dir, "device_id")
    try:
        with open(path, "rb") as f:
            raw = f.read(200)
        # bytes, not text: a byte a dying card flipped is a malformed id, not a crash
        value = raw.decode("ascii", "replace").strip()
        if usable_device_id(value):
            return value
        log.warning("ignoring malformed %s; deriving the device id again", path)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("cannot read %s (%s); deriving the device id again", path, e.strerror)
    value = derive(board)
    atomic_write(path, (value + "\n").encode(), 0o644)
    log.info("device id %s (kept in %s)", value, path)
    return value
