"""The server's kind, asked and kept: the shell of server_kind.py.

``ServerKind`` is the one place the profile is chosen (server_kind.choose): an explicit
``[server] profile``, else the kind recorded for this url at an earlier start, else it
asks the server on a thread of its own, on the backoff, and holds the enrollment until
the answer (an enrollment in the wrong protocol is requests for nothing). The kind found
is recorded in the state directory (``server-kind.json``, written durably and only when
it changes). When it is not the profile this process was built with, the agent is
restarted into it (the daemon's ``restart``) once it is recorded: the record makes
that the only time (unrecorded, the record is tried again on the backoff meanwhile).
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

import requests
import urllib3

from ..base.backoff import Backoff
from ..base.clock import SystemClock
from ..base.egress import Egress
from ..base.http import HostileAnswer
from ..config.model import Server
from ..runtime.loop import Loop
from ..runtime.watchdog_gate import WatchdogGate
from . import kind_record
from .exchange import MAX_SILENCE_S, MAX_WAIT_S, exchange
from .server_kind import (ENROLL_PATH, RETRY, VERSION_PATH, Answer, Choice, KindCore, Verdict,
                          choose, judge, needs_enroll_question, record_of)

log = logging.getLogger("edge_agent.identity")


def ask(session, base: str) -> Verdict:
    """One round of questions (neither changes anything on the server)."""
    version = _answer(session, "GET", base + VERSION_PATH)
    enroll = (_answer(session, "POST", base + ENROLL_PATH, json={})
              if needs_enroll_question(version) else None)
    return judge(version, enroll)


def _answer(session, method: str, url: str, **kw) -> Answer:
    try:
        return Answer(*exchange(session, method, url, **kw))
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as e:
        return Answer(failure=str(e) if isinstance(e, HostileAnswer) else type(e).__name__)


class ServerKind:
    def __init__(self, server: Server, state_dir: str, gate: WatchdogGate | None = None,
                 on_change: Callable[[], None] = lambda: None,
                 restart: Callable[[str], None] = lambda why: None):
        """``restart(why)``: stop, to be built again with the kind found (the daemon)."""
        self._server, self._state_dir = server, state_dir
        self._record = kind_record.load(state_dir)
        self.choice: Choice = choose(server.profile, server.url, self._record)
        self.profile = self.choice.profile   # what this process is built with
        self._on_change, self._restart = on_change, restart
        self._held: list[Callable[[], None]] = []
        self._known = self.choice.how != "detecting"   # and this process's: held parts go
        self._lock = threading.Lock()
        self._stopping = False
        self._wake = threading.Event()
        self.record_error: str | None = None
        # the kind is another profile's: the agent stops to be built again with it (cli.py)
        self.restarting = False
        self.restart_why: str | None = None
        self.clock = SystemClock()
        self.core = KindCore()
        self.loop = None
        if self.detecting:
            self.session = (server.egress or Egress()).session(server.url)
            self.loop = Loop("server-kind", self._turns, max_silence_s=MAX_SILENCE_S,
                             gate=gate, stopping=lambda: self._stopping,
                             pause=lambda seconds: self._wake.wait(seconds) and self._stopping)

    @property
    def detecting(self) -> bool:
        return not self._known

    def held(self, part) -> "Held":
        """``part`` (start(), stop()) started once the kind is known to be this process's."""
        return Held(self, part)

    def _when_known(self, start: Callable[[], None]) -> None:
        with self._lock:
            if self.detecting:
                self._held.append(start)
                return
        start()

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        words = {"configured": "set in [server] profile",
                 "recorded": f"detected at an earlier start: {self.choice.why}",
                 "detecting": "auto: asking the server which kind it is"}[self.choice.how]
        log.info("server profile %s: %s", self.profile if self.choice.how != "detecting"
                 else "not known yet", words)
        if self.loop is not None:
            self.core.start(self.clock.monotonic())
            self.loop.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    def stopping_for(self, why: str) -> bool:
        """The agent begins to stop for ``why`` (the first reason only): True when that
        is this part's restart, which the command line then carries out (an exec)."""
        self.restarting = why is not None and why == self.restart_why
        return self.restarting

    def snapshot(self) -> dict:
        verdict = self.core.verdict
        out = {"profile": self.profile, "how": self.choice.how, "why": self.choice.why}
        if self.choice.how == "detecting":
            if self.core.settled:
                out.update(how="detected", why=verdict.why, profile=verdict.profile)
            else:
                wake = self.core.next_wakeup()
                out.update(profile=None, why=verdict.why if verdict else self.choice.why,
                           attempts=self.core.attempts,
                           next_try_in_s=(round(max(0.0, wake - self.clock.monotonic()), 1)
                                          if wake != float("inf") else None))
        if self.record_error:
            out["record_error"] = self.record_error
        return out

    # -- the thread -------------------------------------------------------------------------
    def _turns(self) -> None:
        while not self._stopping and not self.core.settled:
            self.loop.turn()
            for _ in self.core.poll(self.clock.monotonic()):
                verdict = ask(self.session, self._server.url)
                delay = self.core.on_verdict(self.clock.monotonic(), verdict)
                if delay is not None:
                    log.warning("server profile: %s; asking again in %.0fs", verdict.why, delay)
                self._on_change()
            if self.core.settled:
                break
            wait = self.core.next_wakeup() - self.clock.monotonic()
            self._wake.wait(min(max(wait, 0.0), MAX_WAIT_S))
        self.loop.idle()
        again = Backoff(RETRY)
        while self.core.settled and not self._stopping and not self._settle(self.core.verdict):
            self._wake.wait(again.next_delay())

    def _settle(self, verdict: Verdict) -> bool:
        """False: another profile's kind not recorded, so no restart yet (tried again)."""
        if not self._keep(verdict) and verdict.profile != self.profile:
            # the restarted process would not find it, ask again, find it again and
            # restart again: an exec and two questions a round, as long as the card refuses
            log.warning("server profile %s: detected (%s), but not restarting with it "
                        "until it is recorded", verdict.profile, verdict.why)
            return False
        if verdict.profile != self.profile:
            log.warning("server profile %s: detected (%s); restarting with it",
                        verdict.profile, verdict.why)
            self.restart_why = f"the server speaks the {verdict.profile} profile: restarting with it"
            self._restart(self.restart_why)
            return True
        log.info("server profile %s: detected (%s)", verdict.profile, verdict.why)
        with self._lock:
            held, self._held, self._known = self._held, [], True
        for start in held:
            start()
        self._on_change()
        return True

    def _keep(self, verdict: Verdict) -> bool:
        """Recorded durably, and only when it changes: the next start does not ask.
        False when it could not be."""
        doc = record_of(self._server.url, verdict)
        if doc == self._record:
            return True
        try:
            kind_record.save(self._state_dir, doc)
            self._record, self.record_error = doc, None
        except OSError as e:
            self.record_error = f"not recorded ({e.strerror}): asked again at the next start"
            log.warning("server profile: %s", self.record_error)
            self._on_change()
            return False
        return True


class Held:
    """A part whose start waits for the server's kind (the enrollment, while asking)."""

    def __init__(self, kind: ServerKind, part):
        self._kind, self._part = kind, part

    def start(self) -> None:
        self._kind._when_known(self._part.start)

    def stop(self) -> None:
        self._part.stop()
