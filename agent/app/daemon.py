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
from ..base.hardware import hardware_facts
from ..base.server_clock import ServerClock
from ..commands.actions import Actions, NotQueued
from ..commands.core import Outcome
from ..commands.service import CommandService
from ..config import load as config_load
from ..config.model import Config
from ..device import heal as network_heal, part as device_part
from ..events.model import Event
from ..events.outbox import Outbox
from ..events.sender import EventSender
from ..events.telemetry import TelemetrySource
from ..events.watcher import EventWatcher, SysfsState
from ..identity.kind_probe import ServerKind
from ..identity.part import DeviceIdentity
from ..inventory.service import Inventory
from ..link.idle_memory import IdleMemory
from ..link.liveness import heal_window_s
from ..link.profiles import PROFILES, ProfileContext, uncarried
from ..link.runner import Hooks, Keeps, LinkRunner, Settings
from ..link.schedule_store import ScheduleStore
from ..runtime.mainwait import MainThreadWait
from ..screen import part as screen_part
from ..runtime.systemd import Notifier, WatchdogPetter, watchdog_period_s
from ..runtime.watchdog_gate import OutagePatience, WatchdogGate
from ..settings.service import FleetSettings
from ..settings.trial import SettingsTrial
from ..update.service import Updater
from ..uploads import part as uploads_part
from ..uploads.store import QueueRefused, QueueUnavailable
from . import adjustments
from .board import StatusBoard
from .storage import StorageAlarms, StorageHealth

log = logging.getLogger("edge_agent")


