"""Every thread and timer of the agent is started here, in one of three ways:

``Loop`` (loop.py)
    a part's own thread for as long as the agent runs: supervised (a body that raises
    is seen in the journal and restarted after a backoff) and on the watchdog gate (a
    stalled one stops the pets).
``Timers``
    alarms: a function run once after a delay, cancellable, each owner's on one thread
    of its own, which is itself a Loop. A callback is short: it posts to a queue, sets
    an event, shuts a socket, writes a small file. One that could block starts a worker.
``start_worker``
    a one-shot thread, neither restarted nor on the gate, started with the reason it
    needs neither: a blocking call its caller bounds by its own wait (a DNS lookup, a
    dial, a goodbye on a dead socket), or work that bounds and settles itself.

A thread started anywhere else is a thread nobody restarts, nobody watches and nobody
stops: tests/test_threads_in_runtime.py fails on one.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Callable

from .loop import Loop
from .watchdog_gate import WatchdogGate

log = logging.getLogger("edge_agent")

# What the gate allows a Timers thread while one callback runs: a callback is short.
MAX_CALLBACK_S = 60.0


# -- one-shot threads ------------------------------------------------------------------
class Worker:
    """A one-shot thread started by start_worker(): its name, why it is one, its end."""

    def __init__(self, name: str, reason: str, thread: threading.Thread):
        self.name, self.reason = name, reason
        self._thread = thread

    def join(self, timeout: float | None = None) -> bool:
        """Waits at most ``timeout``; True if the thread has ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def alive(self) -> bool:
        return self._thread.is_alive()


_workers: set[Worker] = set()
_workers_lock = threading.Lock()


def start_worker(name: str, target: Callable[[], None], *, reason: str) -> Worker:
    """``target`` on a thread of its own, once. ``reason``: why this thread is neither a
    Loop nor an alarm; said again by workers(). An exception it raises ends it and is
    logged by the process's thread hook (base/logs.py), under ``name``."""
    if not reason.strip():
        raise ValueError(f"worker {name!r}: a one-shot thread needs its reason")

    def run() -> None:
        try:
            target()
        finally:
            with _workers_lock:
                _workers.discard(worker)

    worker = Worker(name, reason, threading.Thread(target=run, name=name, daemon=True))
    with _workers_lock:
        _workers.add(worker)
    try:
        worker._thread.start()
    except BaseException:   # no thread to be had (RLIMIT_NPROC): not left listed
        with _workers_lock:
            _workers.discard(worker)
        raise
    return worker


def workers() -> list[tuple[str, str]]:
    """The one-shot threads running now: (name, reason) each."""
    with _workers_lock:
        return sorted((w.name, w.reason) for w in _workers)


# -- alarms ------------------------------------------------------------------------------
class Alarm:
    """One function of a Timers, due at ``at`` on its clock."""

    def __init__(self, name: str, at: float, fn: Callable[[], None], timers: "Timers"):
        self.name, self.at = name, at
        self._fn, self._timers = fn, timers
        self.done = False   # run, cancelled, or never set (its Timers had stopped)

    def cancel(self) -> bool:
        """True if it will not run; False if it has run or is running now."""
        return self._timers._cancel(self)


class Timers:
    """Alarms on one thread of their owner's, started at the first one and ended by
    stop(), which cancels those still set. ``clock`` (default: monotonic) is the alarms'
    time; a test with a fake clock moves it and calls poke(), or run_due() without the
    thread. ``gate``: the thread is on the watchdog gate, idle between alarms, allowed
    ``max_silence_s`` for one callback."""

    def __init__(self, name: str, *, gate: WatchdogGate | None = None,
                 max_silence_s: float = MAX_CALLBACK_S,
                 clock: Callable[[], float] = time.monotonic):
        self.name = name
        self._clock = clock
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Alarm]] = []
        self._seq = itertools.count()
        self._started = self._stopped = False
        # the gate's ticks are on the monotonic clock, whatever the alarms' clock is
        self.loop = Loop(name, self._turns, max_silence_s=max_silence_s, gate=gate,
                         pause=self._pause, stopping=lambda: self._stopped)

    # -- the owner's, from any thread ----------------------------------------------------
    def after(self, delay_s: float, fn: Callable[[], None], *, name: str) -> Alarm:
        """``fn()`` on this thread in ``delay_s`` seconds (at once if not positive). Once
        stopped, nothing is set: the alarm comes back done."""
        return self._set(lambda now: now + max(0.0, delay_s), fn, name)

    def at(self, when: float, fn: Callable[[], None], *, name: str) -> Alarm:
        """``fn()`` on this thread once the clock reads ``when``: a time an owner
        sharing the clock computed, kept exactly (no delay added to a reading)."""
        return self._set(lambda now: when, fn, name)

    def _set(self, when: Callable[[float], float], fn: Callable[[], None],
             name: str) -> Alarm:
        with self._cond:
            alarm = Alarm(name, when(self._clock()), fn, self)
            if self._stopped:
                alarm.done = True
                log.debug("%s: stopped, alarm %s not set", self.name, name)
                return alarm
            heapq.heappush(self._heap, (alarm.at, next(self._seq), alarm))
            self._cond.notify_all()
            start, self._started = not self._started, True
        if start:
            self.loop.start()
        return alarm

    def pending(self) -> list[str]:
        """The alarms set and not run, soonest first."""
        with self._cond:
            return [a.name for _, _, a in sorted(self._heap)]

    def poke(self) -> None:
        """Look at the clock again now (a test's fake clock moved)."""
        with self._cond:
            self._cond.notify_all()

    def stop(self) -> None:
        """Cancels every alarm set; the thread ends. A callback running now finishes."""
        with self._cond:
            self._stopped = True
            for _, _, alarm in self._heap:
                alarm.done = True
            self._heap.clear()
            self._cond.notify_all()

    def join(self, timeout: float | None = None) -> None:
        self.loop.join(timeout)

    def __enter__(self) -> "Timers":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def run_due(self, now: float | None = None) -> float | None:
        """Runs the alarms due at ``now`` (default: the clock) on the calling thread, in
        order; returns when the next is due, or None. A callback that raises is logged
        and the others run."""
        now = self._clock() if now is None else now
        due = []
        with self._cond:
            while self._heap and self._heap[0][0] <= now:
                _, _, alarm = heapq.heappop(self._heap)
                alarm.done = True
                due.append(alarm)
        for alarm in due:
            try:
                alarm._fn()
            except Exception as e:
                log.error("%s: alarm %s failed: %s: %s", self.name, alarm.name,
                          type(e).__name__, e, exc_info=True)
        with self._cond:
            return self._heap[0][0] if self._heap else None

    # -- internals ---------------------------------------------------------------------
    def _cancel(self, alarm: Alarm) -> bool:
        with self._cond:
            if alarm.done:
                return False
            alarm.done = True
            # out of the heap at once: an exchange's deadline is set and cancelled many
            # times a minute, and its alarm is due only long after
            self._heap = [entry for entry in self._heap if entry[2] is not alarm]
            heapq.heapify(self._heap)
            return True

    def _pause(self, seconds: float) -> bool:
        with self._cond:
            if not self._stopped:
                self._cond.wait(seconds)
            return self._stopped

    def _turns(self) -> None:
        while True:
            self.loop.turn()
            self.run_due()
            with self._cond:
                if self._stopped:
                    return
                left = self._heap[0][0] - self._clock() if self._heap else None
                if left is None or left > 0:
                    # nothing runs until the next alarm: nothing to wedge on
                    self.loop.idle()
                    self._cond.wait(None if left is None else min(left, threading.TIMEOUT_MAX))
