"""The event listener thread: udev for display and power, rtnetlink for the network.

Both are kernel notifications on file descriptors the thread select()s on, so it
sleeps until something happens (no polling). A notification is only a trigger: the
thread then reads the state from sysfs, which is what the events report. Where
netlink is not available (a container, missing permissions) it says so once and
reads the same sysfs state every ``fallback_interval_s`` instead; it never stops the
agent from starting.
"""
from __future__ import annotations

import glob
import logging
import os
import select
import socket
import struct
import time
from typing import Callable

from ..base import netlink
from ..base.hardware import undervoltage_alarm
from ..runtime.loop import Loop
from ..runtime.watchdog_gate import WatchdogGate
from .debounce import Debouncer
from .model import Event, NetworkState, UndervoltageLatch, display_event
from .outbox import Outbox
from .telemetry import SAMPLE_EVERY_S, TelemetryGate

log = logging.getLogger("edge_agent.events")

SUBSYSTEMS = ("drm", "power_supply", "hwmon", "net")
RTMGRP_LINK, RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR = 0x1, 0x10, 0x100
MAX_WAIT_S = 60.0  # the longest timed wait: the watchdog gate hears from it this often
# what the gate allows between ticks: that wait, plus a sysfs read and its events
MAX_SILENCE_S = MAX_WAIT_S + 10.0


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read(256).strip()
    except OSError:
        return ""


class SysfsState:
    """Reads what the events are about. ``root`` lets tests point it at a fake tree."""

    def __init__(self, root: str = "/sys"):
        self.root = root

    def connectors(self) -> dict[str, str]:
        return {os.path.basename(p).split("-", 1)[1]: _read(os.path.join(p, "status"))
                for p in glob.glob(os.path.join(self.root, "class/drm/card*-HDMI-A-*"))}

    def undervoltage_alarm(self) -> str | None:
        return undervoltage_alarm(self.root)

    def power_supplies(self) -> dict[str, str]:
        return {os.path.basename(p): _read(os.path.join(p, "online"))
                for p in glob.glob(os.path.join(self.root, "class/power_supply/*"))
                if os.path.exists(os.path.join(p, "online"))}

    def links(self) -> dict[str, tuple[str, str]]:
        if self.root == "/sys":
            try:
                # sysfs shows the network namespace that mounted it; rtnetlink shows ours
                return rtnetlink_links()
            except OSError:
                pass
        out = {}
        for p in glob.glob(os.path.join(self.root, "class/net/*")):
            out[os.path.basename(p)] = (_read(os.path.join(p, "operstate")),
                                        _read(os.path.join(p, "carrier")))
        return out


IFF_UP, IFF_LOWER_UP = 0x1, 0x10000
RTM_NEWLINK, RTM_GETLINK, IFLA_IFNAME = 16, 18, 3
IFINFOMSG = struct.Struct("=BxHiII")


def rtnetlink_links() -> dict[str, tuple[str, str]]:
    """Every link of this network namespace: (up|down, carrier 1|0), from an RTM_GETLINK dump
    (base/netlink.py: bounded; a NetlinkError is an OSError, and sysfs is read instead).

    Not psutil.net_if_stats(): its ``isup`` is IFF_UP and IFF_RUNNING merged (since psutil
    5.7.3) and it has no carrier bit (IFF_LOWER_UP), so "cable out" and "interface down",
    which the network events report apart, would look the same."""
    links: dict[str, tuple[str, str]] = {}
    for kind, payload in netlink.dump(RTM_GETLINK, IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)):
        if kind != RTM_NEWLINK or len(payload) < IFINFOMSG.size:
            continue
        flags = IFINFOMSG.unpack_from(payload)[3]
        name = netlink.attributes(payload, IFINFOMSG.size).get(IFLA_IFNAME, b"")
        name = name.split(b"\0", 1)[0].decode(errors="replace")
        if name:
            links[name] = ("up" if flags & IFF_UP else "down",
                           "1" if flags & IFF_LOWER_UP else "0")
    return links


