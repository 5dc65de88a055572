"""The running agent: builds the parts from their sections of the configuration, wires
them through the ports they declare, starts them, waits, and stops them. What each part
does is its own (docs/LAYERS.md walks one command through them)."""
from __future__ import annotations

import logging
import os
import signal
import threading
import time

from .. import __version__
from ..base.boot import first_start_of_boot
from ..commands import part as commands_part
from ..config.model import Config
from ..device import part as device_part
from ..events import part as events_part
from ..identity import part as identity_part
from ..inventory.service import Inventory
from ..link import part as link_part
from ..runtime.mainwait import MainThreadWait
from ..runtime.systemd import Notifier, WatchdogPetter, watchdog_period_s
from ..runtime.watchdog_gate import OutagePatience, WatchdogGate
from ..screen import part as screen_part
from ..settings import part as settings_part
from ..update.service import Updater
from ..uploads import part as uploads_part
from . import adjustments
from .board import StatusBoard
from .state_health import StorageAlarms, StorageHealth

log = logging.getLogger("edge_agent")


class Agent:
    """Builds the parts in the order each needs the one before: the identity, the link
    (its port), then the parts on the port; a part that needs one built after it hears
    of it by subscribing (link/part.py, identity/part.py), never through a stand-in."""

    def __init__(self, config: Config, environ=None, settings=None):
        self.config, self._stopping = config, threading.Event()
        self.environ = environ = os.environ if environ is None else environ
        state_dir, runtime_dir, sysfs = config.state_dir, config.runtime.dir, config.debug.sysfs
        self.notifier = Notifier(environ)
        self.schedule, self.period, self.gate = watchdog_gate(config, environ)
        gate = self.gate
        # a part that cannot use the card says so here, and the rest runs: the link
        # needs no disk
        self.storage = StorageHealth(state_dir)
        self.alarms = StorageAlarms(self.storage, config.queue_path)
        self.kind = identity_part.ServerKind(config.server, state_dir, gate, self._refresh,
                                             self._stop)
        self.cold_start = cold_start = first_start_of_boot(state_dir, runtime_dir)
        self.identity = identity = identity_part.DeviceIdentity(
            config.identity, config.server, runtime_dir, storage=self.alarms, gate=gate,
            profile=link_part.PROFILES[self.kind.profile], on_change=self._refresh, sysfs=sysfs)
        self.link_part = link = link_part.Link(   # the link first: the parts are on its port
            config, self.kind.profile, identity, store=self.schedule, gate=gate,
            cold_start=cold_start, on_status=self._link_changed, on_turn=self._link_turn)
        self.runner, self.link, self.profile = link.runner, link.port, link.profile
        self.board = StatusBoard(
            config.status_path, self.notifier, device_id=identity.device_id, storage=self.storage,
            server=config.server.display, pairing=identity.pairing, link_now=self.runner.snapshot,
            on_pairing=identity.show_code)
        self.events_part = events = events_part.EventsPart(config, link, self._refresh)
        self.outbox, publish = events.outbox, events.publish
        self.inventory = Inventory(publish, sysfs)
        link.subscribe(telemetry=self.inventory.summary)
        self.uploads = uploads_part.assemble(
            config.uploads, config.queue_path, profile=self.profile, link=self.link,
            server=config.server, identity=identity, gate=gate, on_change=self._refresh,
            on_storage_failed=self.alarms.queue)
        self.updater = Updater(config.server.url, config.server.egress, state_dir,
                               config.server.connect_timeout_s)
        self.screen = screen = screen_part.assemble(
            config, sysfs=sysfs, environ=environ, runtime_dir=runtime_dir, publish=publish,
            enqueue=self._enqueue, gate=gate, means_changed=self.link.declare,
            cold_start=cold_start, on_change=self._refresh)
        link.subscribe(means=screen.means)
        self.settings = settings_part.assemble(config, environ, settings, publish=publish,
                                               stop=self._stop, gate=gate)
        self.commands = commands_part.assemble(
            config, link, screen=screen, updater=self.updater, configure=self.settings.configure,
            snapshot=self.board.document, enqueue=self._enqueue, gate=gate,
            request_restart=self._restart_requested, storage_error=self.alarms.ledger,
            on_change=self._refresh)
        self.hours = working_hours(config, screen.power, publish, gate)
        self.events = events.watch(
            config, on_network_up=self._network_up, gate=gate, on_display=screen.hotplug,
            scheduled_off=self.hours.expected_off if self.hours else None)
        self.device, self.network = device_part.assemble_on(
            config, cold_start, publish, self._refresh, gate, screen=screen,
            commands=self.commands)
        self.metrics = exported_metrics(config, self.runner, self.commands, self.notifier)
        self.board.show(self._sections(), self.metrics)

    def _sections(self) -> dict:
        """What the status document shows of each part, by its names (app/status.py)."""
        return {
            "profile": self.kind.snapshot, "credentials": self.identity.ids.storage,
            "board": lambda: self.identity.board, "uploads": self.uploads.snapshot,
            "events": self.events_part.snapshot, "journal": self.runner.journal_snapshot,
            "commands": self.commands.recent, "update": self.updater.snapshot,
            "device": self.device.snapshot, "network": self.network.snapshot,
            "hours": lambda: self.hours.snapshot() if self.hours else None,
            "settings": self.settings.snapshot, "screen": self.screen.snapshot}

    # -- between parts -----------------------------------------------------------------
    def _refresh(self) -> None:
        self.board.refresh()

    def _link_changed(self, link: dict) -> None:
        self.board.link_changed(link)   # first: what the trial's outcome says goes with it
        if link.get("proven_live"):
            self.settings.link_proven()
        self.network.link_changed(link)   # the network's healer: the link's state and reason

    def _link_turn(self) -> None:
        """On a wake-up the link thread had anyway: the parts' periodic work, once the
        link has published its state (the first status file must say what it does)."""
        if self.board.link_published:
            now = time.monotonic()
            if self.events is not None:
                self.events.turn(now)
            for part in (self.inventory, self.screen, self.device):
                part.turn(now)
            self.board.turn(now)

    def _network_up(self) -> None:
        """From the events thread: the device's own network is back after being down."""
        self.inventory.network_returned()
        self.profile.network_returned()
        self.runner.network_up()

    def _enqueue(self, kind: str, payload: bytes) -> str:
        """From the command or picture thread: what is queued (a log bundle, a screenshot)."""
        refusal = self.link_part.enqueue_problem(kind)
        if refusal:
            raise commands_part.NotQueued(refusal)
        try:
            return self.uploads.add(kind, payload)
        except (uploads_part.QueueRefused, uploads_part.QueueUnavailable) as e:
            raise commands_part.NotQueued(str(e)) from None

    def _restart_requested(self) -> None:
        """restart-agent: stop as on SIGTERM; systemd (Restart=always) starts a fresh
        process, whose ledger turns the command's record into its result."""
        log.warning("restarting on the server's request")
        self._stop("restart requested by the server")

    # -- lifecycle -------------------------------------------------------------------
    def _stop(self, why: str) -> None:
        if not self._stopping.is_set():
            log.info("%s, stopping", why)
            self._stopping.set()
            if not self.kind.stopping_for(why):   # built again in this process: no STOPPING
                self.notifier.stopping()
            self.runner.request_stop()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda signum, _: self._stop(
            f"received {signal.Signals(signum).name}"))
        signal.signal(signal.SIGINT, lambda signum, _: self._stop(
            f"received {signal.Signals(signum).name}"))
        # `edge-agent enqueue` pokes us when it queued something
        signal.signal(signal.SIGUSR1, lambda *_: self.uploads.wake())
        # `edge-agent unpair` / `enroll` ask for a fresh pairing
        signal.signal(signal.SIGUSR2, lambda *_: self.identity.ids.revoked())
        log.info("edge-agent %s starting: device %s, server %s, %s; %s", __version__,
                 self.identity.device_id(), self.config.server.display,
                 self.identity.describe(),
                 "the boot's first start" if self.cold_start else "started again in this boot")
        self.runner.begin()   # the link's first state, before the threads that write status
        held = self.alarms.release(self.outbox.put, self._refresh)
        for event in held + adjustments.said(self.config):
            self.outbox.put(event)   # what start-up found: to the server once the link is live
        main_wait = MainThreadWait()
        link_ended = threading.Event()   # set before the thread is no longer alive

        def wake_main() -> None:
            link_ended.set()
            main_wait.wake()

        self.settings.start()   # how the last revision ended is said first
        self.commands.start()   # before the link: it serves the server's commands
        self.runner.start(then=wake_main)
        parts = [p for p in (self.device, self.kind, self.uploads, self.kind.held(self.identity),
                             self.events, self.hours, self.screen, self.network)
                 if p is not None]   # in order; stopped reversed
        for part in parts:
            part.start()
        # Ready means configured and looping, not connected: a player that boots
        # offline is still a healthy service.
        self.notifier.ready("starting link")
        petter = watchdog_petter(
            self.config, self.notifier, self.period, self.gate, outage=self.runner.outage,
            # a screen waiting for its operator to type the code is healthy, not wedged
            live=lambda: self.runner.link_live() or self.identity.waiting,
            keep_restarts=self.schedule.keep_outage_restarts,
            starting=lambda: not self.runner.proven_once)
        if petter is not None:
            petter.start()
        while not link_ended.is_set():
            # A signal (its handler stops the link) or the link thread's end: this
            # thread has nothing else to do and never wakes on a timer.
            main_wait.wait()
        self.runner.loop.join()
        main_wait.close()
        failed = self.runner.loop.gave_up   # a bug, not bad input: a fresh process
        if failed:
            self.notifier.stopping()
        if petter is not None:
            petter.stop()
        # what acts on the others first: no alarm or command starts anything now
        self.settings.stop()
        self.screen.stop()   # a read-back or a capture in progress ends now
        self.commands.stop()
        for part in reversed(parts):
            part.stop()
        # Queued items are already durable; stopping only ends the round in progress.
        self.uploads.join(3.0)
        if self.metrics is not None:
            self.metrics.stop()
        log.info("edge-agent stopped")
        return 1 if failed else 0


