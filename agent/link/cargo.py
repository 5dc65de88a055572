"""What the link carries under its proof of delivery, sans I/O.

A parcel (one or more messages a part asked to have confirmed, where the server ACKs
none of them) is delivered only on proof: a later heartbeat's ACK on the same
connection, or the server's second ping after it (delivery.py). And whether the server
has registered this device on the current connection: profiles that register inside
the link carry nothing before it.
"""
from __future__ import annotations

from typing import Callable, Hashable, NamedTuple

from .delivery import LOST, DeliveryTracker, Settled


class Parcel(NamedTuple):
    """Messages handed to the link under one proof; ``finish(verdict, detail)`` is
    called exactly once, from the link thread, unless forgotten first."""
    key: Hashable
    messages: tuple            # (Message, ...) (port.py)
    finish: Callable[[str, str], None]


class Cargo:
    def __init__(self) -> None:
        self._deliveries = DeliveryTracker()
        self._parcels: dict[Hashable, Parcel] = {}
        self._registered_on = 0   # generation the server last confirmed us on

    # -- registration ---------------------------------------------------------------
    def registered(self, generation: int) -> bool:
        """The server confirmed us on this connection; True the first time it does."""
        if self._registered_on == generation:
            return False
        self._registered_on = generation
        return True

    def registered_on(self, generation: int) -> bool:
        return self._registered_on == generation

    # -- parcels --------------------------------------------------------------------
    @property
    def waiting(self) -> bool:
        return bool(self._parcels)

    def sending(self, parcel: Parcel) -> None:
        """Before its messages go out: a connection that ends during the writes loses it."""
        self._parcels[parcel.key] = parcel

    def sent(self, key: Hashable, generation: int, last_heartbeat_seq: int,
             server_pings: int) -> None:
        """Its messages are written; ``server_pings`` counted only now, since a ping
        counted earlier may have had its pong leave ahead of the messages."""
        self._deliveries.sent(key, generation, last_heartbeat_seq, server_pings)

    def heartbeat_acked(self, generation: int, seq: int) -> None:
        self._settle(self._deliveries.heartbeat_acked(generation, seq))

    def server_pinged(self, generation: int, pings: int) -> None:
        self._settle(self._deliveries.server_pinged(generation, pings))

    def connection_ended(self) -> None:
        """Every parcel still unproven is lost: one connection carries them all."""
        self._settle(self._deliveries.connection_ended())
        lost, self._parcels = self._parcels, {}
        for parcel in lost.values():
            parcel.finish(LOST, "link lost before its messages were written")

    def forget(self, key: Hashable) -> None:
        """The sender stopped waiting; a late proof must not settle it twice."""
        self._deliveries.forget(key)
        self._parcels.pop(key, None)

    def _settle(self, settled: list[Settled]) -> None:
        for s in settled:
            parcel = self._parcels.pop(s.key, None)
            if parcel is not None:
                parcel.finish(s.verdict, s.detail)
