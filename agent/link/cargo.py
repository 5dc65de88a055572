"""What the link carries for the agent's other parts, sans I/O.

The runner drives the link; this decides what rides on it and when it counts as
delivered: hardware events from the outbox, each once per connection until the server
ACKs it; queued uploads, each until a later heartbeat's ACK or the server's pings prove
the server read it (delivery.py); and whether the server has registered this device on
the current connection (profiles that register inside the link carry nothing before).
"""
from __future__ import annotations

from typing import Hashable, Protocol

from .delivery import LOST, DeliveryTracker, Settled


class UploadRequest(Protocol):
    """A queued upload handed to the link (uploads/link_sender.py)."""
    key: Hashable
    messages: list   # [(event, payload)]

    def finish(self, verdict: str, detail: str) -> None: ...


class Cargo:
    def __init__(self, outbox_capacity: int):
        self._outbox_capacity = outbox_capacity
        self._events_sent_on: dict[int, int] = {}   # event id -> generation it went out on
        self._deliveries = DeliveryTracker()
        self._uploads: dict[Hashable, UploadRequest] = {}
        self._registered_on = 0   # generation the server last confirmed us on

    # -- hardware events ------------------------------------------------------------
    def events_to_send(self, pending: list, generation: int) -> list:
        """Of the outbox's pending events, those not yet sent on this connection."""
        fresh = [e for e in pending if self._events_sent_on.get(e.id) != generation]
        for event in fresh:
            self._events_sent_on[event.id] = generation
        if len(self._events_sent_on) > 4 * self._outbox_capacity:
            live = {e.id for e in pending}
            self._events_sent_on = {k: v for k, v in self._events_sent_on.items() if k in live}
        return fresh

    # -- registration ---------------------------------------------------------------
    def registered(self, generation: int) -> bool:
        """The server confirmed us on this connection; True the first time it does."""
        if self._registered_on == generation:
            return False
        self._registered_on = generation
        return True

    def registered_on(self, generation: int) -> bool:
        return self._registered_on == generation

    # -- uploads --------------------------------------------------------------------
    @property
    def uploads_waiting(self) -> bool:
        return bool(self._uploads)

    def upload_sending(self, request: UploadRequest) -> None:
        """Before its messages go out: a connection that ends during the writes loses it."""
        self._uploads[request.key] = request

    def upload_sent(self, key: Hashable, generation: int, last_heartbeat_seq: int,
                    server_pings: int) -> None:
        """Its messages are written; ``server_pings`` counted only now, since a ping
        counted earlier may have had its pong leave ahead of the messages."""
        self._deliveries.sent(key, generation, last_heartbeat_seq, server_pings)

    def heartbeat_acked(self, generation: int, seq: int) -> None:
        self._settle(self._deliveries.heartbeat_acked(generation, seq))

    def server_pinged(self, generation: int, pings: int) -> None:
        self._settle(self._deliveries.server_pinged(generation, pings))

    def connection_ended(self) -> None:
        """Every upload still unproven is lost: one connection carries them all."""
        self._settle(self._deliveries.connection_ended())
        lost, self._uploads = self._uploads, {}
        for request in lost.values():
            request.finish(LOST, "link lost before its messages were written")

    def forget_upload(self, key: Hashable) -> None:
        """The sender stopped waiting; a late proof must not settle it twice."""
        self._deliveries.forget(key)
        self._uploads.pop(key, None)

    def _settle(self, settled: list[Settled]) -> None:
        for s in settled:
            request = self._uploads.pop(s.key, None)
            if request is not None:
                request.finish(s.verdict, s.detail)
