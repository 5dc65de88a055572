"""Enrollment over HTTPS (requests), driven by EnrollmentCore, on its own thread.

Hostile answers (non-JSON, missing fields, a 50 MB body, a redirect, TLS failure)
cost a log line and a retry with backoff; nothing reaches the stored identity until
a well-formed token arrives.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time
from typing import Callable

import requests
import urllib3

from ..base.clock import SystemClock
from ..base.egress import Egress
from ..base.http import HostileAnswer
from ..base.fsutil import atomic_write, read_json
from ..base.hardware import hardware_facts
from ..base.journal_fields import MessageId, journal
from ..runtime.loop import Loop
from ..runtime.watchdog_gate import WatchdogGate
from .enrollment import (PAIRED, CodeUnknown, EnrollmentCore, Failed, GotCode, GotToken,
                         NoEnrollment, PairingCode, PollPairing, RequestCode, Retry, Started,
                         StillPending, Tick, TokenRefused)
from ..base.identifiers import shown
from .exchange import MAX_ANSWER_BYTES, MAX_SILENCE_S, MAX_WAIT_S, exchange
from .pairing_code import remove_file, write_file
from ..base.identifiers import token_problem

log = logging.getLogger("edge_agent.identity")

# the answers that say "no such thing here": to a poll, the code is gone; to the code
# request, the server does not enroll this way
NOT_FOUND = (404, 405, 410)
CODE_RE = re.compile(r"[0-9]{6}")   # whole strings only: fullmatch
# A restarted agent whose token never reached the card polls its paired code this long
# before it asks for a new one (the server answers a poll at once).
PAIRED_RECHECK_S = 120.0


def _delay(effects: list) -> float:
    """The backoff a failed request's answer gave (the core's Retry)."""
    return sum(e.delay_s for e in effects if isinstance(e, Retry))


class BadAnswer(Exception):
    pass


class Enroller:
    def __init__(self, server_url: str, device_id: str,
                 runtime_dir: str, egress: Egress = Egress(),
                 on_paired: Callable[[str, int], None] | None = None,
                 on_change: Callable[[], None] | None = None,
                 show_on_console: bool = False, gate: WatchdogGate | None = None,
                 paired_with: str | None = None):
        """``paired_with``: the token this device already holds: nothing to enroll
        until it is refused or dropped (restart())."""
        self.base = server_url
        self.device_id = device_id
        self.runtime_dir = runtime_dir
        self.clock = SystemClock()
        self.core = EnrollmentCore()
        if paired_with is not None:
            self.core.handle(GotToken(paired_with))
        # (token, generation): the identity core keeps it, or not if revoked meanwhile
        self._on_paired = on_paired or (lambda token, generation: None)
        self._on_change = on_change or (lambda: None)
        self._console = show_on_console
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._restart_hold: float | None = None
        self._generation = 0     # the identity core's, for the enrollment under way
        self._stopping = False
        self._begun = False
        self.session = egress.session(server_url)
        # on the watchdog gate while it has work: a dead enroller must not leave an
        # unpaired screen that systemd never restarts
        self.loop = Loop("enroll", self._turns, max_silence_s=MAX_SILENCE_S, gate=gate,
                         pause=lambda seconds: self._wake.wait(seconds) and self._stopping,
                         stopping=lambda: self._stopping)

    # -- control ------------------------------------------------------------------
    def restart(self, hold_s: float, generation: int) -> None:
        """The token was refused or dropped: enroll again. Called from any thread; the
        core is this thread's alone, so the request waits for it. A token that a poll in
        flight brings back meanwhile carries the old generation: the identity core
        throws it away."""
        with self._lock:
            self._restart_hold = hold_s
            self._generation = generation
        self._wake.set()

    def _take_restart(self) -> bool:
        with self._lock:
            hold, self._restart_hold = self._restart_hold, None
        if hold is None:
            return False
        self.core.handle(TokenRefused(self.clock.monotonic(), hold))
        return True

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    @property
    def waiting(self) -> bool:
        return self.core.state != PAIRED

    def pairing(self) -> dict | None:
        code = self.core.code
        if self.core.state == PAIRED or code is None:
            out = {"state": self.core.state, "error": self.core.last_error}
            wake = self.core.deadline()
            if self.core.last_error and wake != math.inf:
                out.update(next_try_in_s=round(max(0.0, wake - self.clock.monotonic()), 1),
                           attempts=self.core.attempts)
            return out
        return {"state": self.core.state, "code": code.display,
                "expires_in_s": round(max(0.0, code.expires_at - self.clock.monotonic())),
                "error": self.core.last_error}

    # -- the loop -----------------------------------------------------------------
    def start(self) -> None:
        self.loop.start()

    def _turns(self) -> None:
        if not self._begun:   # on this thread: a bad pairing file costs a line, not the agent
            self.core.handle(Started(self.clock.monotonic(), self._load_code()))
            self._begun = True
        while not self._stopping:
            self.loop.turn()
            self._take_restart()
            for action in self.core.handle(Tick(self.clock.monotonic())):
                self._execute(action)
            if self.core.state == PAIRED:
                # nothing to do until unpaired: no timer, no wake-ups, off the gate
                self.loop.idle()
                self._wake.wait()
            else:
                wait = self.core.deadline() - self.clock.monotonic()
                self._wake.wait(min(max(wait, 0.0), MAX_WAIT_S))
            self._wake.clear()

    def _execute(self, action) -> None:
        now = self.clock.monotonic
        try:
            if isinstance(action, RequestCode):
                code = self._request_code()
                self.core.handle(GotCode(now(), code))
                self._show(code)
            elif isinstance(action, PollPairing):
                with self._lock:
                    generation = self._generation
                token = self._poll()
                if token is None:
                    self.core.handle(StillPending(now()))
                    return
                # unpaired meanwhile? the identity core sees the old generation and drops
                # the token; this loop's restart comes next
                code = self.core.code
                self.core.handle(GotToken(token))
                self._keep_until_stored(code)
                self._on_paired(token, generation)
        except CodeGone:
            log.info("pairing code expired or used elsewhere; requesting a new one in %.0fs",
                     _delay(self.core.handle(CodeUnknown(now()))))
        except NotEnrolling as e:
            delay = _delay(self.core.handle(NoEnrollment(now(), e.status)))
            log.warning("enrollment: %s; retrying in %.0fs", self.core.last_error, delay)
        except (BadAnswer, requests.RequestException, urllib3.exceptions.HTTPError, OSError) as e:
            why = str(e) if isinstance(e, (BadAnswer, HostileAnswer)) else type(e).__name__
            log.warning("enrollment: %s; retrying in %.0fs", why,
                        _delay(self.core.handle(Failed(now(), why))))
        finally:
            self._on_change()

    # -- HTTP ---------------------------------------------------------------------
    def _request_code(self) -> PairingCode:
        body = self._call("POST", "/api/v1/enroll", NotEnrolling,
                          json={"device_id": self.device_id, "facts": hardware_facts()})
        code, secret, expires = body.get("pairing_code"), body.get("poll_secret"), body.get("expires_in_s")
        if not isinstance(code, str) or not CODE_RE.fullmatch(code):
            raise BadAnswer("enroll answer without a 6-digit pairing_code")
        # it goes back in a header: the token rule, and long enough not to be guessed
        if not isinstance(secret, str) or not 16 <= len(secret) <= 256 or token_problem("", secret):
            raise BadAnswer("enroll answer without a usable poll_secret (16-256 characters "
                            "of A-Z a-z 0-9 - . _ ~ + /)")
        if isinstance(expires, bool) or not isinstance(expires, (int, float)) or not 10 <= expires <= 86400:
            raise BadAnswer("enroll answer with a bad expires_in_s")
        return PairingCode(code, shown(code), self.clock.monotonic() + float(expires), secret)

    def _poll(self) -> str | None:
        code = self.core.code
        body = self._call("GET", f"/api/v1/enroll/{self.device_id}", CodeGone,
                          headers={"Authorization": f"Bearer {code.poll_secret}"})
        status = body.get("status")
        if status == "pending":
            return None
        if status == "paired":
            token = body.get("token")
            problem = token_problem("token", token)
            if problem:
                raise BadAnswer(f"paired answer: {problem}")
            return token
        raise BadAnswer(f"enroll status {str(status)[:40]!r}")

    def _call(self, method: str, path: str, not_found: type[NotFound], **kw) -> dict:
        """The answer's JSON object; ``not_found`` is raised on a 404/405/410."""
        status, raw = exchange(self.session, method, self.base + path, **kw)
        if status in NOT_FOUND:
            raise not_found(status)
        if 300 <= status < 400:
            raise BadAnswer(f"refusing a redirect (HTTP {status})")
        if status != 200:
            raise BadAnswer(f"HTTP {status}")
        if len(raw) > MAX_ANSWER_BYTES:
            raise BadAnswer("answer too large")
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):   # nested past the parser's depth: not an answer
            raise BadAnswer("answer is not JSON") from None
        if not isinstance(body, dict):
            raise BadAnswer("answer is not a JSON object")
        return body

    # -- showing the code ----------------------------------------------------------
    def _show(self, code: PairingCode) -> None:
        expires_wall = time.time() + (code.expires_at - self.clock.monotonic())
        log.info("pairing code %s: enter it on the fleet server (valid for %.0f min)",
                 code.display, (code.expires_at - self.clock.monotonic()) / 60,
                 extra=journal(MessageId.PAIRING_CODE_SHOWN))
        try:
            # for a signage player's UI to read and display
            write_file(self.runtime_dir, code.display)
            # for this agent's next start: same code until it expires
            atomic_write(os.path.join(self.runtime_dir, "pairing.json"), json.dumps(
                {"code": code.code, "poll_secret": code.poll_secret,
                 "expires_at_wall": expires_wall}).encode(), 0o600, durable=False)
        except OSError as e:
            log.warning("cannot write the pairing code file: %s", e.strerror)
        if self._console:
            try:
                with open("/dev/console", "w") as con:
                    con.write(f"\r\nedge-agent pairing code: {code.display}\r\n")
            except OSError:
                pass

    def _keep_until_stored(self, code: PairingCode | None) -> None:
        """Paired: the code leaves the screen, but the poll secret stays (tmpfs) until the
        token is on the card (credentials_stored): an agent restarted before a full or
        failing card took the token asks the server again instead of losing the pairing."""
        remove_file(self.runtime_dir)
        if code is None:
            return
        try:
            atomic_write(os.path.join(self.runtime_dir, "pairing.json"), json.dumps(
                {"code": code.code, "poll_secret": code.poll_secret, "paired": True}).encode(),
                0o600, durable=False)
        except OSError as e:
            log.warning("cannot keep the pairing answer's poll secret: %s", e.strerror)

    def credentials_stored(self) -> None:
        """From any thread: the token is on the card; the poll secret has served."""
        self._clear_code_files()

    def _load_code(self) -> PairingCode | None:
        try:
            doc = read_json(os.path.join(self.runtime_dir, "pairing.json"), 4096,
                            follow_links=True)
            # a code already paired is asked about once more, whatever its age: the
            # server hands the token out again to the poll secret
            left = (PAIRED_RECHECK_S if doc.get("paired") is True
                    else float(doc["expires_at_wall"]) - time.time())
            if left <= 0 or not CODE_RE.fullmatch(doc["code"]) or token_problem("", doc["poll_secret"]):
                return None
            code = doc["code"]
            return PairingCode(code, shown(code), self.clock.monotonic() + left,
                               doc["poll_secret"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError, ArithmeticError):
            return None   # a 400-digit expiry overflows float(): any bad file is no code

    def _clear_code_files(self) -> None:
        for name in ("pairing-code", "pairing.json"):
            try:
                os.unlink(os.path.join(self.runtime_dir, name))
            except OSError:
                pass


class NotFound(Exception):
    """404/405/410: what it means depends on what was asked (a code, or a poll)."""

    def __init__(self, status: int):
        super().__init__(f"HTTP {status}")
        self.status = status


class CodeGone(NotFound):
    """A poll's code is no longer known to the server (docs/PROTOCOL.md: 404)."""


class NotEnrolling(NotFound):
    """The code request itself was not found: this server does not enroll this way."""
