"""An HTTP exchange's deadline, cut on time: the bound the enrollment, the uploads and
the self-update's download put over each exchange, from its first byte to its last.

base/http.py knows which sockets an exchange uses and how to cut them (Deadline),
and starts no thread of its own: the timer that cuts is here, one thread of alarms for
every exchange of the process rather than a thread for each. That thread is
supervised and not on the watchdog gate: its callbacks are a shutdown(2) of a few
sockets, which never blocks, and nobody owns it to give it a gate.
"""
from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Callable

from ..base import http
from .threads import Timers

_lock = threading.Lock()
_cuts: Timers | None = None


def _timers() -> Timers:
    global _cuts
    with _lock:
        if _cuts is None:
            _cuts = Timers("deadlines")
        return _cuts


def arm(seconds: float, cut: Callable[[], None]) -> Callable[[], None]:
    """``cut()`` in ``seconds`` on the deadlines' thread; returns its cancel."""
    alarm = _timers().after(seconds, cut, name="deadline")
    return alarm.cancel


def deadline(seconds: float) -> AbstractContextManager[http.Deadline]:
    """Every exchange this thread makes inside is over ``seconds`` after it began
    (http.deadline, cut by this module's timer)."""
    return http.deadline(seconds, arm)
