"""Settings from the fleet, run: a revision checked and staged by the configure command,
applied by a restart, kept once the link proves itself with it, rolled back or expired
by an alarm. The decisions are FleetSettings' (service.py, over the overlay file); this
is their orchestration, which the daemon only starts and stops."""
from __future__ import annotations

import logging
import time
from typing import Callable

from ..config.schema import ConfigError
from ..base.journal_fields import MessageId, journal
from ..events.model import Event
from ..runtime.threads import Timers
from ..runtime.watchdog_gate import WatchdogGate
from . import rules
from .service import Ended, FleetSettings

log = logging.getLogger("edge_agent")

# the fleet's revision has been applied; this long for its result to go out first
APPLY_AFTER_S = 1.0

# the endings the journal's catalog explains (an expired key is neither)
SETTINGS_MOMENTS = {rules.KEPT: MessageId.SETTINGS_KEPT,
                    rules.ROLLED_BACK: MessageId.SETTINGS_ROLLED_BACK}


class SettingsTrial:
    """``check(path_values)`` raises ConfigError for a revision the agent could not start
    on (app/checks.py); ``publish`` tells the server; ``stop(why)`` ends this process so
    that systemd starts the next on the new settings (Restart=always)."""

    def __init__(self, settings: FleetSettings, *, check: Callable[[dict], None],
                 publish: Callable[[Event], None], stop: Callable[[str], None],
                 fleet_problem: str | None, origins: dict, adjusted: list[str],
                 gate: WatchdogGate | None = None):
        """``origins``: where each key's value came from; ``fleet_problem`` why the
        overlay was not used; ``adjusted``: what an earlier release's values became (all
        as the configuration loaded them, for the status board)."""
        self.settings = settings
        self._check = check
        self._publish = publish
        self._stop = stop
        self._fleet_problem = fleet_problem
        self._origins, self._adjusted = origins, adjusted
        self._timers = Timers("settings", gate=gate)

    # -- the configure command, from the command thread --------------------------------
    def configure(self, args: dict) -> tuple[bool, str]:
        """A revision is checked as the file would be, staged, and applied by a restart:
        (staged, what the command's result says)."""
        def check(values: dict) -> None:
            try:
                self._check(values)
            except ConfigError as e:
                raise ValueError(str(e)) from None
        try:
            staged = self.settings.propose(args, check)
        except ValueError as e:
            return False, str(e)[:300]
        except OSError as e:
            return False, f"the revision was not stored: {e.strerror}"
        log.warning("fleet settings: %s", staged.text)
        if staged.restart:
            self._timers.after(APPLY_AFTER_S, lambda: self._stop(
                f"applying fleet settings revision {staged.revision}"), name="apply")
        return True, staged.text

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Says how the last trial or expiry ended, and sets the alarms."""
        self._step(self.settings.expired)   # by a reboot: told below, no restart
        untold = self.settings.unannounced()
        if untold is not None:
            self._ended(untold)
        # both on the monotonic clock, the alarms' own
        if self.settings.on_trial:
            self._timers.at(self.settings.deadline, self._trial_due, name="trial")
        expiry = self.settings.next_expiry()
        if expiry is not None:
            self._timers.at(expiry, self._expired, name="expiry")
        if self._fleet_problem:
            log.error("%s; running on the local file alone", self._fleet_problem)

    def stop(self) -> None:
        self._timers.stop()

    def snapshot(self) -> dict:
        return {**self.settings.snapshot(self._origins),
                "problem": self._fleet_problem or self.settings.problem,
                "adjusted": list(self._adjusted)}

    def link_proven(self) -> None:
        """From the link thread: the link is proven live; a revision on trial is kept."""
        if self.settings.on_trial:
            ended = self._step(self.settings.proven)
            if ended is not None:
                self._ended(ended)

    # -- alarms ------------------------------------------------------------------------
    def _trial_due(self) -> None:
        ended = self._step(self.settings.due)
        if ended is not None:
            self._stop(f"fleet settings revision {ended.revision} rolled back: {ended.why}")

    def _expired(self) -> None:
        ended = self._step(self.settings.expired)
        if ended is not None:
            self._stop(f"fleet settings {', '.join(ended.keys)} expired")

    def _step(self, step) -> Ended | None:
        try:
            return step()
        except OSError as e:
            log.error("cannot write the fleet settings in %s: %s", self.settings.state_dir,
                      e.strerror)
            return None

    def _ended(self, ended: Ended) -> None:
        """The journal and the server hear how a revision ended, once."""
        level = logging.INFO if ended.result == rules.KEPT else logging.WARNING
        log.log(level, "fleet settings revision %d %s%s%s", ended.revision, ended.result,
                f" ({', '.join(ended.keys)})" if ended.keys else "",
                f": {ended.why}" if ended.why else "",
                extra=journal(SETTINGS_MOMENTS.get(ended.result), REVISION=ended.revision,
                              EVENT=f"config.{ended.result}"))
        self._publish(Event(f"config.{ended.result}", time.time(),
                            {"revision": ended.revision, "why": ended.why,
                             "keys": list(ended.keys)}))
        self._step(self.settings.announced)
