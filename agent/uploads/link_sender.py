"""Uploads over the live link, for server profiles that carry them as Socket.IO
messages (screentinker: device:screenshot, device:play-event) instead of HTTP.

Same interface as UploadSender, so the worker, the store and the per-item backoff
are the ones HTTP uploads use. An item counts as sent only on proof of delivery
(agent/link/delivery.py): the server's ACK of the message, or its ACK of a later
heartbeat on the same connection. A bare emit never deletes anything.
"""
from __future__ import annotations

import itertools
import threading

from ..link.delivery import DELIVERED, REFUSED
from .schedule import OK, PERMANENT, TRANSIENT, Outcome
from .store import Item

_keys = itertools.count(1)


class UploadRequest:
    def __init__(self, event: str, payload: dict):
        self.key = next(_keys)
        self.event, self.payload = event, payload
        self._done = threading.Event()
        self.verdict, self.detail, self.answer = None, "", None

    def finish(self, verdict: str, detail: str, answer) -> None:
        self.verdict, self.detail, self.answer = verdict, detail, answer
        self._done.set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)


class LinkUploadSender:
    def __init__(self, runner, profile, proof_timeout_s: float):
        """``proof_timeout_s``: how long to wait for proof; at least one heartbeat
        interval plus its ACK timeout, or a server that ACKs only heartbeats could
        never prove a delivery."""
        self.runner, self.profile = runner, profile
        self.proof_timeout_s = proof_timeout_s

    @property
    def ready(self) -> bool:
        return self.runner.uploads_ready()

    def send_one(self, item: Item) -> Outcome:
        return self._send(item.kind, [item])[item.id]

    def send_batch(self, items: list[Item]) -> dict[str, Outcome]:
        return self._send(items[0].kind, items)

    def _send(self, kind: str, items: list[Item]) -> dict[str, Outcome]:
        message = self.profile.upload_message(kind, items)
        if isinstance(message, str):
            return {i.id: Outcome(PERMANENT, message) for i in items}
        request = UploadRequest(*message)
        self.runner.deliver(request)
        if not request.wait(self.proof_timeout_s):
            self.runner.forget(request.key)
            missing = Outcome(TRANSIENT, f"no proof of delivery within {self.proof_timeout_s:.0f}s")
            return {i.id: missing for i in items}
        if request.verdict == REFUSED:
            return {i.id: Outcome(PERMANENT, f"server refused: {request.detail}") for i in items}
        if request.verdict != DELIVERED:
            return {i.id: Outcome(TRANSIENT, request.detail) for i in items}
        acked = request.answer
        missing = Outcome(TRANSIENT, "not acknowledged in the server's answer")
        return {i.id: (Outcome(OK) if acked is None or i.id in acked else missing) for i in items}
