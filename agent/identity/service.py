"""The shell around IdentityCore: one lock, the credentials file, the journal, callbacks.

Every identity event, from any thread, goes through ``handle``: the core decides under
the lock, the credentials reach the disk, and only then is the new identity published
to readers; the other effects follow, still in order. The effects' callbacks only post
to other threads or take their own short locks: none calls back into this one.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable

from . import core as C
from .credentials import Credentials

log = logging.getLogger("edge_agent.identity")


@dataclass
class Hooks:
    restart_enrollment: Callable[[int], None] = lambda generation: None
    pause_link: Callable[[], None] = lambda: None
    resume_link: Callable[[], None] = lambda: None
    reregister: Callable[[str], None] = lambda why: None
    resume_uploads: Callable[[], None] = lambda: None
    status_changed: Callable[[], None] = lambda: None


class IdentityService:
    def __init__(self, core: C.IdentityCore, credentials: Credentials, hooks: Hooks | None = None):
        self.core = core
        self.credentials = credentials
        self.hooks = hooks or Hooks()
        self.current: C.Identity = core.current
        self._lock = threading.RLock()

    @classmethod
    def load(cls, local_device_id: str, credentials: Credentials, configured_token: str | None,
             device_id_configured: bool, pairs_in_link: bool) -> "IdentityService":
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
                   credentials)

    @property
    def preprovisioned(self) -> bool:
        return self.core.preprovisioned

    def handle(self, event) -> None:
        with self._lock:
            effects = self.core.handle(event)
            for effect in effects:
                if isinstance(effect, C.Store):
                    self.credentials.save(self.core.local_device_id, effect.token,
                                          effect.server_device_id, effect.pairing_code,
                                          effect.claimed)
                elif isinstance(effect, C.Forget):
                    self.credentials.clear()
            self.current = self.core.current   # on disk first, then in use
            for effect in effects:
                self._run(effect)

    def _run(self, effect) -> None:
        h = self.hooks
        if isinstance(effect, C.Note):
            log.log(effect.level, "%s", effect.message)
        elif isinstance(effect, C.RestartEnrollment):
            h.restart_enrollment(effect.generation)
        elif isinstance(effect, C.Reregister):
            h.reregister(effect.why)
        elif not isinstance(effect, (C.Store, C.Forget)):   # those went first, to the disk
            {C.PauseLink: h.pause_link, C.ResumeLink: h.resume_link,
             C.ResumeUploads: h.resume_uploads, C.StatusChanged: h.status_changed}[type(effect)]()
