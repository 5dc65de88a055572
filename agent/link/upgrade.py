"""The websocket of a connection: dialed by the agent, its upgrade asked for, and a
dial that has no answer raced by a second one.

The websocket's socket is dialed by the agent (``dialer.py``), not by websocket-client:
each failed connect gets its reason, the proxy is the one ``Egress`` names, and a
redirect or a page answering the upgrade is a captive portal, never followed.
engineio calls ``websocket.create_connection`` itself, so this module stands in for
websocket-client in engineio.client's namespace (``_BoundedWebsocketModule``), and a
transport's connect hands it its ``DialContext`` through ``DIALING``.

A dial whose upgrade has no answer after ``race_after_s`` (the connect bound decides
when, and whether: ``connect_bound.py``) is raced by a second dial within the same
deadline, and while none answers by one more each ``race_after_s`` (``RACE_DIALS`` in
all), each on a thread of its own, so a balancer may send one to a node that answers;
the first answered wins, the others are aborted at once. The race covers the
dial and the upgrade: a frozen node answers neither. What follows (Engine.IO's open,
the namespace's connect) runs on the winner alone.
"""
from __future__ import annotations

import contextvars
import logging
import queue
import socket
import ssl
import threading
import time
from datetime import timezone
from email.utils import parsedate_to_datetime
from typing import Any, Callable
from urllib.parse import urlsplit

import engineio.client
import websocket

from ..base.egress import Egress
from ..base import reasons as J
from ..runtime.threads import start_worker
from . import sockopts
from .connect_bound import RACE_AT_ONCE, RACE_DIALS
from .dialer import MAX_HEADER_BYTES, DialError, Dialed, dial
from .frames import BoundedWebSocket

log = logging.getLogger("edge_agent.link")

# How long abort() waits for the library's threads to notice the dead socket.
ABORT_JOIN_S = 2.0

class DialContext:
    """One connect's way out, and what its dial and upgrade learnt."""

    def __init__(self, egress: Egress, race_after_s: float | None = None):
        self.egress = egress
        # a dial unanswered this long is raced by a second one (connect_bound.py); None: never
        self.race_after_s = race_after_s
        self.dialed: Dialed | None = None       # once dialed: its socket is this connect's
        self.upgraded = False                   # the server answered the upgrade (101)
        self.server_date: float | None = None   # the upgrade answer's Date, as epoch seconds
        self.answered_at: float | None = None   # this device's wall time when it came
        self.raced = False                      # a second dial was made
        self.winner_offset_s = 0.0              # when the winning dial began, into the connect
        self.winner = "first"                   # which dial of a race won


# Set by SocketIOTransport.open() around the library's connect, which calls
# create_connection on the same thread.
DIALING: contextvars.ContextVar[DialContext | None] = contextvars.ContextVar(
    "dialing", default=None)
# what engineio derives from its HTTP session for websocket-client to dial with: the
# dialer has done all of it already, from the same Egress
_LIBRARY_DIAL_OPTIONS = ("sslopt", "http_proxy_host", "http_proxy_port", "http_proxy_auth",
                         "http_no_proxy", "proxy_type")


class _Upgraded:
    """A dial and its websocket upgrade, answered (101)."""

    def __init__(self, ws: "BoundedWebSocket", dialed: Dialed):
        self.ws, self.dialed = ws, dialed
        self.answered_at = time.time()
        self.server_date = _http_date((ws.handshake_response.headers or {}).get("date"))


