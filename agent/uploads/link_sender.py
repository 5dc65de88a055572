"""Uploads over the live link, for server profiles that carry them as Socket.IO
messages (screentinker: device:screenshot, device:play-event) instead of HTTP.

Same interface as UploadSender, so the worker, the store and the per-item backoff
are the ones HTTP uploads use. An item counts as sent only on proof of delivery
(agent/link/delivery.py): the ACK of a later heartbeat on the same connection, or the
server's second ping after it. A bare emit never deletes anything, and an item whose
shape the server would drop unread is never sent: it is dead-lettered with the reason.
"""
from __future__ import annotations

import math
import threading
import time
from typing import Hashable

from ..link.port import Confirmation, LinkPort, Message
from .schedule import OK, PERMANENT, TRANSIENT, Outcome
from .store import Item

# on top of the link's own proof window: the send queue and the link thread's wake-up
MARGIN_S = 5.0
# The longest one round spends pacing messages: with the proof window after it, well
# inside the uploads worker's watchdog bound (worker.MAX_SILENCE_S).
PACED_ROUND_S = 45.0


class UploadRequest:
    """Messages handed to the link under one proof of delivery, and what became of them."""

    def __init__(self, messages: list[tuple[str, dict]]):
        self.messages = tuple(Message(event, payload, acked=False) for event, payload in messages)
        self.key: Hashable = None
        self._done = threading.Event()
        self.confirmation: Confirmation | None = None

    def confirmed(self, confirmation: Confirmation) -> None:
        self.confirmation = confirmation
        self._done.set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)


class LinkUploadSender:
    def __init__(self, link: LinkPort, profile):
        self.link, self.profile = link, profile
        self._paced_at = -math.inf   # when the last paced message went (monotonic)

    @property
    def ready(self) -> bool:
        return self.link.ready()

    def send_one(self, item: Item) -> Outcome:
        return self._send(item.kind, [item])[item.id]

    def send_batch(self, items: list[Item]) -> dict[str, Outcome]:
        return self._send(items[0].kind, items)

    def _send(self, kind: str, items: list[Item]) -> dict[str, Outcome]:
        outcomes: dict[str, Outcome] = {}
        batch = []
        for item in items:
            try:
                message = self.profile.upload_message(item)
            except (ValueError, RecursionError) as e:
                # a record nested past the JSON parser's depth, say: this item, not the loop
                message = f"cannot be encoded as a message ({type(e).__name__})"
            if isinstance(message, str):
                outcomes[item.id] = Outcome(PERMANENT, message)
            else:
                batch.append((item, message))
        if not batch:
            return outcomes
        timeout = self.link.proof_window_s() + MARGIN_S
        for request, carried, sent_at in self._deliver_paced(batch):
            if not request.wait(max(0.0, sent_at + timeout - time.monotonic())):
                self.link.forget(request.key)
                outcome = Outcome(TRANSIENT, f"no proof of delivery within {timeout:.0f}s")
            elif request.confirmation is None or not request.confirmation.ok:
                outcome = Outcome(TRANSIENT, request.confirmation.detail
                                  if request.confirmation else "not confirmed")
            else:
                outcome = Outcome(OK)
            outcomes.update({i.id: outcome for i in carried})
        return outcomes

    def _deliver_paced(self, batch: list) -> list:
        """One request for the batch, or, where the server keeps a message only some
        time after the one before (profile.upload_gap_s), one request per paced message,
        that far apart. Pacing stops after PACED_ROUND_S: what is left is not sent (no
        outcome) and goes in the next round, so the worker keeps ticking its gate."""
        started = time.monotonic()
        requests: list = []
        chunk: list = []

        def deliver():
            request = UploadRequest([m for _, m in chunk])
            request.key = self.link.send_confirmed(request.messages, request.confirmed)
            requests.append((request, [i for i, _ in chunk], time.monotonic()))
            chunk.clear()

        for item, message in batch:
            gap = self.profile.upload_gap_s(*message)
            if gap:
                wait = self._paced_at + gap - time.monotonic()
                if wait > 0:
                    if time.monotonic() + wait - started > PACED_ROUND_S:
                        break
                    if chunk:
                        deliver()
                    time.sleep(wait)
                self._paced_at = time.monotonic()
            chunk.append((item, message))
        if chunk:
            deliver()
        return requests
