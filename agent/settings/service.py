"""The agent's side of settings from the fleet: stage a revision, count the starts on
it, keep it once the link proves itself, roll it back when it does not.

Applying is a restart: every part reads its settings when it is built, and a fresh
process applies a revision whole or not at all (a heartbeat interval from one revision
never meets an ACK timeout from another). The restart is systemd's (Restart=always),
which also runs root's ExecStartPre again, so the grants follow the commands the
revision allows. The file is written when a revision arrives, at each start on trial,
and when the trial ends: never per heartbeat.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..base.boot import boot_id
from . import rules
from ..config import overlay as overlay_file, revision as revision_rules

log = logging.getLogger("edge_agent.settings")


def _locked(method):
    def run(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    run.__doc__, run.__name__ = method.__doc__, method.__name__
    return run


@dataclass(frozen=True)
class Staged:
    """What propose() did: the revision, the words for the server, and whether the
    agent must restart to apply it (not when it changes nothing)."""
    revision: int
    text: str
    restart: bool


@dataclass(frozen=True)
class Ended:
    """A trial's end or a setting's expiry, for the journal and the server."""
    result: str          # rules.KEPT | ROLLED_BACK | EXPIRED
    revision: int
    why: str = ""
    keys: tuple = ()


class FleetSettings:
    def __init__(self, state_dir: str, proof_timeout_s: float,
                 monotonic: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, boot: Callable[[], str] = boot_id):
        self.state_dir = state_dir
        self.proof_timeout_s = proof_timeout_s
        self.monotonic, self.wall, self.boot = monotonic, wall, boot
        self.overlay, self.problem = overlay_file.read(state_dir)
        self.deadline: float | None = None
        self._trying: int | None = None    # the revision this process runs on trial
        # the command thread stages, the link thread keeps, timers roll back and expire
        self._lock = threading.RLock()

    @property
    def on_trial(self) -> bool:
        """This process runs a revision on trial: begin() found it and set its deadline.
        (A revision this process staged is the next process's trial, not its own.)"""
        current = self.overlay.current
        return (self.deadline is not None and self._pending()
                and current.revision == self._trying)

    def _pending(self) -> bool:
        return self.overlay.current is not None and self.overlay.trial_starts is not None

    # -- a revision arrives ------------------------------------------------------
    @_locked
    def propose(self, args: dict, check: Callable[[dict], None]) -> Staged:
        """Stages a revision (the configure command's checked arguments) for the next
        start. ``check(values)`` raises with a one-line reason (config's rules);
        ValueError here says why it is refused."""
        if isinstance(self.problem, overlay_file.Unreadable):
            # a read error is not an empty overlay: read again, and write nothing over a
            # file the card may give back (its revisions, the highest seen) while it fails
            self.overlay, self.problem = overlay_file.read(self.state_dir)
            if isinstance(self.problem, overlay_file.Unreadable):
                raise ValueError(f"the settings overlay cannot be read ({self.problem}); "
                                 "nothing staged until the card reads again")
        values = args["values"]
        current = self.overlay.current
        outcome = self.overlay.outcome or {}
        seen = self.overlay.seen()
        if args["revision"] is None and seen >= revision_rules.MAX_REVISION:
            raise ValueError(f"revision: this screen has seen revision {seen}, the last there "
                             f"is; `edge-agent unpair` forgets the fleet's revisions")
        revision = args["revision"] or 1 + seen
        if outcome.get("revision") == revision and outcome.get("result") == rules.ROLLED_BACK:
            raise ValueError(f"revision {revision} was rolled back here "
                             f"({outcome.get('why', '')}); send it as a new revision")
        if current is not None and revision <= current.revision:
            raise ValueError(f"revision {revision} is not newer than revision "
                             f"{current.revision} in force")
        if revision <= seen:
            # the protocol's promise: each revision newer than the last, a rollback to the
            # file alone or an expiry in between included
            raise ValueError(f"revision {revision} is not newer than revision {seen}, "
                             f"already seen here")
        if values == (current.values if current else {}) and not args["expires_in_s"] \
                and not self._pending():
            # a switch flipped to where it is (a dashboard's debug box): no restart
            return Staged(current.revision if current else 0,
                          "these settings are already in force: nothing to apply", False)
        check(values)
        now = self.monotonic()
        overlay = self.overlay
        good = overlay.good if self._pending() else current
        staged = overlay_file.Revision(revision, values,
                                revision_rules.expiries(args["expires_in_s"], self.boot(), now),
                                round(self.wall(), 3))
        self._save(overlay_file.Overlay(staged, good, 0, overlay.outcome))
        return Staged(revision, f"revision {revision} staged ({len(values)} settings): the "
                      f"agent restarts with it and keeps it if its link is proven live within "
                      f"{self.proof_timeout_s:g} s, else goes back to "
                      + (f"revision {good.revision}" if good else "the local file alone"),
                      True)

    # -- the trial ---------------------------------------------------------------
    @_locked
    def begin(self) -> Ended | None:
        """At start: one more start on a revision on trial, and its deadline. Ended
        (rolled back: load the configuration again) when it already used its starts."""
        if not self._pending():
            return None
        self.overlay.trial_starts += 1
        self._trying = self.overlay.current.revision
        self.deadline = self.monotonic() + self.proof_timeout_s
        why = rules.rollback_reason(self.overlay.trial_starts, self.monotonic(), self.deadline)
        if why is not None:
            return self._roll_back(why)
        self._save(self.overlay)
        return None

    @_locked
    def proven(self) -> Ended | None:
        """The link is proven live: a revision on trial is kept."""
        if not self.on_trial:
            return None
        current = self.overlay.current
        return self._end(overlay_file.Overlay(current, None, None),
                         Ended(rules.KEPT, current.revision))

    @_locked
    def due(self) -> Ended | None:
        """Past the deadline without proof: rolled back (the caller restarts)."""
        if not self.on_trial:
            return None
        why = rules.rollback_reason(self.overlay.trial_starts, self.monotonic(), self.deadline)
        return self._roll_back(why) if why is not None else None

    def next_expiry(self) -> float | None:
        current = self.overlay.current
        if current is None:
            return None
        return revision_rules.next_expiry(current.values, current.until, self.boot(), self.monotonic())

    @_locked
    def expired(self) -> Ended | None:
        """Settings whose time is over leave the revision (the caller restarts); the
        rest of it stays in force, on trial or not as it was."""
        current = self.overlay.current
        if current is None:
            return None
        values, over = revision_rules.live(current.values, current.until, self.boot(), self.monotonic())
        if not over:
            return None
        left = overlay_file.Revision(current.revision, values,
                              {k: e for k, e in current.until.items() if k in values},
                              current.received_at)
        ended = Ended(rules.EXPIRED, current.revision, "its time is over", tuple(over))
        self._save(overlay_file.Overlay(left, self.overlay.good, self.overlay.trial_starts,
                                 self._outcome(ended)))
        return ended

    def unannounced(self) -> Ended | None:
        """The last end, if it was not told yet (a rollback or an expiry that restarted
        the agent before the link could carry it)."""
        last = self.overlay.outcome
        if not isinstance(last, dict) or last.get("announced"):
            return None
        return Ended(last.get("result", "?"), last.get("revision", 0), last.get("why", ""),
                     tuple(last.get("keys") or ()))

    @_locked
    def announced(self) -> None:
        """The last end was told (to the journal and the outbox): not again at a start."""
        if self.overlay.outcome is not None and not self.overlay.outcome.get("announced"):
            self.overlay.outcome["announced"] = True
            self._save(self.overlay)

    # -- status --------------------------------------------------------------------
    def snapshot(self, origins: dict) -> dict:
        current, now = self.overlay.current, self.monotonic()
        until = current.until if current else {}
        fleet = {k: v for k, v in (current.values.items() if current else ())
                 if origins.get(k) == "fleet"}
        return {"revision": current.revision if current else None,
                "state": (None if current is None else "trial" if self.on_trial
                          else "staged" if self._pending() else "kept"),
                "proof_due_in_s": (round(max(0.0, self.deadline - now), 1)
                                   if self.on_trial and self.deadline is not None else None),
                "fleet": {k: {"value": v,
                              "expires_in_s": (round(until[k].at - now, 1) if k in until
                                               else None)} for k, v in sorted(fleet.items())},
                "overridden_here": sorted(k for k in (current.values if current else ())
                                          if origins.get(k) == "env"),
                "last": self.overlay.outcome, "problem": self.problem,
                "origins": dict(sorted(origins.items()))}

    # -- internals -----------------------------------------------------------------
    def _roll_back(self, why: str) -> Ended:
        failed = self.overlay.current
        good = self.overlay.good
        ended = Ended(rules.ROLLED_BACK, failed.revision, why)
        try:
            return self._end(overlay_file.Overlay(good, None, None), ended)
        except OSError as e:
            # a full or failing card must not keep a revision that failed: without the
            # file the next start runs on the local file alone (an unlink needs no space)
            overlay_file.remove(self.state_dir)
            # remembered while this process runs; the file that kept it is gone
            self.overlay = overlay_file.Overlay(highest=self.overlay.seen())
            self.deadline = None
            return Ended(rules.ROLLED_BACK, failed.revision,
                         f"{why}; the overlay could not be written ({e.strerror}) and was "
                         f"removed: the local file alone")

    def _end(self, overlay: overlay_file.Overlay, ended: Ended) -> Ended:
        overlay.outcome = self._outcome(ended)
        self._save(overlay)
        self.deadline = None
        return ended

    def _outcome(self, ended: Ended) -> dict:
        return {"revision": ended.revision, "result": ended.result, "why": ended.why,
                "keys": list(ended.keys), "at": round(self.wall(), 3)}

    def _save(self, overlay: overlay_file.Overlay) -> None:
        overlay.highest = max(overlay.highest, self.overlay.seen())
        overlay_file.write(self.state_dir, overlay)   # OSError: the caller reports it
        self.overlay, self.problem = overlay, None
