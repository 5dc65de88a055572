"""The shell around IdentityCore: one lock, the credentials file, the journal, callbacks.

Every identity event, from any thread, goes through ``handle``: the core decides under
the lock, the credentials file is written, and the new identity is published to
readers; the other effects follow, still in order. The effects' callbacks only post to
other threads or take their own short locks: none calls back into this one.

A write the disk refuses (full, read-only, failing) is reported to the core, which
keeps the identity in use and says when to try again; an alarm of this shell's (its
Timers thread, started at the first refusal) tries it then, and is set again at each
change of the core's time. None is set once the disk has taken it.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable

from ..base.clock import Clock, SystemClock
from ..base.journal_fields import journal
from ..runtime.threads import Alarm, Timers
from ..runtime.watchdog_gate import WatchdogGate
from . import core as C
from .credentials import Credentials

log = logging.getLogger("edge_agent.identity")


@dataclass
class Hooks:
    """What the identity tells the other parts: pair again, pause or resume the link, and so on."""
    restart_enrollment: Callable[[int], None] = lambda generation: None
    pause_link: Callable[[], None] = lambda: None
    resume_link: Callable[[], None] = lambda: None
    reregister: Callable[[str], None] = lambda why: None
    resume_uploads: Callable[[], None] = lambda: None
    status_changed: Callable[[], None] = lambda: None
    credentials_stored: Callable[[], None] = lambda: None   # a token reached the card
    # a write the disk refused (path, error): retried here; the storage report is the caller's
    credentials_write_failed: Callable[[str, OSError], None] = lambda path, error: None


class IdentityService:
    def __init__(self, core: C.IdentityCore, credentials: Credentials, hooks: Hooks | None = None,
                 clock: Clock | None = None, gate: WatchdogGate | None = None):
        """``gate``: the retries' thread is on the watchdog gate while it writes."""
        self.core = core
        self.credentials = credentials
        self.hooks = hooks or Hooks()
        self.clock = clock or SystemClock()
        self.current: C.Identity = core.current
        self._storage: dict | None = None    # the core's, replaced whole: read without the lock
        self._lock = threading.RLock()
        self._timers = Timers("credentials", gate=gate, clock=self.clock.monotonic)
        self._retry: Alarm | None = None   # set while a write waits for the disk

    @classmethod
    def load(cls, local_device_id: str, credentials: Credentials, configured_token: str | None,
             device_id_configured: bool, pairs_in_link: bool,
             gate: WatchdogGate | None = None) -> "IdentityService":
        """What this device was when it last ran: agent.toml's token, or the stored one."""
        preprovisioned = configured_token is not None
        token = configured_token or credentials.load(local_device_id)
        device_id = local_device_id
        if token and not device_id_configured:
            # a server that assigns ids (ScreenTinker) knows us by its own
            device_id = credentials.server_device_id() or local_device_id
        claimed = preprovisioned or bool(token) and (not pairs_in_link or credentials.claimed())
        code = credentials.pairing_code() if token else None
        identity = C.Identity(device_id, token, claimed, code)
        return cls(C.IdentityCore(local_device_id, identity, preprovisioned, pairs_in_link),
                   credentials, gate=gate)

    @property
    def preprovisioned(self) -> bool:
        return self.core.preprovisioned

    def storage(self) -> dict | None:
        """For status: the credentials write the disk still lacks, or None when it has
        everything. Never the token."""
        doc = self._storage
        if doc is None:
            return None
        at = doc.get("next_try_at")
        return {**{k: v for k, v in doc.items() if k != "next_try_at"},
                "next_try_in_s": None if at is None else round(max(0.0, at - self.clock.monotonic()), 1)}

    def handle(self, event) -> None:
        with self._lock:
            self._apply(self.core.handle(event, self.clock.monotonic()))

    def flush(self) -> None:
        """At the agent's stop: credentials held back for the card's budget are written."""
        with self._lock:
            self._apply(self.core.flush())

    # -- what the parts that talk to the server read and report (any thread) ------------
    def device_id(self) -> str:
        return self.current.device_id

    def token(self) -> str | None:
        return self.current.token

    def pairing_code(self) -> str | None:
        return self.current.pairing_code

    def claimed(self) -> bool:
        return self.current.claimed

    def enrolled(self, token: str, generation: int) -> None:
        """The enroller's poll brought a token (of the enrollment ``generation``)."""
        self.handle(C.Enrolled(token, generation))

    def registered(self, token: str, server_device_id: str | None = None,
                   pairing_code: str | None = None) -> None:
        """A server that pairs inside the link handed a token at registration."""
        self.handle(C.Registered(token, server_device_id, pairing_code))

    def claimed_as(self, name: str) -> None:
        self.handle(C.Claimed(name))

    def unpaired_by_server(self) -> None:
        self.handle(C.UnpairedByServer())

    def refused(self, detail: str) -> None:
        """The server refused the token at connect."""
        self.handle(C.Refused(detail))

    def revoked(self) -> None:
        """Unpaired on this device (edge-agent unpair): enroll again."""
        self.handle(C.Revoked())

    def _apply(self, effects: list) -> None:
        """Under the lock: the disk first, then the identity is published, then the rest."""
        answers = []
        for effect in effects:
            if isinstance(effect, (C.Store, C.Forget)):
                answers += self.core.handle(self._write(effect))
        self.current = self.core.current
        self._storage = self.core.storage()
        for effect in effects + answers:
            self._run(effect)
        self._arm()

    def _write(self, effect):
        try:
            if isinstance(effect, C.Store):
                self.credentials.save(self.core.local_device_id, effect.token,
                                      effect.server_device_id, effect.pairing_code, effect.claimed)
                self.hooks.credentials_stored()
            else:
                self.credentials.clear()
        except OSError as e:
            self.hooks.credentials_write_failed(self.credentials.path, e)
            # strerror only: the exception's text may carry a path, never the token
            return C.WriteFailed(effect, e.strerror or type(e).__name__, self.clock.monotonic())
        return C.Written(effect)

    # -- retries ------------------------------------------------------------------
    def _arm(self) -> None:
        """Under the lock: the alarm at the core's time for the write that waits, or
        none when nothing waits."""
        at, alarm = self.core.next_write_at, self._retry
        if alarm is not None and not alarm.done and alarm.at == at:
            return
        if alarm is not None:
            alarm.cancel()
        self._retry = None if at is None else self._timers.at(at, self._retry_due,
                                                               name="credentials write")

    def _retry_due(self) -> None:
        """On the alarm's thread: the writes due now, tried; _apply sets the next alarm."""
        with self._lock:
            self._apply(self.core.due(self.clock.monotonic()))

    def _run(self, effect) -> None:
        h = self.hooks
        if isinstance(effect, C.Note):
            log.log(effect.level, "%s", effect.message, extra=journal(effect.message_id))
        elif isinstance(effect, C.RestartEnrollment):
            h.restart_enrollment(effect.generation)
        elif isinstance(effect, C.Reregister):
            h.reregister(effect.why)
        elif not isinstance(effect, (C.Store, C.Forget)):   # those went first, to the disk
            {C.PauseLink: h.pause_link, C.ResumeLink: h.resume_link,
             C.ResumeUploads: h.resume_uploads, C.StatusChanged: h.status_changed}[type(effect)]()
