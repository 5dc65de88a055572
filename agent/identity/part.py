"""Who this device is and how it pairs, assembled: the credentials on the card, the
identity service over its core, and the way this server pairs a screen: the enroller
(a profile that pairs outside its link, docs/PROTOCOL.md) or the code board (one that
pairs inside it, ScreenTinker). The daemon builds one before the link, which
subscribes to it, and starts and stops it; the rest of the agent asks it for the
identity and the pairing. The probe of the server's kind (kind_probe.py) is given out
here, for the daemon builds it first."""
from __future__ import annotations

import os
from functools import partial
from typing import Callable, Protocol

from ..base.hardware import board_fingerprint
from ..base.identifiers import shown
from ..config.model import Identity, Server
from ..runtime.watchdog_gate import WatchdogGate
from . import board, device, pairing_code
from .credentials import Credentials
from .kind_probe import ServerKind
from .service import Hooks, IdentityService

__all__ = ["DeviceIdentity", "ServerKind"]


class Pairs(Protocol):
    """What pairing needs of the server's profile (link/profiles/)."""

    pairing_code: str | None
    CODE_EXPIRY: str
    CLAIM_WHERE: str

    def forget_pairing(self) -> None: ...


class StorageReports(Protocol):
    """Where a part that cannot use the card says so (app/state_health.py)."""

    def unavailable(self, part: str, path: str, e: Exception, holds: str) -> None: ...

    def credentials(self, path: str, e: OSError) -> None: ...


class DeviceIdentity:
    """``profile``: the server's profile class; one that pairs inside its link says where
    and how long its code is claimed (CLAIM_WHERE, CODE_EXPIRY: the code board)."""

    def __init__(self, section: Identity, server: Server, runtime_dir: str, *,
                 profile: type, storage: StorageReports, on_change: Callable[[], None],
                 gate: WatchdogGate | None = None, sysfs: str = "/sys"):
        pairs_in_link = profile.pairs_in_link
        self._section = section
        self._storage = storage
        self.pairs_in_link = pairs_in_link
        # before anything of the identity is read: a card copied from another screen
        # becomes a screen of its own (identity/board.py)
        found = board_fingerprint(sysfs)
        self.board = board.check(section.state_dir, found,
                                 movable=section.token is None and section.device_id is None)
        self._board_key = board.fresh_board(self.board, found)
        self.credentials = Credentials(section.state_dir)
        self.ids = IdentityService.load(
            section.device_id or self._local_device_id(), self.credentials,
            section.token, section.device_id is not None, pairs_in_link, gate=gate)
        self.preprovisioned = self.ids.preprovisioned
        self.enroller = None
        if not self.preprovisioned and not pairs_in_link:
            # loaded only here: a token in the configuration, or a server that pairs in
            # the link, needs no enrollment (its core, its requests) at the start
            from .enroller import Enroller
            self.enroller = Enroller(
                server.url, self.ids.device_id(), runtime_dir, server.egress,
                on_paired=self.ids.enrolled, on_change=on_change,
                show_on_console=section.show_code_on_console, gate=gate,
                paired_with=self.ids.token())
        # a code made inside the link is shown where the enroller shows its own: the
        # file and the journal, as well as status
        self.code_board = (pairing_code.Board(runtime_dir, profile.CLAIM_WHERE,
                                              profile.CODE_EXPIRY)
                           if pairs_in_link and not self.preprovisioned else None)
        self._profile: Pairs | None = None
        self._heard: dict[str, list[Callable]] = {
            "pause_link": [], "resume_link": [], "reregister": [], "resume_uploads": []}
        self._next_attempt: Callable[[], float] = lambda: 0.0
        enroller = self.enroller
        self.ids.hooks = Hooks(
            restart_enrollment=self._restart_enrollment,
            pause_link=partial(self._tell, "pause_link"),
            resume_link=partial(self._tell, "resume_link"), reregister=self._reregister,
            resume_uploads=partial(self._tell, "resume_uploads"), status_changed=on_change,
            credentials_write_failed=storage.credentials,
            credentials_stored=(enroller.credentials_stored if enroller is not None
                                else lambda: None))

    def _local_device_id(self) -> str:
        try:
            return device.load_or_create(self._section.state_dir, self._board_key)
        except OSError as e:
            # derived again the same way at the next start (from machine-id and serial)
            self._storage.unavailable("device id", os.path.join(self._section.state_dir,
                                                                "device_id"),
                                      e, "derived for this run only")
            return device.derive(self._board_key)

    def subscribe(self, *, pause_link: Callable[[], None] | None = None,
                  resume_link: Callable[[], None] | None = None,
                  reregister: Callable[[str], None] | None = None,
                  next_attempt: Callable[[], float] | None = None,
                  resume_uploads: Callable[[], None] | None = None,
                  pairs: Pairs | None = None) -> None:
        """What a part built after this one hears of a change of credentials: the link
        (pause, resume, re-register; when it would try again, which an enrollment
        restarted waits for; its profile, which holds a code made inside the link) and
        the uploads (resume)."""
        for name, heard in (("pause_link", pause_link), ("resume_link", resume_link),
                            ("reregister", reregister), ("resume_uploads", resume_uploads)):
            if heard is not None:
                self._heard[name].append(heard)
        if next_attempt is not None:
            self._next_attempt = next_attempt
        if pairs is not None:
            self._profile = pairs

    def _tell(self, name: str, *args) -> None:
        for heard in self._heard[name]:
            heard(*args)

    def _reregister(self, why: str) -> None:
        if self._profile is not None:
            self._profile.forget_pairing()
        self._tell("reregister", why)

    def _restart_enrollment(self, generation: int) -> None:
        # not before the link would have tried again: a server that keeps refusing is
        # never hammered
        self.enroller.restart(self._next_attempt(), generation)

    # -- what the rest of the agent asks ----------------------------------------------
    def device_id(self) -> str:
        return self.ids.device_id()

    def token(self) -> str | None:
        return self.ids.token()

    def current(self) -> tuple[str, str] | None:
        """(device id, token) to connect with, or None while there is no token."""
        current = self.ids.current
        return (current.device_id, current.token) if current.token else None

    @property
    def waiting(self) -> bool:
        """Waiting for an operator to type the code: healthy, not wedged."""
        return self.enroller is not None and self.enroller.waiting

    def pairing(self) -> dict | None:
        if self.pairs_in_link and not self.preprovisioned and self._profile is not None:
            current = self.ids.current   # one snapshot: token and claim from the same change
            if current.token and current.claimed:
                return {"state": "paired"}
            return {"state": "registered-waiting-for-pairing" if current.token
                    else "waiting-for-pairing",
                    "code": shown(self._profile.pairing_code), "expires_in_s": None,
                    "expiry": self._profile.CODE_EXPIRY, "where": self._profile.CLAIM_WHERE}
        return self.enroller.pairing() if self.enroller is not None else None

    def show_code(self, pairing: dict | None) -> None:
        """On every status change: a code the server holds (registered) is shown until
        it is claimed."""
        if self.code_board is not None:
            self.code_board.show(pairing.get("code") if pairing and pairing.get("state")
                                 == "registered-waiting-for-pairing" else None)

    def describe(self) -> str:
        return ("pre-provisioned token" if self.preprovisioned else
                "paired" if self.ids.token() else "not paired yet")

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        if self.enroller is not None:
            self.enroller.start()

    def stop(self) -> None:
        if self.enroller is not None:
            self.enroller.stop()
        self.ids.flush()