class EventWatcher:
    def __init__(self, outbox: Outbox, on_network_up: Callable[[], None] | None = None,
                 gate: WatchdogGate | None = None, sysfs: SysfsState | None = None,
                 settle_s: float = 2.0, fallback_interval_s: float = 60.0,
                 udev_source: str = "auto", telemetry_every_s: float = 300.0,
                 scheduled_off: Callable[[], bool] = lambda: False,
                 sample: Callable[[], dict] | None = None,
                 on_display: Callable[[], None] = lambda: None):
        """``scheduled_off()``: working hours have the display off now, so a display
        that goes away is not a fault (agent/hours/). ``sample()``: a telemetry sample,
        taken by turn() every SAMPLE_EVERY_S. ``on_display()``: a DRM connector's status
        changed (the screen part reads the display soon after)."""
        self.outbox = outbox
        self.scheduled_off = scheduled_off
        self.sysfs = sysfs or SysfsState()
        self.debouncer = Debouncer(settle_s)
        self.network = NetworkState()
        self.latch = UndervoltageLatch()
        self._displays: dict[str, str] = {}
        self._supplies: dict[str, str] = {}
        self._on_network_up = on_network_up or (lambda: None)
        self._on_display = on_display
        self.fallback_interval_s = fallback_interval_s
        self.udev_source = udev_source
        self._stop_r, self._stop_w = os.pipe()
        self.mode = "starting"
        self.telemetry = TelemetryGate(telemetry_every_s)
        self._sample = sample
        self._sample_due = 0.0
        self.loop = Loop("events", self._turns, max_silence_s=MAX_SILENCE_S, gate=gate,
                         stopping=lambda: False, pause=self._stop_requested_within)

    def start(self) -> None:
        self.loop.start()

    def stop(self) -> None:
        os.write(self._stop_w, b"x")

    def join(self, timeout: float | None = None) -> None:
        self.loop.join(timeout)

    def _stop_requested_within(self, seconds: float) -> bool:
        return bool(select.select([self._stop_r], [], [], seconds)[0])

    # -- sources --------------------------------------------------------------------
    def _open_udev(self):
        try:
            import pyudev  # here: a missing or broken pyudev costs the fallback, not the agent
            source = self.udev_source
            if source == "auto":
                source = "udev" if os.path.exists("/run/udev/control") else "kernel"
            monitor = pyudev.Monitor.from_netlink(pyudev.Context(), source=source)
            for subsystem in SUBSYSTEMS:
                monitor.filter_by(subsystem)
            monitor.start()
            return monitor
        except Exception as e:  # ImportError, OSError, pyudev's own errors
            log.warning("udev monitoring unavailable (%s); reading sysfs every %.0fs instead",
                        e, self.fallback_interval_s)
            return None

    def _open_rtnetlink(self):
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, netlink.NETLINK_ROUTE)
            sock.bind((0, RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR))
            sock.setblocking(False)
            return sock
        except OSError as e:
            log.warning("link monitoring unavailable (%s); reading sysfs every %.0fs instead",
                        e.strerror, self.fallback_interval_s)
            return None

    # -- the loop -------------------------------------------------------------------
    def _turns(self) -> None:
        """Woken by netlink (udev, rtnetlink), not by a timer: state is read when the
        kernel says it changed. Timers only flush the debouncer; sysfs is polled only
        without netlink. With nothing pending it waits untimed, off the watchdog gate:
        blocked in select() on netlink it has nothing to wedge on, and an idle agent
        wakes no thread for it."""
        monitor, rtnl = self._open_udev(), self._open_rtnetlink()
        self.mode = "netlink" if monitor is not None and rtnl is not None else "sysfs-poll"
        fds = [self._stop_r] + [x.fileno() for x in (monitor, rtnl) if x is not None]
        now = time.monotonic()
        self.scan(now, baseline=True)
        next_poll = now + self.fallback_interval_s
        while True:
            self.loop.turn()
            now = time.monotonic()
            deadlines = [d for d in (self.debouncer.next_deadline(),
                                     next_poll if self.mode != "netlink" else None)
                         if d is not None]
            timeout = min(max(0.0, min(deadlines) - now), MAX_WAIT_S) if deadlines else None
            if timeout is None:
                self.loop.idle()
            ready, _, _ = select.select(fds, [], [], timeout)
            if self._stop_r in ready:
                return
            changed = False
            if monitor is not None and monitor.fileno() in ready:
                changed = True
                try:
                    while monitor.poll(timeout=0) is not None:
                        pass  # drain; the state is read from sysfs below
                except Exception as e:
                    log.warning("udev monitor failed (%s); falling back to sysfs reads", e)
                    fds.remove(monitor.fileno())
                    monitor, self.mode = None, "sysfs-poll"
            if rtnl is not None and rtnl.fileno() in ready:
                changed = True
                try:
                    while rtnl.recv(65536):
                        pass
                except (BlockingIOError, OSError):
                    pass
            now = time.monotonic()
            if self.mode != "netlink" and now >= next_poll:
                changed, next_poll = True, now + self.fallback_interval_s
            try:
                if changed:
                    self._read_state(now, baseline=False)
                self._flush(now)
            except Exception as e:  # odd sysfs content must cost a line, not the thread
                log.warning("reading device state failed (%s: %s); will try again",
                            type(e).__name__, e)

    def scan(self, now: float, baseline: bool = False) -> None:
        """Everything at once: device state and due events."""
        self._read_state(now, baseline)
        self._flush(now)

    def _read_state(self, now: float, baseline: bool) -> None:
        wall = time.time()
        for connector, status in self.sysfs.connectors().items():
            if self._displays.get(connector) != status:
                self._displays[connector] = status
                if not baseline:
                    self._on_display()
                kind = display_event(status)
                if kind and not baseline:
                    details = {"connector": connector}
                    if kind == "display.disconnected" and self.scheduled_off():
                        details["scheduled_off"] = True
                    self.debouncer.feed(f"display:{connector}", Event(kind, wall, details), now)
        alarm = self.sysfs.undervoltage_alarm()
        if alarm is not None:
            kind = self.latch.feed(alarm)
            if kind:
                self.debouncer.feed("power:undervoltage", Event(kind, wall), now)
        for supply, online in self.sysfs.power_supplies().items():
            if self._supplies.get(supply) != online:
                before, self._supplies[supply] = self._supplies.get(supply), online
                if before is not None:
                    kind = "power.restored" if online == "1" else "power.supply-offline"
                    self.debouncer.feed(f"power:{supply}", Event(kind, wall, {"supply": supply}), now)
        links = self.sysfs.links()
        kind = self.network.feed(links)
        if kind:
            if kind == "network.up":
                # the link loop is waiting out a backoff for a network that is back
                self._on_network_up()
            self.debouncer.feed("network", Event(kind, wall, {"links": NetworkState.usable(links)}), now)

    def _flush(self, now: float) -> None:
        for event in self.debouncer.due(now):
            self.outbox.put(event)

    def turn(self, now: float) -> None:
        """On a wake-up the link thread had anyway: a telemetry sample when one is due
        (no thread of its own wakes for it)."""
        if self._sample is not None and now >= self._sample_due:
            self._sample_due = now + SAMPLE_EVERY_S
            self.telemetry_sampled(self._sample(), now)

    def telemetry_sampled(self, values: dict, now: float) -> None:
        """A telemetry sample (taken on the link thread's turn, its only caller): a
        device.telemetry event when it moved enough or is due."""
        if values and self.telemetry.should_send(values, now):
            self.telemetry.sent(values, now)
            self.outbox.put(Event("device.telemetry", time.time(), values))
