"""The network's healer, the shell around network.py: a thread that sleeps while the link
is up and, while it is down for a reason where nothing answered, probes the device's own
network (netprobe.py) every ``[device] heal_probe_s``, hands the core what it saw, and
runs the rungs the core asks for: the bounce and the manager's restart through polkit
(netprobe.py), the reboot through the daemon's reboot path once the screen ladder's book
(screen/reboots.py: one budget a day for every reboot the agent asks for) has counted it.

Off (``[device] heal_network = false``, the default): no thread, no probe, no grant.
An agent whose link is up wakes this thread never: it waits for the link's next change.
Each rung and its end are an event (``network.healing``), a journal line with its
MESSAGE_ID and the status's ``network`` section.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Callable

from ..base.fsutil import an_object, atomic_write, load_state
from ..base.journal_fields import MessageId, journal
from ..events.model import Event
from ..runtime.loop import Loop
from ..runtime.watchdog_gate import WatchdogGate
from . import network as core
from .netprobe import ACT_TIMEOUT_S, RUN_TIMEOUT_S, NetProbe

log = logging.getLogger("edge_agent.device")

Outcome = Callable[[], "tuple[bool, str]"]
PROBE_BOUND_S = 4 * RUN_TIMEOUT_S + 5.0   # route, addr, neigh, nmcli: each bounded
# the episode and the hours' budgets, across a watchdog's restart in this boot: in the
# runtime directory (tmpfs, kept by the unit's RuntimeDirectoryPreserve=restart), written
# only when a rung ran or an episode ended, never on the card
KEPT_FILE = "network-heal.json"
KEPT_MAX_BYTES = 16384
DOWN_STATES = ("waiting", "connecting")


class NetworkHeal:
    def __init__(self, healer: core.Healer, probe: NetProbe, publish: Callable[[Event], None],
                 *, book: Callable[[], object] = lambda: None, reboot: Outcome | None = None,
                 on_change: Callable[[], None] = lambda: None, runtime_dir: str | None = None,
                 gate: WatchdogGate | None = None, reboot_bound_s: float = 180.0,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        """``book()``: the screen ladder's reboot book (``take(why)`` counts a reboot or
        refuses it), None: no reboot; ``reboot()`` asks for one (done, in words)."""
        self.healer, self.net, self.publish = healer, probe, publish
        self.book, self.reboot_fn, self.on_change = book, reboot, on_change
        self.clock, self.wall = clock, wall
        self.kept_path = os.path.join(runtime_dir, KEPT_FILE) if runtime_dir else None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._poke = threading.Event()
        self._link: core.LinkSeen | None = None
        # between two turns: the wait for the next probe, a probe, one rung
        silence = (healer.policy.probe_s + PROBE_BOUND_S + max(ACT_TIMEOUT_S, reboot_bound_s)
                   + 30.0)
        self.loop = Loop("network-heal", self._run, gate=gate, max_silence_s=silence,
                         pause=self._stop.wait, stopping=self._stop.is_set)

    # -- from other threads ------------------------------------------------------------
    def link_changed(self, link: dict) -> None:
        """The link's snapshot, on each change the status shows (the link thread)."""
        seen = core.LinkSeen(link.get("state") in DOWN_STATES, link.get("reason"),
                             bool(link.get("proven_live")), self.clock())
        with self._lock:
            self._link = seen
        self._poke.set()

    def start(self) -> None:
        self.restore_kept()
        self.loop.start()

    def restore_kept(self) -> None:
        """The episode a previous process of this boot left (a watchdog's restart)."""
        if self.kept_path is not None:
            doc, why = load_state(self.kept_path, KEPT_MAX_BYTES, an_object)
            try:
                if doc is not None:
                    self.healer.restore(doc)
            except ValueError as e:
                why = str(e)
            if why is not None:
                log.warning("network: %s cannot be read (%s): the healer starts afresh",
                            self.kept_path, why)

    def stop(self) -> None:
        self._stop.set()
        self._poke.set()

    def join(self, timeout: float | None = None) -> None:
        self.loop.join(timeout)

    def snapshot(self) -> dict:
        with self._lock:
            return self.healer.snapshot()

    # -- the thread --------------------------------------------------------------------
    def _run(self) -> None:
        def turn() -> float | None:
            wake = self.step()   # None: nothing to do until the link changes (idle)
            return None if wake is None else wake - self.clock()
        self.loop.every(turn, stop=self._stop, wake=self._poke)

    def step(self) -> float | None:
        """One turn: the link's news, a probe when due, the rungs asked for; when to
        look again (monotonic), None: at the link's next change."""
        with self._lock:
            link, self._link = self._link, None
        effects = self._handle(link) if link is not None else []
        now = self.clock()
        with self._lock:
            due = self.healer.probe_due(now)
        if due:
            probe = self.net.probe()
            effects += self._handle(core.Probed(probe, self.clock()))
        effects += self._handle(core.Tick(self.clock()))
        self._apply(effects)
        if due or effects:
            self.on_change()   # the status says the probe and the ladder as they are now
        if effects:
            self._keep()
        with self._lock:
            return self.healer.next_wake(self.clock())

    def _keep(self) -> None:
        if self.kept_path is None:
            return
        with self._lock:
            data = json.dumps(self.healer.kept()).encode()
        try:
            atomic_write(self.kept_path, data, 0o600, durable=False)
        except OSError as e:
            log.warning("network: %s not written (%s): a restart would begin the ladder "
                        "again", self.kept_path, e.strerror)

    def _handle(self, event) -> list:
        with self._lock:
            return self.healer.handle(event)

    def _apply(self, effects: list) -> None:
        while effects and not self._stop.is_set():
            effect, effects = effects[0], effects[1:]
            if isinstance(effect, core.Report):
                self._report(effect)
            elif isinstance(effect, core.Act):
                log.warning("network: %s on the device (%s): %s", effect.cause,
                            effect.interface or "no interface", effect.rung,
                            extra=journal(MessageId.NETWORK_HEALING, CAUSE=effect.cause))
                self._keep()   # before it runs: a restart meanwhile does not run it again
                ok, said = self._rung(effect)
                self.loop.turn()
                effects = effects + self._handle(core.RungDone(effect.rung, ok, said,
                                                               self.clock()))

    def _report(self, report: core.Report) -> None:
        f = report.fields
        level = logging.INFO if f.get("outcome") in ("done", "healed") else logging.WARNING
        what = f"{f.get('rung')} {f.get('outcome')}" if f.get("rung") else f.get("outcome")
        log.log(level, "network: %s (%s)%s", what, f.get("cause"),
                f": {f['said']}" if f.get("said") else "",
                extra=journal(MessageId.NETWORK_HEALING, CAUSE=f.get("cause") or None))
        self.publish(Event(report.event_type, self.wall(), dict(f)))

    def _rung(self, act: core.Act) -> tuple[bool, str]:
        try:
            if act.rung == core.BOUNCE:
                return self.net.bounce(act.manager, act.interface)
            if act.rung == core.RESTART_MANAGER:
                return self.net.restart_manager(act.manager)
            if act.rung == core.REBOOT:
                book = self.book()
                if book is None or self.reboot_fn is None:
                    return False, "not rebooted: no reboot is allowed here"
                counted, said = book.take(f"network: {act.cause}")
                if not counted:
                    return False, said
                ok, done = self.reboot_fn()
                return ok, f"{said}: {done}"
        except Exception as e:   # a rung's bug is its failure, said; the ladder goes on
            log.error("network: %s failed", act.rung, exc_info=True)
            return False, f"{act.rung} failed: {type(e).__name__}"
        return False, f"unknown rung {act.rung}"