def watchdog_gate(config: Config, environ) -> tuple:
    """The link's reconnect schedule (which keeps the outage's restarts across
    restarts), systemd's watchdog period, and the gate on the pets that both make."""
    schedule = link_part.schedule(config)
    period = watchdog_period_s(environ)
    patience = (OutagePatience(period, schedule.outage_restarts(), time.monotonic())
                if period is not None else None)
    return schedule, period, WatchdogGate(require_link=config.watchdog.require_link,
                                          patience=patience)


def working_hours(config: Config, power, publish, gate: WatchdogGate):
    """The working hours, where a screen keeps them (the part is loaded only then); the
    display's power they turn is the screen's."""
    if not config.hours.week:
        return None
    from ..hours import service as hours_service
    return hours_service.from_config(config.hours, power, publish=publish, gate=gate)


def exported_metrics(config: Config, runner, commands, notifier: Notifier):
    """The metrics, where asked for (loaded only then: the start pays nothing)."""
    if not config.metrics.enabled:
        return None
    from ..metrics import service
    return service.from_config(config.metrics, config.metrics_path,
                               journal=lambda: runner.core.journal,
                               counts=lambda: (commands.results, notifier.pets))


def watchdog_petter(config: Config, notifier: Notifier, period: float | None,
                    gate: WatchdogGate, *, live, outage, keep_restarts,
                    starting) -> WatchdogPetter | None:
    """systemd's watchdog pets, where systemd asked for them, with what gates them."""
    if period is None or not notifier.enabled:
        return None
    petter = WatchdogPetter(notifier, period, gate, live=live, outage=outage,
                            keep_restarts=keep_restarts, starting=starting)
    log.info("systemd watchdog armed: %.0fs, pets every %.1fs while %s", period,
             petter.interval_s, "the link is proven live" if gate.require_link
             else "the agent's loops make progress")
    heal_s = link_part.heal_window_s(config.link.liveness)
    if gate.require_link and period < heal_s:
        log.warning("WatchdogSec=%gs is shorter than the link goes unproven while it "
                    "heals one silent drop by itself (%gs: two heartbeats plus the ACK "
                    "timeout): systemd would restart a healthy agent; raise WatchdogSec "
                    "or lower [link] heartbeat_interval_s", period, heal_s)
    return petter
