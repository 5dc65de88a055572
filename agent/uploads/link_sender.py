"""Uploads over the live link, for server profiles that carry them as Socket.IO
messages (screentinker: device:screenshot, device:play-event) instead of HTTP.

Same interface as UploadSender, so the worker, the store and the per-item backoff
are the ones HTTP uploads use. An item counts as sent only on proof of delivery
(agent/link/delivery.py): the ACK of a later heartbeat on the same connection, or the
server's second ping after it. A bare emit never deletes anything, and an item whose
shape the server would drop unread is never sent: it is dead-lettered with the reason.
"""
from __future__ import annotations

import itertools
import threading

from ..link.delivery import DELIVERED
from .schedule import OK, PERMANENT, TRANSIENT, Outcome
from .store import Item

_keys = itertools.count(1)
# on top of the link's own proof window: the send queue and the link thread's wake-up
MARGIN_S = 5.0


class UploadRequest:
    def __init__(self, messages: list[tuple[str, dict]]):
        self.key = next(_keys)
        self.messages = messages
        self._done = threading.Event()
        self.verdict, self.detail = None, ""

    def finish(self, verdict: str, detail: str) -> None:
        self.verdict, self.detail = verdict, detail
        self._done.set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)


class LinkUploadSender:
    def __init__(self, runner, profile):
        self.runner, self.profile = runner, profile

    @property
    def ready(self) -> bool:
        return self.runner.uploads_ready()

    def send_one(self, item: Item) -> Outcome:
        return self._send(item.kind, [item])[item.id]

    def send_batch(self, items: list[Item]) -> dict[str, Outcome]:
        return self._send(items[0].kind, items)

    def _send(self, kind: str, items: list[Item]) -> dict[str, Outcome]:
        outcomes: dict[str, Outcome] = {}
        messages, carried = [], []
        for item in items:
            message = self.profile.upload_message(item)
            if isinstance(message, str):
                outcomes[item.id] = Outcome(PERMANENT, message)
            else:
                messages.append(message)
                carried.append(item)
        if not carried:
            return outcomes
        request = UploadRequest(messages)
        timeout = self.runner.proof_window_s() + MARGIN_S
        self.runner.deliver(request)
        if not request.wait(timeout):
            self.runner.forget(request.key)
            outcome = Outcome(TRANSIENT, f"no proof of delivery within {timeout:.0f}s")
        elif request.verdict != DELIVERED:
            outcome = Outcome(TRANSIENT, request.detail)
        else:
            outcome = Outcome(OK)
        return {**outcomes, **{i.id: outcome for i in carried}}