class Agent:
    def __init__(self, config: Config, environ=None, settings: FleetSettings | None = None):
        self.config = config
        self.environ = os.environ if environ is None else environ
        state_dir, runtime_dir, sysfs = config.state_dir, config.runtime.dir, config.debug.sysfs
        self.notifier = Notifier(self.environ)
        # the reconnect schedule and the outage's restarts, both across restarts
        self.schedule = ScheduleStore(config.schedule_path)
        self.period = watchdog_period_s(self.environ)
        patience = (OutagePatience(self.period, self.schedule.outage_restarts(), time.monotonic())
                    if self.period is not None else None)
        self.gate = WatchdogGate(require_link=config.watchdog.require_link, patience=patience)
        # a part that cannot use the card says so here, and the rest runs: the link
        # needs no disk
        self.storage = StorageHealth(state_dir)
        self.alarms = StorageAlarms(self.storage, config.queue_path)
        self.kind = ServerKind(config.server, state_dir, self.gate, self._refresh, self._stop)
        profile_class = PROFILES[self.kind.profile]
        self.cold_start = cold_start = first_start_of_boot(state_dir, runtime_dir)
        self.identity = DeviceIdentity(
            config.identity, config.server, runtime_dir, profile=profile_class,
            storage=self.alarms, on_change=self._refresh, gate=self.gate, sysfs=sysfs)
        ids = self.identity.ids
        self.event_sender: EventSender | None = None   # the outbox's, once the link is built
        self.outbox = Outbox(on_put=self._outbox_put, on_ack=self._refresh)
        self.inventory = Inventory(self.outbox.put, sysfs)
        telemetry = TelemetrySource(state_dir, sysfs)
        self.profile = profile_class(ProfileContext(
            device_id=ids.device_id, token=ids.token, on_token=ids.registered,
            on_unpaired=ids.unpaired_by_server, facts=lambda: hardware_facts(sysfs),
            pairing_code=ids.pairing_code, claimed=ids.claimed, on_claimed=ids.claimed_as,
            telemetry=lambda: {**telemetry.get(), **self.inventory.summary()},
            allowed_commands=config.commands.allow, means=lambda: self.screen.means(),
            cold_start=cold_start))
        self.server_clock = ServerClock()   # as the link measures it: expiry, set-time
        self.runner = LinkRunner(Settings(
            config.link, config.server, config.debug,
            paused=self.identity.token() is None and not self.profile.pairs_in_link),
            profile=self.profile, identity=self.identity.current, gate=self.gate,
            hooks=Hooks(self._link_changed, self._link_turn, ids.refused, lambda kind, skew: (
                self.outbox.put(Event(kind, time.time(), {"skew_s": round(skew, 1)})))),
            keeps=Keeps(self.schedule, IdleMemory(state_dir), self.server_clock))
        self.link = self.runner.pipe   # the link's port, all the other parts see of it
        self.event_sender = EventSender(self.outbox, self.link, None if (
            self.profile.supports_events) else self.profile.incident)
        self.updater = Updater(config.server.url, config.server.egress, state_dir,
                               config.server.connect_timeout_s, settled=self._update_settled)
        self.screen = screen_part.assemble(
            config, sysfs=sysfs, environ=self.environ, runtime_dir=runtime_dir,
            publish=self.outbox.put, enqueue=self._enqueue, gate=self.gate,
            means_changed=self.link.declare,
            cold_start=cold_start, on_change=lambda: self._refresh())
        self.settings = SettingsTrial(
            settings or FleetSettings(state_dir, config.fleet.proof_timeout_s),
            check=lambda values: config_load.load(config.source, self.environ, fleet=values),
            publish=self.outbox.put, stop=self._stop, fleet_problem=config.fleet_problem,
            origins=config.origins, gate=self.gate,
            adjusted=[config_load.adjustment_text(*a) for a in config.adjusted])
        self.actions = Actions(
            config.commands, config.server.url, snapshot=lambda: self.board.document(),
            link_socket=self.runner.raw_socket, request_restart=self._restart_requested,
            enqueue=self._enqueue, updater=self.updater, configure=self.settings.configure,
            undeliverable=lambda kind: uncarried(self.profile, kind),
            power=self.screen.power, controls=self.screen.controls,
            server_far=lambda t: self.server_clock.far(t, time.monotonic()),
            shoot=self.screen.screenshot)
        self.commands = CommandService(
            config.commands_path, config.commands.allow, self.actions, runtime_dir,
            link=self.link, result_message=self.profile.command_result,
            ids_ours=profile_class.pairs_in_link, on_storage_error=self.alarms.ledger,
            on_change=self._refresh, gate=self.gate, server_now=self.server_clock.now)
        self.uploads = uploads_part.assemble(
            config.uploads, config.queue_path, profile=self.profile, link=self.link,
            server=config.server, identity=self.identity.current, gate=self.gate,
            on_change=self._refresh, on_storage_failed=self.alarms.queue)
        self.identity.bind(self.runner, self.profile, self.uploads.link_up, self._refresh)
        self.hours = None
        if config.hours.week:   # the part is loaded only where a screen keeps hours
            from ..hours import service as hours_service
            self.hours = hours_service.from_config(   # the display's power is the screen's
                config.hours, self.screen.power, publish=self.outbox.put, gate=self.gate)
        self.events = None
        if config.events.enabled:
            e = config.events
            self.events = EventWatcher(
                self.outbox, on_network_up=self._network_up, gate=self.gate,
                sysfs=SysfsState(sysfs), settle_s=e.settle_s,
                fallback_interval_s=e.fallback_interval_s, udev_source=e.udev_source,
                telemetry_every_s=e.telemetry_every_s, sample=telemetry.get,
                scheduled_off=self.hours.expected_off if self.hours else lambda: False,
                on_display=self.screen.hotplug)
        self.device = device_part.assemble(config, cold_start, self.outbox.put, self._refresh,
                                           lambda: self.screen.mender, lambda: self.commands)
        self.network = network_heal.assemble(config, self.outbox.put, self._refresh, self.gate,
                                             lambda: self.screen.reboot_book(config),
                                             self.screen.reboot)
        self.metrics = None
        if config.metrics.enabled:   # loaded only where asked for: the start pays nothing
            from ..metrics import service as metrics
            self.metrics = metrics.from_config(
                config.metrics, config.metrics_path, journal=lambda: self.runner.core.journal,
                counts=lambda: (self.commands.results, self.notifier.pets))
        self.board = StatusBoard(
            config.status_path, self.notifier, device_id=self.identity.device_id,
            server=config.server.display, storage=self.storage,
            pairing=self.identity.pairing, link_now=self.runner.snapshot,
            on_pairing=self.identity.show_code, metrics=self.metrics, sections={
                "profile": self.kind.snapshot,
                "credentials": ids.storage, "board": lambda: self.identity.board,
                "uploads": self.uploads.snapshot,
                "events": lambda: {"mode": self.events.mode if self.events else "disabled",
                                   **self.outbox.snapshot()},
                "journal": self.runner.journal_snapshot, "commands": self.commands.recent,
                "update": self.updater.snapshot, "device": self.device.snapshot,
                "network": self.network.snapshot,
                "hours": lambda: self.hours.snapshot() if self.hours else None,
                "settings": self.settings.snapshot, "screen": self.screen.snapshot})
        self._stopping = threading.Event()

    # -- between parts -----------------------------------------------------------------
    def _refresh(self) -> None:
        self.board.refresh()

    def _outbox_put(self) -> None:
        if self.event_sender is not None:
            self.event_sender.flush()
        self._refresh()

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
        refusal = uncarried(self.profile, kind)
        if refusal:
            raise NotQueued(refusal)
        try:
            return self.uploads.add(kind, payload)
        except (QueueRefused, QueueUnavailable) as e:
            raise NotQueued(str(e)) from None

    def _update_settled(self, command_id: str, ok: bool, text: str) -> None:
        outcome = Outcome(True, text) if ok else Outcome(False, error=text)
        self.commands.finished(command_id, outcome, time.time())   # which refreshes

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
            keep_restarts=self.schedule.keep_outage_restarts)
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


def watchdog_petter(config: Config, notifier: Notifier, period: float | None,
                    gate: WatchdogGate, *, live, outage, keep_restarts) -> WatchdogPetter | None:
    """systemd's watchdog pets, where systemd asked for them, with what gates them."""
    if period is None or not notifier.enabled:
        return None
    petter = WatchdogPetter(notifier, period, gate, live=live, outage=outage,
                            keep_restarts=keep_restarts)
    log.info("systemd watchdog armed: %.0fs, pets every %.1fs while %s", period,
             petter.interval_s, "the link is proven live" if gate.require_link
             else "the agent's loops make progress")
    heal_s = heal_window_s(config.link.liveness)
    if gate.require_link and period < heal_s:
        log.warning("WatchdogSec=%gs is shorter than the link goes unproven while it "
                    "heals one silent drop by itself (%gs: two heartbeats plus the ACK "
                    "timeout): systemd would restart a healthy agent; raise WatchdogSec "
                    "or lower [link] heartbeat_interval_s", period, heal_s)
    return petter