def dial_and_upgrade(url: str, egress: Egress, timeout: float, options: dict,
                      on_dialed: Callable[[Dialed], None] | None = None,
                      phases: dict | None = None) -> _Upgraded:
    """Dials ``url`` and asks for the websocket upgrade, within ``timeout``; raises
    DialError. ``on_dialed`` is told the socket as soon as it is dialed (a race's loser
    is aborted through it); ``phases`` fills in as the dial goes (dialer.dial)."""
    dialed = dial(url, egress, timeout, phases)
    if on_dialed is not None:
        on_dialed(dialed)
    options = {k: v for k, v in options.items() if k not in _LIBRARY_DIAL_OPTIONS}
    # redirect_limit=0: a redirect is someone else answering, never followed (1.2.3
    # even calls a 302 connected once out of redirects; 1.9 raises without the status)
    options.update(socket=dialed.sock, redirect_limit=0, timeout=timeout)
    ws = BoundedWebSocket(enable_multithread=options.pop("enable_multithread", True))
    dialed.sock.guard(dialed.deadline, MAX_HEADER_BYTES, DialError(
        J.HTTP_ERROR, f"the answer to the upgrade is larger than {MAX_HEADER_BYTES} bytes"))
    start = time.monotonic()
    try:
        ws.connect(url, **options)
        if ws.handshake_response is None or ws.handshake_response.status != 101:
            ws.shutdown()
            raise _not_an_upgrade(ws.handshake_response)
    except Exception as e:
        dialed.sock.close()
        raise _upgrade_failed(e, ws, dialed, time.monotonic() - start) from None
    dialed.sock.unguard(timeout)
    dialed.phases["upgrade_s"] = round(time.monotonic() - start, 4)
    return _Upgraded(ws, dialed)


class _RacingDial:
    """One dial of a race, on its own thread: its answer, or its error, once done; a
    loser is aborted, and closed if it is answered after all."""

    def __init__(self, url: str, egress: Egress, deadline: float, options: dict,
                 offset_s: float, done: "queue.Queue[_RacingDial]"):
        self.offset_s = offset_s
        self.given_up = False
        self.answer: _Upgraded | None = None
        self.error: DialError | None = None
        self._dialed: Dialed | None = None
        self._lock = threading.Lock()
        self._lost = False
        self._args = (url, egress, max(0.05, deadline - time.monotonic()), options)
        self._phases: dict = {}   # the dial's, filled in on its thread as they finish
        self._done = done
        start_worker("link-dial", self._run,
                     reason="one dial of a race, ended by the connect's deadline or by lose()")

    def _run(self) -> None:
        try:
            answer = dial_and_upgrade(*self._args, on_dialed=self._dialed_now,
                                       phases=self._phases)
        except DialError as e:
            self.error = e
        except Exception as e:   # a bug must not leave the race waiting forever
            self.error = DialError(J.CONNECT_FAILED, f"{type(e).__name__}: {e}"[:300])
        else:
            with self._lock:
                if self._lost:
                    _close_quietly(answer.dialed.sock)
                    return
                self.answer = answer
        self._done.put(self)

    def _dialed_now(self, dialed: Dialed) -> None:
        with self._lock:
            self._dialed = dialed
            lost = self._lost
        if lost:   # lost while its TCP handshake was under way: the upgrade fails at once
            sockopts.abort(dialed.sock)

    def connected(self) -> bool:
        """Its name resolved and its TCP handshake answered (a hung node's kernel still
        answers it): what has not answered is beyond, the server's side."""
        return "tcp_s" in self._phases

    def give_up(self) -> None:
        """Unanswered while newer dials wait: aborted, to keep the race's dials at once
        bounded."""
        self.given_up = True
        self.lose()

    def outcome(self) -> DialError:
        """How this dial ended, for the connect's error."""
        if self.given_up:
            return DialError(J.NO_ANSWER, "connected, then no answer before it was given "
                                          "up for a newer dial", timed_out=True)
        return self.error or DialError(J.CONNECT_FAILED, "the dial ended without a word")

    def lose(self) -> None:
        """Another dial won: this one is aborted (an RST), whatever phase it is in."""
        with self._lock:
            self._lost = True
            answer, dialed = self.answer, self._dialed
        if answer is not None:
            sockopts.abort(answer.dialed.sock)
            _close_quietly(answer.dialed.sock)
        elif dialed is not None:
            sockopts.abort(dialed.sock)