class Off:
    """[device] heal_network = false: nothing probed, nothing done."""

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def join(self, timeout: float | None = None) -> None: ...
    def link_changed(self, link: dict) -> None: ...

    def snapshot(self) -> None:
        return None


def assemble(config, publish: Callable[[Event], None], on_change: Callable[[], None],
             gate: WatchdogGate | None, book: Callable[[], object],
             reboot: Outcome) -> NetworkHeal | Off:
    """The healer ``[device]`` asks for. ``book()``: the screen's reboot book (one budget
    a day for the agent's reboots); reboots only where ``[commands] allow`` lists reboot
    and ``[screen] reboots_per_day`` allows one."""
    section = config.device
    if not section.heals_network:
        return Off()
    may_reboot = "reboot" in config.commands.allow and config.screen.reboots_per_day > 0
    policy = core.Policy(enabled=True, probe_s=section.heal_probe_s,
                         confirm_s=section.heal_confirm_s, wait_s=section.heal_wait_s,
                         reboot=may_reboot)
    return NetworkHeal(core.Healer(policy), NetProbe(config.debug.sysfs), publish,
                       book=book if may_reboot else (lambda: None),
                       reboot=reboot if may_reboot else None, on_change=on_change, gate=gate,
                       runtime_dir=config.runtime.dir,
                       reboot_bound_s=config.commands.timeout_s + 10.0)
