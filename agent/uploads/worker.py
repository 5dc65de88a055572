"""The upload worker: a thin thread around the store, the scheduler and the sender.

It sleeps until the earliest due item (or a queue-wide hold) and is woken by a new
item or by the link coming back; it does not poll the queue. With nothing queued it
sleeps until woken, off the watchdog gate: an idle loop has nothing to be stuck on, and
a timer would only wake the board for nothing.
"""
from __future__ import annotations

import logging
import math
import threading
from typing import Callable

from ..base.clock import Clock, SystemClock
from ..runtime.loop import Loop
from ..base.card import card_failure
from ..base.upload_kinds import PROOF_OF_PLAY
from ..runtime.watchdog_gate import WatchdogGate
from ..config.policies import UploadPolicy
from .schedule import OK, PERMANENT, QUEUE_WIDE, SLOW_DOWN, UploadScheduler
from .sender import UploadSender
from .store import Item, QueueStorageFailed, QueueStore, QueueUnavailable

log = logging.getLogger("edge_agent.uploads")

# The longest nap while items wait: the watchdog gate wants to hear from this loop.
MAX_NAP_S = 60.0
IDLE = math.inf  # nothing queued: until woken
# One round of sending stops after this long, so a hanging server cannot wedge the loop.
MAX_ROUND_S = 20.0
# What the watchdog gate allows this loop between ticks: a nap, one round that started
# just before its limit, and two request timeouts.
MAX_SILENCE_S = MAX_NAP_S + MAX_ROUND_S + 2 * 35.0 + 10.0


