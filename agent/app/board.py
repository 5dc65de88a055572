"""The status board, kept: what each part says of itself gathered into the status file
(`edge-agent status`, the diagnostics command, root's installer) and systemd's one line
(`systemctl status`), refreshed on every change and, for the line, now and then on a
wake-up the link thread has anyway (it carries the RTT). The document's shape and words
are status.py's; the parts' snapshots are their own."""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from ..runtime.systemd import Notifier
from ..base import status_file
from . import status
from .state_health import StorageHealth

log = logging.getLogger("edge_agent")

# How often STATUS= is refreshed while nothing else changes (it carries the RTT).
STATUS_REFRESH_S = 30.0
# How often the whole document is made again while nothing the board hears of changes:
# what a part reads for itself (apt's lists, screen/update) reaches the file and the
# metrics within this.
DOCUMENT_REFRESH_S = 300.0


class StatusBoard:
    """``pairing()`` and ``link_now()`` are asked at each refresh; ``on_pairing`` sees
    each refresh's pairing (the code board shows a code from it). Built right after the
    link, before the parts it shows: each part's snapshot is shown once the parts are
    built (show()), and a command's `status` reads the document from here."""

    def __init__(self, path: str, notifier: Notifier, *, device_id: Callable[[], str],
                 server: str, storage: StorageHealth, pairing: Callable[[], dict | None],
                 link_now: Callable[[], dict],
                 on_pairing: Callable[[dict | None], None] = lambda pairing: None):
        self._path = path
        self._notifier = notifier
        self._device_id = device_id
        self._server = server
        self._storage = storage
        self._pairing = pairing
        self._link_now = link_now
        self._sections: dict[str, Callable[[], object]] = {}
        self._on_pairing = on_pairing
        self._metrics = None   # metrics/service.py's Metrics, where [metrics] is on
        self.link: dict = {}   # the link's state as it last published it
        self._said_at = self._refreshed_at = time.monotonic()
        self._lock = threading.Lock()
        # reads of the parts begun, and the latest begun of those said in the line and of
        # those written to the file (the line is also said alone, for the RTT)
        self._asked = self._said = self._written = 0

    def show(self, sections: dict[str, Callable[[], object]], metrics=None) -> None:
        """The parts' snapshots, by the status document's names, and the metrics that
        hear each document (None: [metrics] is off)."""
        self._sections, self._metrics = sections, metrics

    @property
    def link_published(self) -> bool:
        return bool(self.link)

    def link_changed(self, link: dict) -> None:
        self.link = link
        self.refresh()

    def refresh(self) -> None:
        """From any thread: the line and the file say what is true now. Two threads'
        refreshes read the parts side by side and the one that read first may be ready
        last: what it read is shown only if no later read has been shown (a link proven
        live at the moment the credentials were stored stayed 'connecting' in the file
        until the next change). The parts are read outside the lock: a part that
        refreshes the board while holding its own lock must not wait on one that reads it."""
        asked = self._begin()
        link, pairing = self.link, self._pairing()
        doc = self._document(link, pairing)
        with self._lock:
            self._say_if_latest(asked, link, pairing)
            if asked < self._written:
                return
            self._written = asked
            self._on_pairing(pairing)
            try:
                status_file.write(self._path, doc)
            except OSError as e:
                log.warning("cannot write status file %s: %s", self._path, e.strerror)
            if self._metrics is not None:
                self._metrics.document(doc)

    def turn(self, now: float) -> None:
        """On the link thread's wake-up: systemd's line, when it has not been said lately,
        and the metrics' turn."""
        if self._metrics is not None:
            self._metrics.turn(now)
        if now - self._refreshed_at >= DOCUMENT_REFRESH_S:
            self._refreshed_at = now
            self.refresh()
        if self._notifier.enabled and now - self._said_at >= STATUS_REFRESH_S:
            self._said_at = now
            asked = self._begin()
            link, pairing = self._link_now(), self._pairing()
            with self._lock:
                self._say_if_latest(asked, link, pairing)

    def _begin(self) -> int:
        """A read of the parts begins: its number, for showing it only if no later one was."""
        with self._lock:
            self._asked += 1
            return self._asked

    def _say_if_latest(self, asked: int, link: dict, pairing: dict | None) -> None:
        if asked > self._said:
            self._said = asked
            self._say(link, pairing)

    def document(self) -> dict:
        return self._document(self.link, self._pairing())

    def _document(self, link: dict, pairing: dict | None) -> dict:
        return status.document(
            device_id=self._device_id(), pairing=pairing, server=self._server,
            link=link, storage=self._storage.snapshot(),
            **{name: snapshot() for name, snapshot in self._sections.items()})

    def _say(self, link: dict, pairing: dict | None) -> None:
        self._notifier.status(status.line(link, pairing, self._storage.snapshot()))
