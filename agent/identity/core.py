"""Who this device is to its server, sans I/O: one object, typed events in, effects out.

The token, the id the server knows the device by, whether an operator claimed it and
the pairing code of a registration change here and nowhere else, one event at a time
(the shell in service.py feeds them under one lock, from whichever thread they come:
the link's callbacks, the enroller, the operator's SIGUSR2). Readers on other threads
see ``current``, a snapshot replaced whole, never half of a change.

The profiles differ only in their inputs: the native profile enrolls over HTTPS
(``Enrolled``), ScreenTinker registers inside the link (``Registered``, ``Claimed``,
``UnpairedByServer``). A token the enroller brings back is kept only if no revoke came
after the enrollment it answers started (``generation``): a revoke cannot be undone by
a pairing answer that was already on its way.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Identity:
    device_id: str             # what the server knows this device by
    token: str | None
    claimed: bool              # an operator added it (always, for the native profile's token)
    pairing_code: str | None   # the code a link registration was made with, until claimed


# -- events ---------------------------------------------------------------------
@dataclass(frozen=True)
class Registered:
    """The server registered us inside the link and handed over a token (ScreenTinker)."""
    token: str
    server_device_id: str | None = None
    pairing_code: str | None = None


@dataclass(frozen=True)
class Claimed:
    """An operator added this screen on the server (ScreenTinker)."""
    name: str = ""


@dataclass(frozen=True)
class UnpairedByServer:
    """The server no longer has this device (ScreenTinker)."""


@dataclass(frozen=True)
class Enrolled:
    """The enrollment that started at ``generation`` was paired: its token."""
    token: str
    generation: int


@dataclass(frozen=True)
class Refused:
    """The server refused our token at connect."""
    detail: str


@dataclass(frozen=True)
class Revoked:
    """Drop the credentials and pair anew (the operator: SIGUSR2, `edge-agent unpair`)."""


# -- effects --------------------------------------------------------------------
@dataclass(frozen=True)
class Store:
    """Write the credentials (atomically, 0600) before the new identity is used."""
    token: str
    server_device_id: str | None = None
    pairing_code: str | None = None
    claimed: bool | None = None


@dataclass(frozen=True)
class Forget:
    """Delete the stored credentials."""


@dataclass(frozen=True)
class Note:
    level: int
    message: str


@dataclass(frozen=True)
class RestartEnrollment:
    generation: int


@dataclass(frozen=True)
class PauseLink:
    pass


@dataclass(frozen=True)
class ResumeLink:
    pass


@dataclass(frozen=True)
class Reregister:
    """Drop the link and register anew, with a fresh pairing code (ScreenTinker)."""
    why: str


@dataclass(frozen=True)
class ResumeUploads:
    """New credentials: a hold on refused ones ends."""


@dataclass(frozen=True)
class StatusChanged:
    pass


class IdentityCore:
    def __init__(self, local_device_id: str, current: Identity, preprovisioned: bool,
                 pairs_in_link: bool):
        self.local_device_id = local_device_id   # ours, derived once; a server may assign another
        self.current = current
        self.preprovisioned = preprovisioned     # a token from agent.toml: never dropped here
        self.pairs_in_link = pairs_in_link
        self.generation = 0                      # of the enrollment whose answer we would keep

    def handle(self, event) -> list:
        """Changes ``current`` as ``event`` says; returns what the shell must do, in order."""
        cur = self.current
        if isinstance(event, Registered):
            if event.token == cur.token and not (event.server_device_id
                                                 and event.server_device_id != cur.device_id):
                return []
            self.current = Identity(event.server_device_id or cur.device_id, event.token,
                                    False, event.pairing_code)
            return [Store(event.token, event.server_device_id, event.pairing_code, claimed=False),
                    Note(logging.INFO, f"registered with the server as {self.current.device_id}: "
                                       "credentials stored"), StatusChanged()]
        if isinstance(event, Claimed):
            if cur.claimed or not cur.token:
                return []
            self.current = replace(cur, claimed=True, pairing_code=None)
            named = f" as {event.name!r}" if event.name else ""
            return [Store(cur.token, cur.device_id, None, claimed=True),
                    Note(logging.INFO, f"paired: an operator added this screen{named}"),
                    ResumeUploads(), StatusChanged()]
        if isinstance(event, UnpairedByServer):
            if self.preprovisioned:
                return [Note(logging.ERROR, "the server unpaired this pre-provisioned device: "
                                            "check [identity] token")]
            self.current = Identity(self.local_device_id, None, False, None)
            return [Forget(), StatusChanged()]
        if isinstance(event, Enrolled):
            if event.generation != self.generation:
                return [Note(logging.INFO, "enrollment: unpaired while the pairing answer was "
                                           "on its way; not keeping that token")]
            self.current = replace(cur, token=event.token, claimed=True)
            return [Store(event.token), Note(logging.INFO, "paired: credentials stored"),
                    ResumeLink(), ResumeUploads(), StatusChanged()]
        if isinstance(event, Refused):
            if self.preprovisioned:
                return [Note(logging.ERROR, f"the server refused the pre-provisioned token "
                                            f"({event.detail}): check [identity] token; backing off")]
            if self.pairs_in_link or cur.token is None:
                return []  # ScreenTinker answers refusals with device:auth-error in the link
            return [Note(logging.WARNING, f"the server refused this device's token "
                                          f"({event.detail}): dropping it and enrolling again")
                    ] + self._revoke()
        if isinstance(event, Revoked):
            if self.preprovisioned:
                return [Note(logging.WARNING, "not unpairing: the token is pre-provisioned in "
                                              "agent.toml")]
            return self._revoke()
        raise TypeError(f"not an identity event: {event!r}")

    def _revoke(self) -> list:
        self.generation += 1
        self.current = Identity(self.local_device_id if self.pairs_in_link else self.current.device_id,
                                None, False, None)
        if self.pairs_in_link:
            return [Forget(), Reregister("unpaired on this screen"), StatusChanged()]
        # the enroller first: once it knows, an answer in flight can no longer be kept
        return [RestartEnrollment(self.generation), Forget(), PauseLink(), StatusChanged()]
