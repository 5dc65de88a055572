"""One Socket.IO connection to the server, opened once and never reused.

A fresh ``socketio.Client`` per connection sidesteps a family of library traps:
automatic reconnects that use ``wait_timeout=1`` (a slow server CONNECT never
succeeds), a ``_reconnect_task`` that 5.12+ never clears (a later drop gets no
reconnect), and a 5.7.2 ``disconnect()`` that returns before the read loop ends (an
immediate ``connect()`` races it). Library reconnection is off; the runner decides
when to connect.

A suspect link is never closed with ``disconnect()``: on a dead socket the sync
client blocks ~45 s in it. ``abort()`` shuts the real socket down instead, which
wakes the library's threads at once.

Everything that happens on the library's threads is handed to ``sink`` tagged with
this connection's generation, so events from a torn-down connection are ignored.

A message from the server over ``MAX_MESSAGE_BYTES`` is refused from its frame header,
before its payload is read, and ends the connection (``message-too-large``): the
library would otherwise buffer it whole and copy it several times on its way up (a
40 MB message took the agent past the unit's MemoryMax). The agent's protocols are
JSON text only, so anything binary is refused as soon as it is seen and ends the
connection too (``message-refused``): a binary websocket frame, from its header, and a
Socket.IO packet that announces binary attachments (``5``/``6``), before the library
parses it. The library keeps every attachment of an event in memory until the event
is complete, so a bound per message would not bound an event of many (25 of 4 MiB
took the agent to 133 MB). The agent only ever uses the websocket transport (engineio
connects with the first of ``transports``, and never falls back to or upgrades from
polling), so the websocket is the one door to guard.

The websocket's socket is dialed by the agent (``dialer.py``), not by websocket-client:
each failed connect gets its reason, the proxy is the one ``Egress`` names, and a
redirect or a page answering the upgrade is a captive portal, never followed.

A dial whose upgrade has no answer after ``race_after_s`` (the connect bound decides
when, and whether: ``connect_bound.py``) is raced by one second dial within the same
deadline, each on a thread of its own, so a balancer may send it to a node that
answers; the first answered wins, the other is aborted at once. The race covers the
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
from engineio import packet
import socketio
import websocket

from ..base.egress import Egress
from ..base import reasons as J
from . import inbox, sockopts
from .dialer import MAX_HEADER_BYTES, DialError, Dialed, dial
from ..config.policies import KeepalivePolicy

log = logging.getLogger("edge_agent.link")

# How long abort() waits for the library's threads to notice the dead socket.
ABORT_JOIN_S = 2.0

# The largest message taken from the server. What the agent uses is small (ACKs,
# commands: a few KB), but a server may push more that the agent only ignores (a
# ScreenTinker playlist is for the player, ~600 bytes an item), and a message refused
# on every connect would be a reconnect loop: so not tight. What bounds it is the
# parse: dense JSON is up to ~37 times its size in Python objects (24x for
# "[{},{},...]", 37x for nested '{"":{"":{}}}'), so 4 MiB of it took the agent to
# 140-165 MB, past the unit's MemoryMax=128M. At 1 MiB "[{},...]" peaks at 66-77 MB
# (idle 36-48 MB), the worst nesting ~10 MB more.
MAX_MESSAGE_BYTES = 1024 * 1024

# Engine.IO MESSAGE ("4") carrying a Socket.IO BINARY_EVENT ("5") or BINARY_ACK ("6"):
# the start of an event whose binary attachments follow.
_BINARY_PACKETS = (b"45", b"46")


class TransportError(Exception):
    def __init__(self, reason: str, detail: str = "", timed_out: bool = False,
                 busy: bool = False):
        super().__init__(detail or reason)
        self.reason = reason
        self.detail = detail
        self.timed_out = timed_out   # the connect bound ended it
        self.busy = busy             # the server said it is overloaded (429, 503)


class MessageRefused(websocket.WebSocketException):
    """A message from the server the agent does not take; ends the connection."""
    reason = J.MESSAGE_REFUSED


class MessageTooLarge(MessageRefused):
    reason = J.MESSAGE_TOO_LARGE

    def __init__(self, size: int, limit: int):
        super().__init__(f"the server sent a message of {size} bytes, over the bound of "
                         f"{limit}")
        self.size = size


class _BoundedFrames(websocket.frame_buffer):
    """websocket-client's frame reader, refusing a message once its frame headers
    announce more than ``limit`` bytes, before any of its payload is read. A message
    split into continuation frames counts as a whole. A binary message is refused from
    its first frame's header (its continuation frames are never read), and a text
    message that starts a Socket.IO packet with attachments once its first two bytes
    are in, however the server fragments it."""

    def __init__(self, recv_fn, skip_utf8_validation: bool, limit: int):
        super().__init__(recv_fn, skip_utf8_validation)
        self.limit = limit
        self._message = 0  # announced so far for the message being received
        self._head = b""   # its first bytes, up to the two that name its packet type

    def recv_length(self) -> None:
        super().recv_length()
        opcode = self.header[4]
        if opcode == websocket.ABNF.OPCODE_BINARY:
            raise MessageRefused("the server sent a binary websocket frame")
        if opcode == websocket.ABNF.OPCODE_CONT:
            self._message += self.length
            size = self._message
        elif opcode == websocket.ABNF.OPCODE_TEXT:
            self._message = size = self.length
            self._head = b""
        else:
            size = self.length  # a control frame, interleaved: not part of the message
        if size > self.limit:
            raise MessageTooLarge(size, self.limit)

    def recv_frame(self):
        frame = super().recv_frame()
        if frame.opcode in (websocket.ABNF.OPCODE_TEXT, websocket.ABNF.OPCODE_CONT) \
                and len(self._head) < 2:
            self._head += frame.data[:2 - len(self._head)]
            if self._head in _BINARY_PACKETS:
                raise MessageRefused("the server sent a Socket.IO packet with binary "
                                     "attachments")
        return frame


class BoundedWebSocket(websocket.WebSocket):
    """The websocket every connection of the agent uses. A refused message ends the
    connection at once: the rest of it is not read, and the server gets an RST.

    websocket-client's own UTF-8 check is pure Python, about 0.8 s a MiB here and ten
    times that on a Raspberry Pi, on the thread that reads the server's pings and ACKs;
    ``recv()`` decodes a text message strictly anyway (in C), which refuses bad UTF-8
    all the same, so the check is skipped."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs["skip_utf8_validation"] = True
        super().__init__(*args, **kwargs)
        self.frame_buffer = _BoundedFrames(self._recv, True, MAX_MESSAGE_BYTES)
        self.refused: MessageRefused | None = None

    def recv_frame(self):
        try:
            return super().recv_frame()
        except MessageRefused as e:
            self.refused = e
            if self.sock is not None:
                sockopts.abort(self.sock)
            raise


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