class UploadWorker:
    """``store`` is None when the queue could not be opened at start (a read-only or
    failing card): the worker then holds, as it does when the card fails under it;
    ``on_storage_failed`` hears of that once, and the store is not touched again."""

    def __init__(self, store: QueueStore | None, sender: UploadSender, policy: UploadPolicy,
                 on_change: Callable[[], None] | None = None, clock: Clock | None = None,
                 rng=None, gate: WatchdogGate | None = None,
                 on_storage_failed: Callable[[Exception], None] | None = None):
        self.clock = clock or SystemClock()
        self.store, self.sender, self.policy = store, sender, policy
        self.scheduler = UploadScheduler(policy, rng)
        self._wake = threading.Condition()
        self._woken = False
        self._link_up = False
        self._stopping = False
        self._on_change = on_change or (lambda: None)
        self._on_storage_failed = on_storage_failed or (lambda e: None)
        # a card that failed does not come back within a process: no retries that only
        # fail again, and nothing sent whose confirmation could not be written
        self.storage_failed = store is None
        self.sent = 0
        self.loop = Loop("uploads", self._turns, max_silence_s=MAX_SILENCE_S, gate=gate,
                         pause=self._pause, stopping=lambda: self._stopping)

    # -- from any thread ----------------------------------------------------------
    def add(self, kind: str, payload: bytes) -> str:
        """Queues an item from this process (a command's output) and wakes the loop.
        Through this worker's store, which serialises threads: a store of its own would
        read every queued item's header again on each call."""
        if self.store is None or self.storage_failed:
            raise QueueUnavailable("the state partition is unusable (see edge-agent status)")
        try:
            item_id = self.store.add(kind, payload)
        except QueueStorageFailed as e:
            self.storage_failed = True
            self._on_storage_failed(e)
            raise
        self.wake()
        return item_id

    def snapshot(self) -> dict:
        """For `edge-agent status`: what is queued, and what this process sent."""
        return {**self.queue_stats(), "sent": self.sent}

    def queue_stats(self) -> dict:
        if self.store is None:
            return {"error": "storage unavailable"}
        try:
            return self.store.stats()
        except Exception as e:  # a status file must not fail on a busy queue
            return {"error": type(e).__name__}

    def wake(self) -> None:
        with self._wake:
            self._woken = True
            self._wake.notify()

    def link_up(self) -> None:
        """The server is reachable again (or we were paired anew): end an outage hold."""
        with self._wake:
            self._link_up = True
            self._woken = True
            self._wake.notify()

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()

    # -- the loop -----------------------------------------------------------------
    def start(self) -> None:
        self.loop.start()

    def join(self, timeout: float | None = None) -> None:
        self.loop.join(timeout)

    def run(self) -> None:
        self.loop.run()

    def _pause(self, seconds: float) -> bool:
        with self._wake:
            if not self._stopping:
                self._wake.wait(seconds)
            return self._stopping

    def _turns(self) -> None:
        while not self._stopping:
            self.loop.turn()
            try:
                nap = self._work_once()
            except (OSError, QueueUnavailable) as e:
                if isinstance(e, QueueStorageFailed) or card_failure(e):
                    # the card failed (read-only, I/O errors): hold, idle, until a restart
                    # after the repair; app/state_health.py tells the journal and the server once
                    self.storage_failed = True
                    self._on_storage_failed(e)
                    nap = IDLE
                else:
                    # a full disk, a lock held too long: nothing queued is lost by waiting
                    log.warning("upload queue unavailable (%s); trying again in %.0fs", e,
                                MAX_NAP_S)
                    nap = MAX_NAP_S
            with self._wake:
                if not self._woken and not self._stopping and nap > 0:
                    if nap == IDLE:
                        self.loop.idle()
                        self._wake.wait()
                    else:
                        self._wake.wait(min(nap, MAX_NAP_S))
                self._woken = False

    def _work_once(self) -> float:
        """Sends what is due; returns seconds until something could be due."""
        if self.storage_failed:
            return IDLE
        mono, wall = self.clock.monotonic(), self.clock.wall()
        with self._wake:
            link_up, self._link_up = self._link_up, False
        if link_up and self.scheduler.link_up(mono):
            log.info("uploads: the server is reachable again, sending what is queued")
        if not getattr(self.sender, "ready", True):
            self._on_change()  # items may have been queued meanwhile: status shows them
            return MAX_NAP_S  # not paired yet; woken when the link comes up
        if not self.scheduler.may_send(mono):
            # woken during a hold, by `edge-agent enqueue` say: what another process
            # appended is on disk, and the status must count it though nothing is sent
            self._on_change()
            return self.scheduler.hold_until - mono
        items = self.store.due(wall, self.policy.batch_max, self.policy.batch_bytes)
        if not items:
            earliest = self.store.earliest_due()
            return IDLE if earliest is None else max(0.05, earliest - wall)
        self._on_change()  # status shows what is queued while it is on its way
        pop = [i for i in items if i.kind == PROOF_OF_PLAY]
        others = [i for i in items if i.kind != PROOF_OF_PLAY]
        if pop:
            for item_id, outcome in self.sender.send_batch(pop).items():
                self._settle(next(i for i in pop if i.id == item_id), outcome)
        started = self.clock.monotonic()
        for item in others:
            now = self.clock.monotonic()
            if self._stopping or not self.scheduler.may_send(now) or now - started > MAX_ROUND_S:
                break
            self._settle(item, self.sender.send_one(item))
        del items, pop, others  # the payloads: memory goes back before the nap
        self._on_change()
        return 0.0

    def _settle(self, item: Item, outcome) -> None:
        mono, wall = self.clock.monotonic(), self.clock.wall()
        if outcome.kind in QUEUE_WIDE:
            # the server, the network or our credentials: the item is not touched (no
            # attempt counted, nothing written) and the whole queue waits
            first = self.scheduler.hold_reason != outcome.kind
            until = self.scheduler.hold(outcome, mono)
            if first:
                log.warning("uploads held (%s: %s): %d queued, trying again in %.0fs%s",
                            outcome.kind, outcome.detail, self._queued(), until - mono,
                            ", or when the link is back" if outcome.kind != SLOW_DOWN else "")
            return
        if outcome.kind == OK:
            if self.scheduler.hold_reason is not None:
                log.info("uploads flowing again")
            self.scheduler.succeeded()
            self.store.confirmed([item], wall)
            self.sent += 1
            return
        if outcome.kind == PERMANENT:
            self.store.dead(item, outcome.detail, wall)
            log.warning("upload %s (%s) refused for good (%s): moved to the dead-letter file",
                        item.id, item.kind, outcome.detail)
            return
        self.scheduler.succeeded()  # the server answered: not an outage
        due_mono = self.scheduler.after_failure(item.attempts + 1, mono)
        self.store.failed(item, wall + (due_mono - mono))
        log.warning("upload of a %s failed (%s), retrying in %.0fs", item.kind, outcome.detail,
                    due_mono - mono)

    def _queued(self) -> int:
        try:
            return self.store.stats()["items"]
        except (OSError, QueueUnavailable):
            return -1
