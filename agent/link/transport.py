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

The websocket itself, its dial, upgrade and race, are ``upgrade.py``'s; what it takes
from the server (bounded messages, text only), ``frames.py``'s; the server's events
run on ``event_handlers.py``'s thread.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any, Callable

from engineio import packet
import socketio
import websocket

from ..base.egress import Egress
from ..base import reasons as J
from ..runtime.threads import start_worker
from . import inbox, protocol, sockopts
from .dialer import DialError, Dialed
from .event_handlers import EventHandlers
from .frames import MessageRefused
from .upgrade import ABORT_JOIN_S, DIALING, DialContext
from ..config.policies import KeepalivePolicy

log = logging.getLogger("edge_agent.link")


class TransportError(Exception):
    def __init__(self, reason: str, detail: str = "", timed_out: bool = False,
                 busy: bool = False, retry_after_s: float | None = None):
        super().__init__(detail or reason)
        self.reason = reason
        self.detail = detail
        self.timed_out = timed_out   # the connect bound ended it
        self.busy = busy             # the server said it is overloaded (429, 503)
        # the server refused this connect for now, not the credentials: try again after
        self.retry_after_s = retry_after_s



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
        token = DIALING.set(self._dialing)
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
                later = protocol.refused_for_now(self._refusal)
                if later is not None:
                    raise TransportError(J.THROTTLE, _describe(self._refusal), busy=True,
                                         retry_after_s=later) from None
                raise TransportError(J.REFUSED, _describe(self._refusal)) from None
            raise self._why_not_connected(e) from None
        finally:
            DIALING.reset(token)
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
        """Further dials raced this connect's first."""
        return self._dialing.raced

    @property
    def winner(self) -> str:
        """Which dial of a race won: "first", "second", ..."""
        return self._dialing.winner

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
        if self._sock is None:
            return ""
        try:
            host, port = self._sock.getsockname()[:2]
            return f"{host}:{port}"
        except (OSError, AttributeError):
            return ""

    def ending(self) -> bool:
        """The library has seen this connection end: its disconnect handler, queued after
        the server's messages before it, tells the link."""
        client = self.client
        return not client.connected or self.namespace not in client.namespaces

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
        bye = start_worker("link-goodbye", self._disconnect_quietly,
                           reason="the library's disconnect(), which can block ~45 s on a "
                                  "dead socket: waited for grace_s, then the socket is aborted")
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
