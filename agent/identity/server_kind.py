"""Which kind of server this is, sans I/O: told by the server's own answers, never by
its url (#50). ``[server] profile = "auto"`` (the default) asks; an explicit profile wins.

What tells them apart, as the real servers answer (tests/test_server_kind_real.py):

- ScreenTinker (1.2 and 1.9) answers ``GET /api/version`` with its version and its
  frontend's hash, ``{"hash": "…", "version": "1.9.33", …}``; its ``POST
  /api/v1/enroll`` is a 404 ("Cannot POST").
- A server of this project's protocol (docs/PROTOCOL.md; fleet_server/) has no
  ``/api/version`` (404) and answers ``POST /api/v1/enroll`` without a device id with
  400: the enrollment is there, and refuses an empty request without making a code.

Neither question changes anything on the server. Any other answer (a 404 everywhere,
garbage, an error page) is not recognised, and no answer at all (a timeout, a refused
connection, a 5xx) is none: both are asked again on the one backoff (base/backoff.py),
and what the server answered is said, so a wrong url is visible in status.

The kind found is recorded with the url it was found at (the shell keeps it in the
state directory): a restart does not ask again, a changed url does.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass

from ..base.backoff import Backoff, BackoffPolicy
from ..base.vocabulary import PROFILE_AUTO as AUTO, PROFILE_NAMES

EDGE_AGENT, SCREENTINKER = PROFILE_NAMES
# what is built while the kind is not known yet: the last release's default, so a
# screen upgraded with a token keeps its link meanwhile (its enrollment waits)
PROVISIONAL = EDGE_AGENT
VERSION_PATH = "/api/version"
ENROLL_PATH = "/api/v1/enroll"
RETRY = BackoffPolicy(base_s=2.0, cap_s=120.0, jitter="full")
MAX_WHY = 300


@dataclass(frozen=True)
class Answer:
    """One HTTP answer to a question: its status and body, or why there was none."""
    status: int | None = None
    body: bytes = b""
    failure: str | None = None   # no answer (a timeout, a refused connection): one line

    def said(self) -> str:
        return self.failure if self.status is None else f"HTTP {self.status}"


@dataclass(frozen=True)
class Verdict:
    """What the server's answers say it is, and why."""
    profile: str | None     # None: not told
    why: str                # one line: what the server answered
    answered: bool = True   # False: no answer at all (versus answers not recognised)


@dataclass(frozen=True)
class Probe:
    """Ask the server (the shell: GET /api/version, then POST /api/v1/enroll if needed)."""


def screentinker_version(answer: Answer) -> str | None:
    """The version a ScreenTinker server says it runs, or None when this is not its answer."""
    if answer.status != 200:
        return None
    try:
        doc = json.loads(answer.body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    version, digest = doc.get("version"), doc.get("hash")
    if not (isinstance(version, str) and isinstance(digest, str) and 0 < len(version) <= 40):
        return None
    return version


def _no_answer(answer: Answer) -> bool:
    return answer.status is None or answer.status >= 500 or answer.status == 429


def needs_enroll_question(version: Answer) -> bool:
    """Whether the second question is worth asking: the first was answered, not by
    ScreenTinker."""
    return not _no_answer(version) and screentinker_version(version) is None


def judge(version: Answer, enroll: Answer | None = None) -> Verdict:
    """The kind the two answers tell (``enroll`` None: not asked)."""
    found = screentinker_version(version)
    if found is not None:
        return Verdict(SCREENTINKER, f"ScreenTinker {printable(found)} answered GET {VERSION_PATH}")
    asked = f"GET {VERSION_PATH}: {version.said()}"
    if _no_answer(version):
        return Verdict(None, f"no answer ({asked})", answered=False)
    if enroll is None:
        return Verdict(None, f"not asked further ({asked})")
    asked += f", POST {ENROLL_PATH}: {enroll.said()}"
    if enroll.status == 400:
        return Verdict(EDGE_AGENT, f"the edge-agent enrollment answered (POST {ENROLL_PATH} "
                                   f"without a device id: 400; GET {VERSION_PATH}: "
                                   f"{version.said()})")
    if _no_answer(enroll):
        return Verdict(None, f"no answer ({asked})", answered=False)
    return Verdict(None, f"not recognised ({asked}): is the url right? or set [server] "
                         f"profile")


def printable(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)[:MAX_WHY]


# -- the choice ------------------------------------------------------------------
@dataclass(frozen=True)
class Choice:
    """The profile to build now, how it was chosen and why."""
    profile: str   # the profile to build now
    how: str       # "configured", "recorded" (found at an earlier start) or "detecting"
    why: str


def choose(configured: str, url: str, record: dict | None) -> Choice:
    """The one place the profile is chosen: an explicit one wins; "auto" takes the kind
    recorded for this url, else asks (building the provisional profile meanwhile)."""
    if configured != AUTO:
        return Choice(configured, "configured", "set in [server] profile")
    kept = recorded(record, url)
    if kept is not None:
        return Choice(kept[0], "recorded", kept[1])
    return Choice(PROVISIONAL, "detecting", "not known yet for this url: asking the server")


def record_of(url: str, verdict: Verdict) -> dict:
    return {"url": url, "profile": verdict.profile, "why": verdict.why}


def recorded(doc, url: str) -> tuple[str, str] | None:
    """(profile, why) from a record made for ``url``; None for any other record or a
    bad one (the kind is asked again)."""
    if not isinstance(doc, dict) or doc.get("url") != url:
        return None
    profile, why = doc.get("profile"), doc.get("why")
    if profile not in PROFILE_NAMES or not isinstance(why, str):
        return None
    return profile, printable(why)


# -- asking ----------------------------------------------------------------------
class KindCore:
    """Asks until the server's answers tell its kind; one question at a time, on the
    backoff while they do not."""

    def __init__(self, rng: random.Random | None = None):
        self.verdict: Verdict | None = None     # the latest
        self.settled = False
        self._backoff = Backoff(RETRY, rng)
        self._next_at = 0.0
        self._in_flight = False

    @property
    def attempts(self) -> int:
        return self._backoff.attempts

    def start(self, now: float) -> None:
        self._next_at = now

    def poll(self, now: float) -> list:
        if self.settled or self._in_flight or now < self._next_at:
            return []
        self._in_flight = True
        return [Probe()]

    def next_wakeup(self) -> float:
        return math.inf if self.settled or self._in_flight else self._next_at

    def on_verdict(self, now: float, verdict: Verdict) -> float | None:
        """The delay before asking again, or None once the kind is known."""
        self._in_flight = False
        self.verdict = verdict
        if verdict.profile is not None:
            self.settled = True
            return None
        delay = self._backoff.next_delay()
        self._next_at = now + delay
        return delay
