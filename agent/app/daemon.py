"""The running agent: wires configuration to the link thread, systemd and the status file."""
from __future__ import annotations

import logging
import os
import signal
import threading
import time

from .. import __version__
from ..config import load as config_mod
from ..inventory import collect as inventory
from . import checks, status
from ..base.boot import first_start_of_boot
from ..commands.actions import Actions, NotQueued, Outcome
from ..commands.service import CommandService
from ..config.model import Config
from ..config.schema import ConfigError
from ..events.model import Event
from ..events.outbox import Outbox
from ..events.telemetry import SAMPLE_EVERY_S as TELEMETRY_SAMPLE_EVERY_S, TelemetrySource
from ..events.watcher import EventWatcher, SysfsState
from ..base.hardware import hardware_facts
from ..base.identifiers import shown
from ..identity import device, pairing_code
from ..identity.credentials import Credentials
from ..identity.enroller import Enroller
from ..identity.service import Hooks, IdentityService
from ..link.idle_memory import IdleMemory
from ..link.liveness import heal_window_s
from ..link.profiles import PROFILES, ProfileContext, uncarried
from ..link.runner import LinkRunner
from ..link.schedule_store import ScheduleStore
from ..hours.rules import Schedule
from ..hours.service import WorkingHours
from ..runtime.mainwait import MainThreadWait
from ..settings import rules as settings_rules
from ..settings.service import Ended, FleetSettings
from ..base.card import card_failure
from .storage import StorageHealth
from ..runtime.systemd import Notifier, WatchdogPetter, watchdog_period_s
from ..update.service import Updater
from ..uploads.link_sender import LinkUploadSender
from ..uploads.sender import UploadSender
from ..uploads.store import QueueRefused, QueueStore, QueueUnavailable
from ..uploads.worker import UploadWorker
from ..runtime.watchdog_gate import OutagePatience, WatchdogGate

log = logging.getLogger("edge_agent")

# How often STATUS= is refreshed while nothing else changes (it carries the RTT).
STATUS_REFRESH_S = 30.0


# the fleet's revision has been applied; this long for its result to go out first
APPLY_AFTER_S = 1.0
# how often the inventory is read again (and sent if it changed); the network's return
# has it read again soon
INVENTORY_EVERY_S = 600.0
INVENTORY_AFTER_NETWORK_S = 15.0