def _close_quietly(sock) -> None:
    try:
        sock.close()
    except OSError:
        pass


_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")


def _race(url: str, context: DialContext, timeout: float, options: dict) -> _Upgraded:
    """The first dial; while none has answered, one more beside them each
    ``context.race_after_s``, within the same deadline: ``RACE_AT_ONCE`` at once (the
    oldest unanswered is given up for the next), ``RACE_DIALS`` in all. The first
    answered wins, the others are aborted. A dial that fails with an answer (refused, an
    HTTP error) before the race begins ends the connect as a single dial would; one the
    server answered busy (429, 503) ends the racing."""
    start = time.monotonic()
    deadline = start + timeout
    race_after_s = context.race_after_s or 0.0   # set, or the connect would not race
    done: queue.Queue[_RacingDial] = queue.Queue()
    dials = [_RacingDial(url, context.egress, deadline, dict(options), 0.0, done)]
    failed: list[_RacingDial] = []   # ended with an error, or given up for a newer dial
    may_race = True
    while True:
        more = may_race and len(dials) < RACE_DIALS
        if more:
            wait = max(0.0, start + dials[-1].offset_s + race_after_s - time.monotonic())
        else:   # each dial ends by the deadline; the margin is for its thread to say so
            wait = max(0.0, deadline - time.monotonic()) + ABORT_JOIN_S
        try:
            finished = done.get(timeout=wait)
        except queue.Empty:
            if more and not dials[-1].connected():
                # still resolving the name or waiting for the TCP handshake: the resolver
                # or the network is what is slow, and another dial would only ask it
                # twice (a DNS outage raced doubled the queries); a hung node completes
                # the handshake and then says nothing
                may_race = False
                continue
            if more and time.monotonic() < deadline:
                context.raced = True
                log.info("connect: no answer in %.1fs, racing a %s dial",
                         time.monotonic() - start, _ORDINALS[len(dials)])
                waiting = [d for d in dials if d not in failed]
                if len(waiting) >= RACE_AT_ONCE:
                    waiting[0].give_up()
                    failed.append(waiting[0])
                dials.append(_RacingDial(url, context.egress, deadline, dict(options),
                                         time.monotonic() - start, done))
                continue
            if more:
                may_race = False
                continue
            for d in dials:
                d.lose()
            raise DialError(J.NO_ANSWER, f"none of {len(dials)} dials answered by the deadline"
                            if len(dials) > 1 else "no answer by the deadline",
                            timed_out=True) from None
        if finished.answer is not None:
            for other in dials:
                if other is not finished:
                    other.lose()
            context.winner_offset_s = finished.offset_s
            context.winner = _ORDINALS[dials.index(finished)]
            return finished.answer
        if len(dials) == 1:
            raise finished.outcome()
        if finished in failed:   # given up for a newer dial: its end says nothing new
            continue
        failed.append(finished)
        if finished.outcome().busy:
            may_race = False
        if len(failed) == len(dials):   # each answered with a failure: no more dials
            first, *others = [d.outcome() for d in dials]
            raise DialError(first.reason, first.detail + "".join(
                f"; a {_ORDINALS[n]} dial: {e.detail}" for n, e in enumerate(others, 1)),
                timed_out=all(e.timed_out for e in [first, *others]),
                busy=any(e.busy for e in [first, *others]))


