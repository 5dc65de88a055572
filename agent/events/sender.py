"""The outbox's events to the server, over the link's port (link/port.py).

In order, once the link is up (proven: it has carried an ACK), each once per
connection until the server ACKs it: an emit on a silently dropped link proves
nothing. A server without events (ScreenTinker) hears those it keeps an incident of
(the profile's ``incident()``), once each, once it has registered this connection; no
ACK exists there, so each is said once, or never.
"""
from __future__ import annotations

import threading
from typing import Callable

from ..link import protocol
from ..link.port import Confirmation, LinkPort, Message
from .outbox import Outbox

Incident = Callable[[dict], "tuple[str, dict] | None"]


class EventSender:
    def __init__(self, outbox: Outbox, link: LinkPort, incident: Incident | None = None):
        """``incident``: where the server has no events, the message that tells it of
        one (None: every event goes as itself)."""
        self._outbox, self._link, self._incident = outbox, link, incident
        self._connection = 0            # counts the link's ups: one per connection
        self._up = False
        self._sent_on: dict[int, int] = {}   # event id -> connection it went out on
        # sends in order, under the lock: an emit that finds the link gone tells the
        # down (below) on the same thread, hence reentrant
        self._lock = threading.RLock()
        link.subscribe(up=self._link_up, down=self._link_down)

    def flush(self) -> None:
        """From any thread: what the outbox holds that this connection has not carried."""
        with self._lock:
            if not self._up:
                return
            pending = self._outbox.pending()
            if self._incident is not None:
                self._incidents(pending)
                return
            # in the order they were raised: an event made on one thread may be put
            # after one made later on another
            fresh = sorted((e for e in pending if self._sent_on.get(e.id) != self._connection),
                           key=lambda e: e.id)
            for event in fresh:
                self._sent_on[event.id] = self._connection
            if len(self._sent_on) > 4 * self._outbox.capacity:
                live = {e.id for e in pending}
                self._sent_on = {k: v for k, v in self._sent_on.items() if k in live}
            for event in fresh:
                # taken in on the library's thread: the server has the event, whichever
                # connection carried it, and the outbox is thread-safe
                self._link.send_confirmed((Message(protocol.EVENT, event.payload()),),
                                          self._acked(event.id))

    def _incidents(self, pending: list) -> None:
        for event in pending:
            message = self._incident(event.payload()) if self._incident else None
            if message is not None and not self._link.send(Message(*message, acked=False)):
                return   # the link is gone: kept for the next connection
            self._outbox.ack(event.id)

    def _acked(self, event_id: int) -> Callable[[Confirmation], None]:
        def confirmed(confirmation: Confirmation) -> None:
            if confirmation.ok:
                self._outbox.ack(event_id)
        return confirmed

    def _link_up(self) -> None:
        with self._lock:
            self._connection += 1
            self._up = True
        self.flush()

    def _link_down(self) -> None:
        with self._lock:
            self._up = False