class Agent:
    def __init__(self, config: Config, environ=None, settings: FleetSettings | None = None):
        self.config = config
        self.environ = os.environ if environ is None else environ
        self.settings = settings or FleetSettings(config.identity.state_dir, config.fleet.proof_timeout_s)
        self._timers: list[threading.Timer] = []
        self.notifier = Notifier(self.environ)
        # the reconnect schedule and the outage's restarts, both across restarts
        self.schedule = ScheduleStore(config.schedule_path)
        period = watchdog_period_s(self.environ)
        patience = (OutagePatience(period, self.schedule.outage_restarts(), time.monotonic())
                    if period is not None else None)
        self.gate = WatchdogGate(require_link=config.watchdog.require_link, patience=patience)
        # Every part that needs the state directory reports here when it cannot use it,
        # and the rest runs: the link needs no disk.
        self.storage = StorageHealth(config.identity.state_dir)
        self._storage_events: list | None = []   # until run(): the link publishes first
        self.credentials = Credentials(config.identity.state_dir)
        self.profile_pairs = PROFILES[config.server.profile].pairs_in_link
        self.ids = IdentityService.load(
            config.identity.device_id or self._local_device_id(), self.credentials,
            config.identity.token, config.identity.device_id is not None, self.profile_pairs)
        self.preprovisioned = self.ids.preprovisioned
        self.enroller = None
        if not self.preprovisioned and not self.profile_pairs:
            self.enroller = Enroller(
                config.server.url, self.device_id, config.runtime.dir,
                config.server.egress, on_paired=self.ids.enrolled,
                on_change=self._refresh_status,
                show_on_console=config.identity.show_code_on_console, gate=self.gate,
                paired_with=self.token)
        # a code made inside the link (ScreenTinker) is shown where the enroller shows
        # its own: the file and the journal, as well as status
        self.code_board = (pairing_code.Board(
            config.runtime.dir, PROFILES[config.server.profile].CLAIM_WHERE,
            PROFILES[config.server.profile].CODE_EXPIRY)
            if self.profile_pairs and not self.preprovisioned else None)
        self.outbox = Outbox(on_put=self._outbox_put, on_ack=self._refresh_status)
        self._telemetry = TelemetrySource(config.identity.state_dir, config.debug.sysfs_root or "/sys")
        self._telemetry_due = 0.0
        self.profile = PROFILES[config.server.profile](ProfileContext(
            device_id=self.ids.device_id, token=self.ids.token,
            on_token=self.ids.registered, on_unpaired=self.ids.unpaired_by_server,
            facts=hardware_facts, pairing_code=self.ids.pairing_code,
            claimed=self.ids.claimed, on_claimed=self.ids.claimed_as,
            telemetry=self._profile_telemetry,
            allowed_commands=config.commands.allow,
            cold_start=first_start_of_boot(config.runtime.dir)))
        self.updater = Updater(config.server.url, config.server.egress, config.identity.state_dir,
                               config.server.connect_timeout_s, settled=self._update_settled)
        self.commands = CommandService(
            config.commands_path, config.commands.allow,
            Actions(config.commands, config.server.url, snapshot=self._status_now,
                    link_socket=self._link_socket,
                    request_restart=self._restart_requested, enqueue=self._enqueue,
                    updater=self.updater, configure=self._configure,
                    undeliverable=lambda kind: uncarried(self.profile, kind)),
            on_finished=self._command_finished,
            runtime_dir=config.runtime.dir, ids_ours=self.profile_pairs,
            on_storage_error=self._ledger_write_failed)
        self.runner = LinkRunner(config, on_status=self._on_link_status, outbox=self.outbox,
                                 profile=self.profile,
                                 on_turn=self._link_turn, gate=self.gate,
                                 on_link_up=self._link_up, on_refused=self.ids.refused,
                                 identity=self.identity,
                                 schedule_store=self.schedule,
                                 idle_memory=IdleMemory(config.identity.state_dir),
                                 commands=self.commands,
                                 paused=self.token is None and not self.profile.pairs_in_link)
        try:
            self.store: QueueStore | None = QueueStore(config.queue_path, config.uploads)
        except (QueueUnavailable, OSError) as e:   # the card, a link planted in the spool
            self.store = None
            self._queue_failed(e)
        self.uploads = UploadWorker(
            self.store, self._upload_sender(), config.uploads, gate=self.gate,
            on_change=self._refresh_status, on_storage_failed=self._queue_failed)
        self.ids.hooks = self._identity_hooks()
        self.hours = None
        if config.hours.week:
            self.hours = WorkingHours(
                Schedule.parse(list(config.hours.week), list(config.hours.exceptions)),
                config.hours.timezone, config.commands.display_on_command, config.commands.display_off_command,
                config.commands.timeout_s, trust_clock=config.hours.clock == "trusted",
                on_fault=lambda d: self.outbox.put(Event("display.fault", time.time(), d)),
                on_change=lambda d: self.outbox.put(Event("display.scheduled", time.time(), d)),
                sysfs_root=config.debug.sysfs_root or "/sys")
        self.events = None
        if config.events.enabled:
            self.events = EventWatcher(
                self.outbox, on_network_up=self._network_up, gate=self.gate,
                sysfs=SysfsState(config.debug.sysfs_root or "/sys"),
                settle_s=config.events.settle_s,
                fallback_interval_s=config.events.fallback_interval_s,
                udev_source=config.events.udev_source,
                telemetry_every_s=config.events.telemetry_every_s,
                scheduled_off=self.hours.expected_off if self.hours else lambda: False)
        self._inventory_digest: str | None = None
        self._inventory_summary: dict = {}
        self._inventory_due = 0.0
        self._inventory_busy = threading.Lock()
        self._last_link: dict = {}
        self._status_refreshed = time.monotonic()
        self._status_lock = threading.Lock()
        self._stopping = threading.Event()
        self._failed = False

    # -- storage ----------------------------------------------------------------
    def _local_device_id(self) -> str:
        try:
            return device.load_or_create(self.config.identity.state_dir)
        except OSError as e:
            # derived again the same way at the next start (from machine-id and serial)
            self._storage_unavailable("device id", os.path.join(self.config.identity.state_dir, "device_id"),
                                      e, "derived for this run only")
            return device.derive()

    def _credentials_write_failed(self, path: str, e: OSError) -> None:
        """A full disk is not a dying card: the identity service retries and says so in
        status itself; only a card that failed is the storage alarm."""
        if card_failure(e):
            self._storage_unavailable("credentials", path, e, "the token is used from memory "
                                      "and written again when the card takes it")

    def _ledger_write_failed(self, path: str, e: OSError) -> None:
        if card_failure(e):
            self._storage_unavailable("command ledger", path, e,
                                      "commands are refused until it can be written")
        else:
            log.error("cannot write the command ledger %s: %s; commands are refused until "
                      "it can be", path, e.strerror)

    def _queue_failed(self, e: Exception) -> None:
        self._storage_unavailable("upload queue", self.config.queue_path, e,
                                  "uploads are held and nothing new is queued; what is "
                                  "queued stays on the card")

    def _storage_unavailable(self, part: str, path: str, e: Exception, holds: str) -> None:
        """From any thread, once per part: the journal, the server (once per process,
        through the outbox: until ACKed, across reconnects) and the status file."""
        notice = self.storage.unavailable(part, path, e, holds)
        if notice is None:
            return
        log.log(notice.level, "%s", notice.message)
        if notice.event is not None:
            if self._storage_events is not None:
                self._storage_events.append(notice.event)
            else:
                self.outbox.put(notice.event)   # refreshes the status file too
                return
        if self._storage_events is None:
            self._refresh_status()

    def _link_turn(self) -> None:
        """Now and then, on a wake-up the link thread had anyway, sample telemetry and
        refresh STATUS= (it carries the RTT)."""
        now = time.monotonic()
        # not before the link has published its state: a telemetry event refreshes the
        # status file, and its first version must say what the link is doing
        if self.events is not None and self._last_link and now >= self._telemetry_due:
            self._telemetry_due = now + TELEMETRY_SAMPLE_EVERY_S
            self.events.telemetry_sampled(self._telemetry.get(), now)
        if self._last_link and now >= self._inventory_due:
            self._inventory_due = now + INVENTORY_EVERY_S
            self._take_inventory()
        if self.notifier.enabled and now - self._status_refreshed >= STATUS_REFRESH_S:
            self._status_refreshed = now
            self._say_status(self.runner.snapshot())

    # -- inventory --------------------------------------------------------------------
    def _take_inventory(self) -> None:
        """On a thread of its own (iw may take its 3 s): read the inventory, and send it
        when it is not what this process sent last (the first read always is)."""
        if not self._inventory_busy.acquire(blocking=False):
            return

        def read() -> None:
            try:
                inv = inventory.collect(sysfs_root=self.config.debug.sysfs_root or "/sys")
                self._inventory_summary = inventory.summary(inv)
                digest = inventory.digest(inv)
                if digest != self._inventory_digest:
                    self._inventory_digest = digest
                    self.outbox.put(Event("device.inventory", time.time(),
                                          {"inventory": inv, "digest": digest}))
            except Exception:   # an inventory must never cost the agent
                log.exception("reading the inventory failed")
            finally:
                self._inventory_busy.release()
        threading.Thread(target=read, name="inventory", daemon=True).start()

    def _profile_telemetry(self) -> dict:
        """The telemetry sample, and the inventory's summary (a dashboard's list columns)."""
        return {**self._telemetry.get(), **self._inventory_summary}

    def _restart_requested(self) -> None:
        """restart-agent: stop as on SIGTERM; systemd (Restart=always) starts a fresh
        process, whose ledger turns the command's record into its result."""
        log.warning("restarting on the server's request")
        self._stop("restart requested by the server")

    # -- settings from the fleet -------------------------------------------------------
    def _configure(self, args: dict) -> Outcome:
        """From the command thread: a revision is checked as the file would be, staged,
        and applied by a restart (agent/settings/service.py)."""
        def check(values: dict) -> None:
            try:
                checks.load(self.config.source, self.environ, fleet=values)
            except ConfigError as e:
                raise ValueError(str(e)) from None
        try:
            staged = self.settings.propose(args, check)
        except ValueError as e:
            return Outcome(False, error=str(e)[:300])
        except OSError as e:
            return Outcome(False, error=f"the revision was not stored: {e.strerror}")
        log.warning("fleet settings: %s", staged.text)
        if staged.restart:
            self._after(APPLY_AFTER_S, lambda: self._stop(
                f"applying fleet settings revision {staged.revision}"))
        return Outcome(True, staged.text)

    def _settings_watch(self) -> None:
        """At start: say how the last trial or expiry ended, and set the alarms."""
        self._settings_step(self.settings.expired)   # by a reboot: told below, no restart
        untold = self.settings.unannounced()
        if untold is not None:
            self._settings_ended(untold)
        now = time.monotonic()
        if self.settings.on_trial:
            self._after(self.settings.deadline - now, self._trial_due)
        expiry = self.settings.next_expiry()
        if expiry is not None:
            self._after(expiry - now, self._settings_expired)
        if self.config.fleet_problem:
            log.error("%s; running on the local file alone", self.config.fleet_problem)

    def _trial_due(self) -> None:
        ended = self._settings_step(self.settings.due)
        if ended is not None:
            self._stop(f"fleet settings revision {ended.revision} rolled back: {ended.why}")

    def _settings_expired(self) -> None:
        ended = self._settings_step(self.settings.expired)
        if ended is not None:
            self._stop(f"fleet settings {', '.join(ended.keys)} expired")

    def _settings_step(self, step) -> Ended | None:
        try:
            return step()
        except OSError as e:
            log.error("cannot write the fleet settings in %s: %s", self.config.identity.state_dir,
                      e.strerror)
            return None

    def _settings_ended(self, ended: Ended) -> None:
        """The journal and the server hear how a revision ended, once."""
        level = logging.INFO if ended.result == settings_rules.KEPT else logging.WARNING
        log.log(level, "fleet settings revision %d %s%s%s", ended.revision, ended.result,
                f" ({', '.join(ended.keys)})" if ended.keys else "",
                f": {ended.why}" if ended.why else "")
        self.outbox.put(Event(f"config.{ended.result}", time.time(),
                              {"revision": ended.revision, "why": ended.why,
                               "keys": list(ended.keys)}))
        self._settings_step(self.settings.announced)

    def _after(self, delay_s: float, then) -> None:
        timer = threading.Timer(max(0.0, delay_s), then)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _enqueue(self, kind: str, payload: bytes) -> str:
        """From the command thread: what a command queues (a log bundle, a screenshot)."""
        refusal = uncarried(self.profile, kind)
        if refusal:
            raise NotQueued(refusal)
        try:
            return self.uploads.add(kind, payload)
        except (QueueRefused, QueueUnavailable) as e:
            raise NotQueued(str(e)) from None

    def _upload_sender(self):
        if self.profile.link_upload_kinds:
            return LinkUploadSender(self.runner, self.profile)
        return UploadSender(self.config.server.url, self.identity, self.config.server.egress)

    def _outbox_put(self) -> None:
        self.runner.events_queued()
        self._refresh_status()

    # -- between parts built before one another ---------------------------------------
    def _link_up(self) -> None:
        """The link is up (or the device paired anew): uploads held for it may go."""
        self.uploads.link_up()

    def _command_finished(self, command_id: str, outcome, started: float) -> None:
        self.runner.command_finished(command_id, outcome, started)

    def _update_settled(self, command_id: str, ok: bool, text: str) -> None:
        outcome = Outcome(True, text) if ok else Outcome(False, error=text)
        self._command_finished(command_id, outcome, time.time())
        self._refresh_status()

    def _link_socket(self):
        """For the diagnostics command: the path MTU of the live connection."""
        return self.runner.raw_socket()

    # -- identity ---------------------------------------------------------------
    @property
    def token(self) -> str | None:
        return self.ids.token()

    @property
    def device_id(self) -> str:
        return self.ids.device_id()

    def identity(self) -> tuple[str, str] | None:
        current = self.ids.current
        return (current.device_id, current.token) if current.token else None

    def _identity_hooks(self) -> Hooks:
        def reregister(why: str) -> None:
            self.profile.forget_pairing()
            self.runner.credentials_dropped(why)

        def restart_enrollment(generation: int) -> None:
            # not before the link would have tried again: a server that keeps refusing
            # is never hammered
            self.enroller.restart(self.runner.seconds_to_next_attempt(), generation)

        return Hooks(restart_enrollment=restart_enrollment, pause_link=self.runner.pause,
                     resume_link=self.runner.resume, reregister=reregister,
                     resume_uploads=self._link_up,
                     status_changed=self._refresh_status,
                     credentials_write_failed=self._credentials_write_failed,
                     credentials_stored=(self.enroller.credentials_stored
                                         if self.enroller is not None else lambda: None))

    # -- status -----------------------------------------------------------------
    def _pairing(self) -> dict | None:
        if self.profile_pairs and not self.preprovisioned:
            current = self.ids.current   # one snapshot: token and claim from the same change
            if current.token and current.claimed:
                return {"state": "paired"}
            code = self.profile.pairing_code
            return {"state": "registered-waiting-for-pairing" if current.token else "waiting-for-pairing",
                    "code": shown(code), "expires_in_s": None,
                    "expiry": self.profile.CODE_EXPIRY, "where": self.profile.CLAIM_WHERE}
        return self.enroller.pairing() if self.enroller is not None else None

    def _on_link_status(self, link: dict) -> None:
        self._last_link = link
        if link.get("proven_live") and self.settings.on_trial:
            ended = self._settings_step(self.settings.proven)
            if ended is not None:
                self._settings_ended(ended)
        self._refresh_status()

    def _network_up(self) -> None:
        """From the events thread: the device's own network is back after being down."""
        # a new lease, maybe a new network: read it again once DHCP had its moment
        self._inventory_due = time.monotonic() + INVENTORY_AFTER_NETWORK_S
        self.profile.network_returned()
        self.runner.network_up()

    def _refresh_status(self) -> None:
        if self.code_board is not None:
            pairing = self._pairing()
            # shown once the server holds it (registered), until it is claimed
            self.code_board.show(pairing.get("code") if pairing.get("state")
                                 == "registered-waiting-for-pairing" else None)
        self._say_status(self._last_link)
        self._write_status(self._last_link)

    def _say_status(self, link: dict) -> None:
        """systemd's one line (`systemctl status`)."""
        self.notifier.status(status.line(link, self._pairing(), self.storage.snapshot()))

    def _write_status(self, link: dict) -> None:
        doc = self._status_doc(link)
        with self._status_lock:
            try:
                status.write(self.config.status_path, doc)
            except OSError as e:
                log.warning("cannot write status file %s: %s", self.config.status_path,
                            e.strerror)

    def _status_now(self) -> dict:
        return self._status_doc(self._last_link)

    def _status_doc(self, link: dict) -> dict:
        return status.document(
            device_id=self.device_id, pairing=self._pairing(), server=self.config.server.display,
            link=link, storage=self.storage.snapshot(), credentials=self.ids.storage(),
            uploads=self.uploads.snapshot(),
            events={"mode": self.events.mode if self.events else "disabled",
                    **self.outbox.snapshot()},
            journal=self.runner.journal_snapshot(), commands=self.commands.recent(),
            update=self.updater.snapshot(),
            hours=self.hours.snapshot() if self.hours else None,
            settings={**self.settings.snapshot(self.config.origins),
                      "problem": self.config.fleet_problem or self.settings.problem,
                      "adjusted": [config_mod.adjustment_text(*a) for a in self.config.adjusted]})

    def may_pet(self) -> tuple[bool, str]:
        # a screen waiting for its operator to type the code is healthy, not wedged
        # (on screentinker the link is up while it waits, and proves itself)
        enrolling = self.enroller is not None and self.enroller.waiting
        verdict = self.gate.verdict(time.monotonic(), self.runner.link_live() or enrolling,
                                    self.runner.outage())
        if self.gate.restarts_to_keep is not None:
            self.schedule.keep_outage_restarts(self.gate.restarts_to_keep)
            self.gate.restarts_to_keep = None
        return verdict

    # -- lifecycle --------------------------------------------------------------
    def _stop(self, why: str) -> None:
        if not self._stopping.is_set():
            log.info("%s, stopping", why)
            self._stopping.set()
            self.notifier.stopping()
            self.runner.request_stop()

    def run(self) -> int:
        def on_signal(signum, _frame):
            self._stop(f"received {signal.Signals(signum).name}")

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        # `edge-agent enqueue` pokes us when it queued something
        signal.signal(signal.SIGUSR1, lambda *_: self.uploads.wake())
        # `edge-agent unpair` / `enroll` ask for a fresh pairing
        signal.signal(signal.SIGUSR2, lambda *_: self.ids.revoked())
        log.info("edge-agent %s starting: device %s, server %s, %s", __version__,
                 self.device_id, self.config.server.display,
                 "pre-provisioned token" if self.preprovisioned else
                 "paired" if self.token else "not paired yet")
        self.runner.begin()   # the link's first state, before the threads that write status
        early, self._storage_events = self._storage_events, None
        for key, given, used in self.config.adjusted:
            log.warning("configuration: %s (a value an earlier release took; set it within "
                        "today's bounds in %s)", config_mod.adjustment_text(key, given, used),
                        self.config.source)
            early.append(Event("config.adjusted", time.time(),
                               {"key": key, "given": given, "used": used}))
        for event in early:   # what start-up found: to the server once the link is live
            self.outbox.put(event)
        self._settings_watch()
        main_wait = MainThreadWait()
        link_ended = threading.Event()   # set before the thread is no longer alive

        def wake_main() -> None:
            link_ended.set()
            main_wait.wake()

        self.runner.start(then=wake_main)
        self.uploads.start()
        if self.enroller is not None:
            self.enroller.start()
        if self.events is not None:
            self.events.start()
        if self.hours is not None:
            self.hours.start()
        # Ready means configured and looping, not connected: a player that boots
        # offline is still a healthy service.
        self.notifier.ready("starting link")
        petter = None
        period = watchdog_period_s(self.environ)
        if period is not None and self.notifier.enabled:
            petter = WatchdogPetter(self.notifier, period, self.may_pet)
            petter.start()
            log.info("systemd watchdog armed: %.0fs, pets every %.1fs while %s", period,
                     petter.interval_s, "the link is proven live" if self.gate.require_link
                     else "the agent's loops make progress")
            heal_s = heal_window_s(self.config.link.liveness)
            if self.gate.require_link and period < heal_s:
                log.warning("WatchdogSec=%gs is shorter than the link goes unproven while it "
                            "heals one silent drop by itself (%gs: two heartbeats plus the ACK "
                            "timeout): systemd would restart a healthy agent; raise WatchdogSec "
                            "or lower [link] heartbeat_interval_s", period, heal_s)
        while not link_ended.is_set():
            # A signal (its handler stops the link) or the link thread's end: this
            # thread has nothing else to do and never wakes on a timer.
            main_wait.wait()
        self.runner.loop.join()
        main_wait.close()
        if self.runner.loop.gave_up:   # a bug, not bad input: a fresh process
            self._failed = True
            self.notifier.stopping()
        for timer in self._timers:
            timer.cancel()
        if petter is not None:
            petter.stop()
        if self.enroller is not None:
            self.enroller.stop()
        if self.events is not None:
            self.events.stop()
        if self.hours is not None:
            self.hours.stop()
        self.commands.stop()
        self.ids.flush()
        # Queued items are already durable; stopping only ends the round in progress.
        self.uploads.stop()
        self.uploads.join(3.0)
        log.info("edge-agent stopped")
        return 1 if self._failed else 0
