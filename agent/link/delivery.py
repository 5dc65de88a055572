"""Proof that a message sent over the link reached the server, sans I/O.

An emit that returned proves nothing: on a silently dropped link it lands in a socket
buffer and dies there. A queued upload may be deleted only on proof, and the link has
two kinds of it:

- the server answers the message itself (a Socket.IO ACK callback);
- the server ACKs a heartbeat that was sent *after* the message on the same
  connection. One TCP stream, one Socket.IO writer: the server cannot have read the
  later heartbeat without reading the message first. That serves servers (such as
  ScreenTinker's) whose upload events carry no ACK of their own.

A message without either by the time its connection ends is not delivered, and goes
back to the queue's per-item backoff.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

DELIVERED, REFUSED, LOST = "delivered", "refused", "lost"


@dataclass(frozen=True)
class Settled:
    key: Hashable
    verdict: str   # DELIVERED | REFUSED | LOST
    detail: str = ""


class DeliveryTracker:
    def __init__(self):
        self._pending: dict[Hashable, tuple[int, int]] = {}  # key -> (generation, last seq)

    def __len__(self) -> int:
        return len(self._pending)

    def sent(self, key: Hashable, generation: int, last_heartbeat_seq: int) -> None:
        """``key`` went out on connection ``generation`` after heartbeat ``last_heartbeat_seq``."""
        self._pending[key] = (generation, last_heartbeat_seq)

    def answered(self, key: Hashable, refusal: str | None = None) -> list[Settled]:
        if self._pending.pop(key, None) is None:
            return []
        return [Settled(key, REFUSED, refusal) if refusal else Settled(key, DELIVERED, "acked")]

    def heartbeat_acked(self, generation: int, seq: int) -> list[Settled]:
        done = [k for k, (gen, before) in self._pending.items() if gen == generation and seq > before]
        for key in done:
            del self._pending[key]
        return [Settled(k, DELIVERED, "received before a later heartbeat") for k in done]

    def connection_ended(self, generation: int | None = None) -> list[Settled]:
        """Everything still unproven on that connection (all, if None) is lost."""
        done = [k for k, (gen, _) in self._pending.items() if generation is None or gen == generation]
        for key in done:
            del self._pending[key]
        return [Settled(k, LOST, "link lost before delivery was proven") for k in done]

    def forget(self, key: Hashable) -> None:
        """The sender stopped waiting; a late proof must not settle it twice."""
        self._pending.pop(key, None)
