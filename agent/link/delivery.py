"""Proof that a message sent over the link reached the server, sans I/O.

An emit that returned proves nothing: on a silently dropped link it lands in a socket
buffer and dies there. A queued upload may be deleted only on proof, and the link has
two kinds of it (neither ScreenTinker server answers an upload message itself):

- the server ACKs a heartbeat that was sent *after* the message on the same
  connection. One TCP stream, one Socket.IO writer: the server cannot have read the
  later heartbeat without reading the message first. That serves servers whose upload
  events carry no ACK of their own.
- the server sends its second Engine.IO ping after the message. An Engine.IO 4 server
  schedules each ping ``pingInterval`` after it *received* our pong to the previous
  one; the pong to the first ping after the message left after the message, on the
  same stream, so the second ping proves the server read the message. That serves a
  server that ACKs nothing at all (ScreenTinker's released server), at the price of
  up to two ping intervals of latency.

Receipt is all any of these prove: a server that reads a message and discards it (a
shape it does not accept) is indistinguishable from one that stored it, which is why
the profiles never send a shape their server would discard.

A message without either by the time its connection ends is not delivered, and goes
back to the queue's per-item backoff.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

DELIVERED, LOST = "delivered", "lost"


@dataclass(frozen=True)
class Settled:
    key: Hashable
    verdict: str   # DELIVERED | LOST
    detail: str = ""


class DeliveryTracker:
    def __init__(self):
        # key -> (generation, last heartbeat seq, server pings seen) when it went out
        self._pending: dict[Hashable, tuple[int, int, int]] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def sent(self, key: Hashable, generation: int, last_heartbeat_seq: int,
             server_pings: int = 0) -> None:
        """``key`` went out on connection ``generation`` after heartbeat
        ``last_heartbeat_seq``, with ``server_pings`` pings counted *after* it was queued
        (counted before, a ping's pong could have left ahead of the message)."""
        self._pending[key] = (generation, last_heartbeat_seq, server_pings)

    def heartbeat_acked(self, generation: int, seq: int) -> list[Settled]:
        done = [k for k, (gen, before, _) in self._pending.items()
                if gen == generation and seq > before]
        for key in done:
            del self._pending[key]
        return [Settled(k, DELIVERED, "received before a later heartbeat") for k in done]

    def server_pinged(self, generation: int, pings: int) -> list[Settled]:
        """The server's ``pings``-th ping on that connection arrived."""
        done = [k for k, (gen, _, at) in self._pending.items() if gen == generation and pings >= at + 2]
        for key in done:
            del self._pending[key]
        return [Settled(k, DELIVERED, "received before the pong to a later ping") for k in done]

    def connection_ended(self) -> list[Settled]:
        """Everything still unproven is lost: one connection carries them all."""
        done = list(self._pending)
        self._pending.clear()
        return [Settled(k, LOST, "link lost before delivery was proven") for k in done]

    def forget(self, key: Hashable) -> None:
        """The sender stopped waiting; a late proof must not settle it twice."""
        self._pending.pop(key, None)
