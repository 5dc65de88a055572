"""systemd integration: sd_notify READY/STATUS/STOPPING and the gated watchdog pets.

Everything is a no-op without ``NOTIFY_SOCKET``, so the same agent runs under
systemd, in a terminal and in the tests.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

from .watchdog_gate import WatchdogGate

log = logging.getLogger("edge_agent.systemd")


class Notifier:
    def __init__(self, environ=None):
        env = os.environ if environ is None else environ
        self.enabled = bool(env.get("NOTIFY_SOCKET"))
        self._notifier = None
        if self.enabled:
            import sdnotify  # only under systemd: `edge-agent status` and the tests need none
            self._notifier = sdnotify.SystemdNotifier()
        self._lock = threading.Lock()
        self._last_status: str | None = None
        self.pets = 0   # sent since start: the metrics' count

    def send(self, *fields: str) -> None:
        if self._notifier is not None:
            with self._lock:
                self._notifier.notify("\n".join(fields))

    def ready(self, status: str) -> None:
        self._last_status = status
        self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        if status != self._last_status:
            self._last_status = status
            self.send(f"STATUS={status}")

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=stopping")

    def pet(self) -> None:
        self.send("WATCHDOG=1")
        self.pets += 1


def watchdog_period_s(environ=None) -> float | None:
    """systemd's WatchdogSec for this process, or None when no watchdog is armed."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC")
    pid = env.get("WATCHDOG_PID")
    if not usec:
        return None
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 1e6 if value > 0 else None


class WatchdogPetter(threading.Thread):
    """Every half watchdog period, asks the gate and pets only if it says yes. ``live()``:
    the link is proven live (or an operator is being waited for); ``outage()``: the link
    is down because the network or the server is out. ``keep_restarts(n)``: the
    outage's restarts so far, kept across restarts where the gate says to. ``starting()``:
    this process has not proven its link yet (a start, a restart, the first connection
    after pairing): pets withheld for the link then are said at INFO, as the start's;
    withheld once it had been proven, or for a stall, a warning."""

    def __init__(self, notifier: Notifier, period_s: float, gate: WatchdogGate,
                 live: Callable[[], bool], outage: Callable[[], bool],
                 keep_restarts: Callable[[int], None] = lambda n: None,
                 starting: Callable[[], bool] = lambda: False):
        super().__init__(name="watchdog", daemon=True)
        self.notifier = notifier
        self.interval_s = period_s / 2
        self.gate = gate
        self._live, self._outage, self._keep_restarts = live, outage, keep_restarts
        self._starting = starting
        self._halt = threading.Event()
        self._withheld: str | None = None

    def may_pet(self) -> tuple[bool, str]:
        verdict = self.gate.verdict(time.monotonic(), self._live(), self._outage())
        if self.gate.restarts_to_keep is not None:
            self._keep_restarts(self.gate.restarts_to_keep)
            self.gate.restarts_to_keep = None
        return verdict

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            ok, why = self.may_pet()
            if ok:
                if self._withheld is not None:
                    log.info("watchdog: healthy again, resuming pets")
                    self._withheld = None
                self.notifier.pet()
            elif why != self._withheld:
                level = (logging.INFO if self._starting() and not why.startswith("stalled")
                         else logging.WARNING)
                log.log(level, "watchdog: withholding pets (%s); systemd restarts the agent "
                        "if this lasts past WatchdogSec", why)
                self._withheld = why

    def stop(self) -> None:
        self._halt.set()
