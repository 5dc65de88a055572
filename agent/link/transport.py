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
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any, Callable

import socketio

from . import journal as J
from . import sockopts
from .sockopts import KeepalivePolicy

log = logging.getLogger("edge_agent.link")

# How long abort() waits for the library's threads to notice the dead socket.
ABORT_JOIN_S = 2.0


class TransportError(Exception):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(detail or reason)
        self.reason = reason
        self.detail = detail


class SocketIOTransport:
    def __init__(self, *, url: str, auth: dict | None, namespace: str, keepalive: KeepalivePolicy,
                 transports: list[str] | None = None,
                 connect_timeout_s: float, ca_file: str | None, generation: int,
                 sink: Callable[..., None], handlers: dict[str, Callable] | None = None):
        self.url = url
        self.namespace = namespace
        self.generation = generation
        self._auth = auth
        self._transports = transports or ["websocket"]
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
        ssl_verify: bool | str = ca_file if ca_file else True
        self.client = socketio.Client(
            reconnection=False, logger=False, engineio_logger=False,
            request_timeout=connect_timeout_s, ssl_verify=ssl_verify)
        self._install_hooks()

    # -- lifecycle --------------------------------------------------------------
    def open(self) -> None:
        """Connects, or raises TransportError with a journal reason."""
        try:
            self.client.connect(self.url, auth=self._auth, transports=self._transports,
                                namespaces=[self.namespace],
                                wait_timeout=self._connect_timeout_s)
        except socketio.exceptions.ConnectionError as e:
            self._release()
            if self._refusal is not None:
                raise TransportError(J.REFUSED, _describe(self._refusal)) from None
            raise TransportError(J.CONNECT_FAILED, str(e)) from None
        except Exception as e:  # the library can raise almost anything from a bad peer
            self._release()
            raise TransportError(J.CONNECT_FAILED, f"{type(e).__name__}: {e}") from None
        sock = self.raw_socket()
        if sock is None:
            if getattr(self.client.eio, "current_transport", None) == "polling":
                # long-polling fallback: short HTTP requests, no one socket to tune;
                # the heartbeat watchdog still guards the link
                return
            self.abort()
            raise TransportError(J.CONNECT_FAILED, "no websocket after connect")
        try:
            sockopts.apply_keepalive(sock, self._keepalive)
        except OSError as e:
            self.abort()
            raise TransportError(J.CONNECT_FAILED, f"setting keepalive: {e}") from None
        self._sock = sock

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
    def _release(self) -> None:
        sock, self._sock = self._sock or self.raw_socket(), None
        if sock is not None:
            try:
                sock.close()
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

    def _post(self, kind: str, *args: Any) -> None:
        self._sink(self.generation, kind, *args)

    def _install_hooks(self) -> None:
        from engineio import packet
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
            self._post("closed", reason, detail)

        def on_any(event, *args):
            handler = self._handlers.get(event)
            if handler is None:
                self._post("unknown", event)
                return None
            return handler(self, *args)

        self.client.on("connect_error", on_connect_error, namespace=ns)
        self.client.on("disconnect", on_disconnect, namespace=ns)
        self.client.on("*", on_any, namespace=ns)


def _is_goodbye(pkt) -> bool:
    """An Engine.IO CLOSE, or a Socket.IO DISCONNECT ("1...") inside a MESSAGE."""
    from engineio import packet
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