# Set by SocketIOTransport.open() around the library's connect, which calls
# create_connection on the same thread.
_DIALING: contextvars.ContextVar[DialContext | None] = contextvars.ContextVar(
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


def _dial_and_upgrade(url: str, egress: Egress, timeout: float, options: dict,
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
        self.answer: _Upgraded | None = None
        self.error: DialError | None = None
        self._dialed: Dialed | None = None
        self._lock = threading.Lock()
        self._lost = False
        self._args = (url, egress, max(0.05, deadline - time.monotonic()), options)
        self._phases: dict = {}   # the dial's, filled in on its thread as they finish
        self._done = done
        threading.Thread(target=self._run, daemon=True, name="link-dial").start()

    def _run(self) -> None:
        try:
            answer = _dial_and_upgrade(*self._args, on_dialed=self._dialed_now,
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

    def lose(self) -> None:
        """The other dial won: this one is aborted (an RST), whatever phase it is in."""
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


def _race(url: str, context: DialContext, timeout: float, options: dict) -> _Upgraded:
    """The first dial; if it has no answer after ``context.race_after_s``, one second
    dial beside it, within the same deadline. The first answered wins, the other is
    aborted. A dial that fails with an answer (refused, an HTTP error) before the race
    begins ends the connect as a single dial would."""
    start = time.monotonic()
    deadline = start + timeout
    done: queue.Queue[_RacingDial] = queue.Queue()
    dials = [_RacingDial(url, context.egress, deadline, dict(options), 0.0, done)]
    failed: list[_RacingDial] = []
    may_race = True
    while True:
        if len(dials) == 1 and may_race:
            wait = max(0.0, start + context.race_after_s - time.monotonic())
        else:   # each dial ends by the deadline; the margin is for its thread to say so
            wait = max(0.0, deadline - time.monotonic()) + ABORT_JOIN_S
        try:
            finished = done.get(timeout=wait)
        except queue.Empty:
            if len(dials) == 1 and may_race and not dials[0].connected():
                # still resolving the name or waiting for the TCP handshake: the resolver
                # or the network is what is slow, and a second dial would only ask it
                # twice (a DNS outage raced doubled the queries); a hung node completes
                # the handshake and then says nothing
                may_race = False
                continue
            if len(dials) == 1 and may_race:
                context.raced = True
                log.info("connect: no answer in %.1fs, racing a second dial",
                         time.monotonic() - start)
                dials.append(_RacingDial(url, context.egress, deadline, dict(options),
                                         time.monotonic() - start, done))
                continue
            for d in dials:
                d.lose()
            raise DialError(J.NO_ANSWER, "neither dial answered by the deadline",
                            timed_out=True) from None
        if finished.answer is not None:
            for other in dials:
                if other is not finished:
                    other.lose()
            context.winner_offset_s = finished.offset_s
            return finished.answer
        if len(dials) == 1:
            raise finished.error
        failed.append(finished)
        if len(failed) == 2:
            first, second = dials[0].error, dials[1].error
            raise DialError(first.reason, f"{first.detail}; a second dial: {second.detail}",
                            timed_out=first.timed_out and second.timed_out)


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
        context = _DIALING.get()
        if context is None:
            options["class_"] = BoundedWebSocket
            return websocket.create_connection(url, timeout, **options)
        timeout = timeout or 10.0
        if context.race_after_s is not None and context.race_after_s < timeout:
            answer = _race(url, context, timeout, options)
        else:
            answer = _dial_and_upgrade(url, context.egress, timeout, options)
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


class SocketIOTransport:
    def __init__(self, *, url: str, auth: dict | None, namespace: str, keepalive: KeepalivePolicy,
                 transports: list[str] | None = None,
                 connect_timeout_s: float, egress: Egress, generation: int,
                 sink: Callable[..., None], handlers: dict[str, Callable] | None = None,
                 race_after_s: float | None = None):
        """``race_after_s``: a dial unanswered this long is raced by a second one (the
        link's connect bound says when, and whether at all)."""
        self.url = url
        self.namespace = namespace
        self.generation = generation
        self._auth = auth
        self._transports = transports or ["websocket"]
        if self._transports[0] != "websocket":
            # engineio connects with the first only; MAX_MESSAGE_BYTES guards the websocket
            raise ValueError(f"transports must start with websocket, not {self._transports}")
        self._keepalive = keepalive
        self._connect_timeout_s = connect_timeout_s
        self._sink = sink
        self._handlers = handlers or {}
        self._refusal: Any = None
        self._server_said_bye = False
        self._sock: socket.socket | None = None
        self.last_inbound = time.monotonic()
        self.server_pings = 0  # Engine.IO pings from the server on this connection
        self.last_server_ping: float | None = None
        self._dialing = DialContext(egress, race_after_s)
        self._handlers_lock = threading.Lock()
        self._event_handlers: EventHandlers | None = None   # started by the first event
        # The websocket is dialed from the Egress (dialer.py); the session carries the
        # same settings for a polling handshake (the screentinker profile's fallback).
        self.client = socketio.Client(
            reconnection=False, logger=False, engineio_logger=False,
            request_timeout=connect_timeout_s, http_session=egress.session(url))
        self._install_hooks()

    # -- lifecycle --------------------------------------------------------------
    def open(self) -> None:
        """Connects, or raises TransportError with a journal reason."""
        token = _DIALING.set(self._dialing)
        try:
            self.client.connect(self.url, auth=self._auth, transports=self._transports,
                                namespaces=[self.namespace],
                                wait_timeout=self._connect_timeout_s)
        except Exception as e:  # the library can raise almost anything from a bad peer
            refused = self._message_refused(e)
            self._release()
            if refused is not None:
                raise TransportError(refused.reason, str(refused)) from None
            if self._refusal is not None:
                raise TransportError(J.REFUSED, _describe(self._refusal)) from None
            raise self._why_not_connected(e) from None
        finally:
            _DIALING.reset(token)
        sock = self.raw_socket()
        if sock is None:
            self.abort()
            raise TransportError(J.CONNECT_FAILED, "no websocket after connect")
        try:
            sockopts.apply_keepalive(sock, self._keepalive)
        except OSError as e:
            self.abort()
            raise TransportError(J.CONNECT_FAILED, f"setting keepalive: {e}") from None
        self._sock = sock

    def _why_not_connected(self, error: BaseException) -> TransportError:
        """The reason in the exception the library raised, or in what it wrapped."""
        cause: BaseException | None = error
        while cause is not None:
            if isinstance(cause, DialError):
                return TransportError(cause.reason, cause.detail, cause.timed_out,
                                      cause.busy)
            if isinstance(cause, (socket.timeout, websocket.WebSocketTimeoutException)) \
                    and self._dialing.upgraded:
                return TransportError(J.NO_ANSWER, "the websocket is up, then no Engine.IO "
                                                   "handshake (a hung server?)", timed_out=True)
            cause = cause.__cause__ or cause.__context__
        if self._dialing.upgraded and "namespaces failed" in str(error):
            # the namespace CONNECT unanswered within wait_timeout (a refusal is _refusal)
            return TransportError(J.NO_ANSWER, f"the websocket is up, then no answer to the "
                                               f"Socket.IO connect in {self._connect_timeout_s:g}s",
                                  timed_out=True)
        return TransportError(J.CONNECT_FAILED, f"{type(error).__name__}: {error}"[:300])

    @property
    def dialed(self) -> Dialed | None:
        """How this connection was dialed: phases, route."""
        return self._dialing.dialed

    @property
    def raced(self) -> bool:
        """A second dial raced this connect's first."""
        return self._dialing.raced

    @property
    def winner_offset_s(self) -> float:
        """How far into the connect the dial that won began (0: the first)."""
        return self._dialing.winner_offset_s

    def clock_skew_s(self) -> float | None:
        """The server's clock minus this device's, from the upgrade answer's Date
        (whole seconds: within about a second)."""
        d = self._dialing
        if d.server_date is None or d.answered_at is None:
            return None
        return round(d.server_date - d.answered_at, 1)

    def raw_socket(self) -> socket.socket | None:
        ws = getattr(self.client.eio, "ws", None)
        return getattr(ws, "sock", None) if ws is not None else None

    @property
    def server_ping_interval_s(self) -> float | None:
        return getattr(self.client.eio, "ping_interval", None)

    def local_addr(self) -> str:
        try:
            host, port = self._sock.getsockname()[:2]
            return f"{host}:{port}"
        except (OSError, AttributeError):
            return ""

    def emit(self, event: str, data: Any, callback: Callable | None = None) -> None:
        """Queues a message; raises TransportError if the connection is gone.

        A successful emit proves nothing on a silently dropped link: only an ACK does.
        """
        try:
            self.client.emit(event, data, namespace=self.namespace, callback=callback)
        except Exception as e:
            raise TransportError(J.TRANSPORT_ERROR, f"emit {event}: {e}") from None

    def abort(self) -> None:
        sock = self._sock or self.raw_socket()
        if sock is not None:
            sockopts.abort(sock)
        eio = self.client.eio
        for task in (getattr(eio, "read_loop_task", None), getattr(eio, "write_loop_task", None)):
            if task is not None and task is not threading.current_thread():
                try:
                    task.join(ABORT_JOIN_S)
                except (AttributeError, RuntimeError):
                    pass
        self._release()

    def close(self, grace_s: float = 1.0) -> None:
        """Polite goodbye for shutdown, bounded: the library's disconnect() gets
        ``grace_s`` on a side thread (it can block ~45 s on a dead socket), then abort."""
        bye = threading.Thread(target=self._disconnect_quietly, daemon=True)
        bye.start()
        bye.join(grace_s)
        self.abort()

    def _disconnect_quietly(self) -> None:
        try:
            self.client.disconnect()
        except Exception:
            pass

    # -- internals --------------------------------------------------------------
    def _handlers_thread(self) -> "EventHandlers":
        with self._handlers_lock:
            if self._event_handlers is None:
                self._event_handlers = EventHandlers(f"link-events-{self.generation}")
                self._event_handlers.start()
            return self._event_handlers

    def _release(self) -> None:
        with self._handlers_lock:
            handlers, self._event_handlers = self._event_handlers, None
        if handlers is not None:
            handlers.stop()
        sock, self._sock = self._sock or self.raw_socket(), None
        # engineio keeps the websocket only after the Engine.IO OPEN: before it, the
        # dialed socket is this connect's alone to close
        dialed = self._dialing.dialed
        for s in (sock, dialed.sock if dialed is not None else None):
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass
        # A polling handshake (the screentinker profile's fallback) leaves a kept-alive
        # HTTP connection in the library's session pool: one more socket held per link.
        http = getattr(self.client.eio, "http", None)
        if http is not None and hasattr(http, "close"):
            try:
                http.close()
            except Exception:
                pass

    def _message_refused(self, error: BaseException | None = None) -> MessageRefused | None:
        """The message this connection refused, if that is why it ended:
        in the open websocket, or (a refusal during the Engine.IO handshake, before the
        library keeps the websocket) in the exception the library raised for it."""
        refused = getattr(getattr(self.client.eio, "ws", None), "refused", None)
        while refused is None and error is not None:
            if isinstance(error, MessageRefused):
                return error
            error = error.__cause__ or error.__context__
        return refused

    def _post(self, news) -> None:
        self._sink(self.generation, news)

    def _install_hooks(self) -> None:
        eio = self.client.eio
        receive = eio._receive_packet

        def receive_packet(pkt):
            # Any inbound packet, Engine.IO pings included, is proof of life. A plain
            # store: the link thread reads it when it next looks, no wake-up needed.
            self.last_inbound = time.monotonic()
            if pkt.packet_type == packet.PING:
                # counted before the library queues its pong (see delivery.py); read by
                # the link thread when it next looks, like last_inbound: no wake-up
                self.last_server_ping = self.last_inbound
                self.server_pings += 1
            elif _is_goodbye(pkt):
                self._server_said_bye = True
            return receive(pkt)

        eio._receive_packet = receive_packet
        trigger = eio._trigger_event

        def trigger_event(event, *args, **kwargs):
            # engineio starts a thread for each message it takes in: a server sending
            # 2,000 at once made 1,650 threads, and the one that met the unit's TasksMax
            # killed the read loop. An ACK (a heartbeat's proof) is taken in on the read
            # loop at once; everything else the server says goes to this connection's
            # one handler thread, in the order it was said (a device:throttled and the
            # disconnect after it), where a handler may wait (a command's receipt waits
            # for the ledger) without holding an ACK back.
            if event == "message" and kwargs.get("run_async"):
                data = args[0] if args else None
                if isinstance(data, str) and data[:1] == _SIO_ACK:
                    kwargs["run_async"] = False
                    return trigger(event, *args, **kwargs)
                self._handlers_thread().put(lambda: trigger(event, *args))
                return None
            if event == "disconnect" and self._event_handlers is not None:
                # after the messages before it
                self._event_handlers.put(lambda: trigger(event, *args, **kwargs))
                return None
            return trigger(event, *args, **kwargs)

        eio._trigger_event = trigger_event
        ns = self.namespace

        def on_connect_error(data=None, *_):
            # python-socketio also reports a failed TCP/Engine.IO connect here; only a
            # CONNECT_ERROR from a server we reached is a refusal of our credentials.
            if getattr(self.client.eio, "state", None) == "connected":
                self._refusal = data if data is not None else "refused"

        def on_disconnect(*args):
            # Newer clients pass a reason; 5.7.2 passes none, so the packet hook decides.
            detail = str(args[0]) if args else ""
            reason = J.SERVER_DISCONNECT if self._server_said_bye else J.TRANSPORT_ERROR
            refused = self._message_refused()
            if refused is not None:
                reason, detail = refused.reason, str(refused)
            self._post(inbox.Closed(reason, detail))

        def on_any(event, *args):
            handler = self._handlers.get(event)
            if handler is None:
                self._post(inbox.UnknownEvent(event))
                return None
            return handler(self, *args)

        self.client.on("connect_error", on_connect_error, namespace=ns)
        self.client.on("disconnect", on_disconnect, namespace=ns)
        self.client.on("*", on_any, namespace=ns)


_SIO_ACK = "3"   # the Socket.IO packet type of an ACK


class EventHandlers(threading.Thread):
    """The server's events on one connection, one after another, on one thread: never
    a thread per message, never a handler on the read loop. Its queue is bounded: a
    server that sends faster than the handlers take them in waits on its own TCP
    window, as it would for a slow reader."""

    QUEUE = 256

    def __init__(self, name: str):
        super().__init__(name=name, daemon=True)
        self._queue: queue.Queue = queue.Queue(self.QUEUE)
        self._stopped = False

    def put(self, handle: Callable[[], Any]) -> None:
        if not self._stopped:
            self._queue.put(handle)

    def stop(self) -> None:
        """After the connection: what is queued is dropped, as its news would be."""
        self._stopped = True
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass

    def run(self) -> None:
        while True:
            handle = self._queue.get()
            if handle is None or self._stopped:
                return
            try:
                handle()
            except Exception:   # the library logs a handler's error itself; this is a bug
                log.exception("a server event's handler failed")


def _is_goodbye(pkt) -> bool:
    """An Engine.IO CLOSE, or a Socket.IO DISCONNECT ("1...") inside a MESSAGE."""
    if pkt.packet_type == packet.CLOSE:
        return True
    return (pkt.packet_type == packet.MESSAGE and isinstance(pkt.data, str)
            and pkt.data.startswith("1"))


def _describe(data: Any) -> str:
    if isinstance(data, dict):
        msg = data.get("message")
        if isinstance(msg, str):
            return msg[:200]
    return repr(data)[:200]