class _BoundedWebsocketModule:
    """websocket-client as engineio's client sees it, but its connections are
    ``BoundedWebSocket`` on a socket the agent dialed. engineio calls
    ``websocket.create_connection`` itself, and bookworm's 4.3.4 has no option to pass a
    class or a socket through, so this stands in for the module in engineio.client's
    namespace. A client outside a transport's connect (a tool, a test's own client)
    dials as the library does."""

    def __getattr__(self, name: str) -> Any:
        return getattr(websocket, name)

    @staticmethod
    def create_connection(url: str, timeout: float | None = None, **options: Any):
        context = DIALING.get()
        if context is None:
            options["class_"] = BoundedWebSocket
            return websocket.create_connection(url, timeout, **options)
        timeout = timeout or 10.0
        if context.race_after_s is not None and context.race_after_s < timeout:
            answer = _race(url, context, timeout, options)
        else:
            answer = dial_and_upgrade(url, context.egress, timeout, options)
        context.dialed = answer.dialed
        context.upgraded = True
        context.answered_at = answer.answered_at
        context.server_date = answer.server_date
        return answer.ws


def _upgrade_failed(e: Exception, ws, dialed: Dialed, took_s: float) -> DialError:
    """Why the websocket upgrade on a dialed socket failed, as a DialError."""
    if isinstance(e, DialError):
        return e
    if isinstance(e, websocket.WebSocketBadStatusException):
        return _not_an_upgrade(None, e.status_code, _location(e))
    if isinstance(e, (socket.timeout, websocket.WebSocketTimeoutException)):
        return DialError(J.NO_ANSWER, f"connected, then no answer to the websocket upgrade in "
                                      f"{took_s:.1f}s (a hung server or balancer node?)",
                         timed_out=True)
    if isinstance(e, (ssl.SSLError, websocket.WebSocketConnectionClosedException)):
        # TLS 1.3: a server that refuses the client's certificate says so after the
        # handshake, at the first read (websocket-client 1.9 reports it as a close)
        if isinstance(e, ssl.SSLError) or isinstance(dialed.sock, ssl.SSLSocket):
            return DialError(J.TLS_FAILED, f"the server ended the TLS session before answering "
                                           f"({getattr(e, 'reason', None) or 'closed'}): a "
                                           f"client certificate it does not accept, or none?")
        return DialError(J.CONNECT_FAILED, "the connection was closed before the upgrade was "
                                           "answered")
    response = getattr(ws, "handshake_response", None)
    if response is not None and response.status != 101:
        return _not_an_upgrade(response)   # 1.9 raises for a redirect it will not follow
    return DialError(J.CONNECT_FAILED, f"websocket upgrade: {type(e).__name__}: {e}"[:300])


def _not_an_upgrade(response, status: int | None = None,
                    location: str | None = None) -> DialError:
    """An HTTP answer where the websocket upgrade (101) should be: ``response`` as
    websocket-client keeps it, or its status and Location."""
    if response is not None:
        status, location = response.status, (response.headers or {}).get("location")
    status = status or 0
    if 300 <= status < 400:
        where = f" to {_host_of(location)}" if location else ""
        return DialError(J.CAPTIVE_PORTAL, f"the upgrade was answered with a redirect "
                                           f"({status}){where}: a captive portal or a box "
                                           f"answering for the server")
    if 200 <= status < 300 or status == 511:
        return DialError(J.CAPTIVE_PORTAL, f"the upgrade was answered with a page ({status}): "
                                           f"a captive portal or a box answering for the server")
    if status == 407:
        return DialError(J.PROXY_AUTH, "a proxy on the way asks for credentials (407)")
    return DialError(J.HTTP_ERROR, f"the upgrade was answered with HTTP {status}",
                     busy=status in (429, 503))


def _location(e: websocket.WebSocketBadStatusException) -> str | None:
    headers = getattr(e, "resp_headers", None) or {}
    return headers.get("location") if isinstance(headers, dict) else None


def _host_of(url: str) -> str:
    try:
        return urlsplit(url).hostname or "another page"
    except ValueError:
        return "another page"


def _http_date(value: str | None) -> float | None:
    if not value:
        return None
    try:
        when = parsedate_to_datetime(value)
        if when.tzinfo is None:    # "-0000": RFC 5322's "no zone known"; HTTP dates are UTC
            when = when.replace(tzinfo=timezone.utc)
        return when.timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


engineio.client.websocket = _BoundedWebsocketModule()
