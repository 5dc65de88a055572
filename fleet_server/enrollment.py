"""Enrollment and pairing (docs/PROTOCOL.md, Enrollment), the server's side: a device
without a token asks for a pairing code and polls with its poll secret; an operator's
pairing with that code grants the device its token. Wrong codes are what a brute force
makes: they are limited per operator."""
from __future__ import annotations

import logging
import re
import secrets
import time

from aiohttp import web

from fleet_server.behaviour import Behaviour
from fleet_server.devices import Registry
from fleet_server.serving import read_json

log = logging.getLogger("fleet_server")

DEVICE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
PAIR_WINDOW_S = 60


class Enrollment:
    def __init__(self, behaviour: Behaviour, registry: Registry):
        self.behaviour = behaviour
        self.registry = registry
        self.enrollments: dict[str, dict] = {}   # device_id -> pending enrollment
        self.codes: dict[str, str] = {}          # pairing code -> device_id
        self._pair_failures: dict[str, list] = {}  # operator -> times of wrong codes

    async def enroll(self, request) -> web.Response:
        body = await read_json(request)
        device_id = body.get("device_id")
        if not isinstance(device_id, str) or not DEVICE_ID.match(device_id):
            raise web.HTTPBadRequest(text="device_id required")
        now = time.monotonic()
        old = self.enrollments.get(device_id)
        if old is not None:
            self.codes.pop(old["code"], None)
        while True:
            code = f"{secrets.randbelow(10 ** 6):06d}"
            if code not in self.codes:
                break
        entry = {"code": code, "poll_secret": secrets.token_urlsafe(24),
                 "expires_at": now + self.behaviour.code_ttl_s, "token": None,
                 "facts": body.get("facts") if isinstance(body.get("facts"), dict) else {}}
        self.enrollments[device_id] = entry
        self.codes[code] = device_id
        log.info("device %s enrolling: pairing code %s-%s", device_id, code[:3], code[3:])
        return web.json_response({"pairing_code": code, "poll_secret": entry["poll_secret"],
                                  "expires_in_s": self.behaviour.code_ttl_s})

    async def poll(self, request) -> web.Response:
        device_id = request.match_info["device_id"]
        entry = self.enrollments.get(device_id)
        if entry is None or (entry["token"] is None and entry["expires_at"] < time.monotonic()):
            raise web.HTTPNotFound(text="no such enrollment")
        if request.headers.get("Authorization") != f"Bearer {entry['poll_secret']}":
            raise web.HTTPForbidden(text="bad poll secret")
        if entry["token"] is None:
            return web.json_response({"status": "pending"})
        return web.json_response({"status": "paired", "token": entry["token"]})

    def pairing_limited(self, operator: str, now: float) -> bool:
        """True while ``operator`` has used up its wrong codes for the window."""
        failures = [t for t in self._pair_failures.get(operator, []) if now - t < PAIR_WINDOW_S]
        self._pair_failures[operator] = failures
        return len(failures) >= self.behaviour.pair_limit

    def pair_failed(self, operator: str, now: float) -> None:
        self._pair_failures.setdefault(operator, []).append(now)

    def pair(self, code: str, now: float) -> str | None:
        """The device whose live code this is, now holding a fresh token; None if none."""
        device_id = self.codes.get(code)
        entry = self.enrollments.get(device_id) if device_id else None
        if entry is None or entry["expires_at"] < now:
            return None
        token = secrets.token_urlsafe(32)
        entry["token"] = token
        self.codes.pop(code, None)
        self.registry.tokens[device_id] = token
        return device_id

    def revoke(self, device_id: str) -> None:
        """The device's token and any pending enrollment are gone."""
        self.registry.tokens.pop(device_id, None)
        self.enrollments.pop(device_id, None)
