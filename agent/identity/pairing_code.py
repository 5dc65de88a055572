"""Where the pairing code a screen shows until an operator claims it is shown (how one
is made and written, ``123-456``: base/identifiers.py), wherever it comes from:
the file a player's UI reads (``pairing-code`` in the runtime directory) and one
journal line per code, under every profile."""
from __future__ import annotations

import logging
import os
import threading

from ..base.fsutil import atomic_write
from ..base.journal_fields import MessageId, journal

log = logging.getLogger("edge_agent.identity")

FILE_NAME = "pairing-code"


def write_file(runtime_dir: str, display: str) -> None:
    """``pairing-code``: the code and a newline, world-readable, on tmpfs; raises OSError."""
    atomic_write(os.path.join(runtime_dir, FILE_NAME), (display + "\n").encode(), 0o644,
                 durable=False)


def remove_file(runtime_dir: str) -> None:
    try:
        os.unlink(os.path.join(runtime_dir, FILE_NAME))
    except OSError:
        pass


class Board:
    """The code of a profile that pairs inside its link (ScreenTinker), shown as the
    enroller shows the native one: the file while the code is claimable, gone once the
    screen is claimed; one journal line each time a new code is shown. ``show`` is
    called on every status change and does nothing while the code is the same."""

    def __init__(self, runtime_dir: str, where: str, expiry: str):
        self.runtime_dir, self.where, self.expiry = runtime_dir, where, expiry
        self._shown: str | None = None
        self._written = False
        self._lock = threading.Lock()   # status changes come from every thread

    def show(self, display: str | None) -> None:
        with self._lock:
            self._show(display)

    def _show(self, display: str | None) -> None:
        new = display != self._shown
        if not new and (display is None or self._written):
            return
        self._shown = display
        if display is None:
            remove_file(self.runtime_dir)
            self._written = False
            return
        if new:
            self._written = False
            log.info("pairing code %s: enter it on %s (%s)", display, self.where, self.expiry,
                     extra=journal(MessageId.PAIRING_CODE_SHOWN))
        try:   # one that failed is tried again at the next change, said once per code
            write_file(self.runtime_dir, display)
            self._written = True
        except OSError as e:
            if new:
                log.warning("cannot write the pairing code file: %s", e.strerror)
