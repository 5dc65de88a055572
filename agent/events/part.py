"""The events, assembled: the outbox (in memory, bounded), its sender over the link's
port (sender.py), the telemetry sample, and, where ``[events] enabled``, the watcher
of the device's hardware and network (watcher.py). The daemon builds the outbox and
its sender right after the link (every part publishes into it); the watcher once the
parts it reads are built (the working hours, the screen)."""
from __future__ import annotations

import time
from typing import Callable

from ..config.model import Config
from ..runtime.watchdog_gate import WatchdogGate
from .model import Event
from .outbox import Outbox
from .sender import EventSender
from .telemetry import TelemetrySource
from .watcher import EventWatcher, SysfsState


class EventsPart:
    """``link``: the link part (link/part.py): its port carries the events, its profile
    says whether the server keeps events or only incidents, and it reports the
    telemetry sample and tells the server's clock here. ``on_change()``: the outbox
    changed (the status board says so)."""

    def __init__(self, config: Config, link, on_change: Callable[[], None]):
        self._on_change = on_change
        self.outbox = Outbox(on_put=self._put, on_ack=on_change)
        self.telemetry = TelemetrySource(config.state_dir, config.debug.sysfs)
        profile = link.profile
        self.sender = EventSender(self.outbox, link.port, None if profile.supports_events
                                  else profile.incident)
        self.watcher: EventWatcher | None = None
        link.subscribe(telemetry=self.telemetry.get, clock=self._clock)

    def publish(self, event: Event) -> None:
        """From any thread: an event for the server, once the link is live."""
        self.outbox.put(event)

    def _put(self) -> None:
        self.sender.flush()
        self._on_change()

    def _clock(self, kind: str, skew_s: float) -> None:
        self.outbox.put(Event(kind, time.time(), {"skew_s": round(skew_s, 1)}))

    def watch(self, config: Config, *, on_network_up: Callable[[], None],
              gate: WatchdogGate | None, scheduled_off: Callable[[], bool] | None,
              on_display: Callable) -> EventWatcher | None:
        """The watcher ``[events]`` asks for, or None. ``scheduled_off()``: the working
        hours keep the display off now (None: no hours kept)."""
        e = config.events
        if e.enabled:
            self.watcher = EventWatcher(
                self.outbox, on_network_up=on_network_up, gate=gate,
                sysfs=SysfsState(config.debug.sysfs), settle_s=e.settle_s,
                fallback_interval_s=e.fallback_interval_s, udev_source=e.udev_source,
                telemetry_every_s=e.telemetry_every_s, sample=self.telemetry.get,
                scheduled_off=scheduled_off or (lambda: False), on_display=on_display)
        return self.watcher

    def snapshot(self) -> dict:
        """For `edge-agent status`."""
        return {"mode": self.watcher.mode if self.watcher is not None else "disabled",
                **self.outbox.snapshot()}
