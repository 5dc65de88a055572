"""One connection to the server, from its open to its end: its transport and
generation, what the link thread has read of it (the server's pings, the kernel's word
on each heartbeat), the confirmations it still owes, and what goes out on it
(heartbeats, the connections' report, any part's message). An emit that finds the
transport gone closes the connection: at once on the link thread, through its news
from any other."""
from __future__ import annotations

import itertools
import threading
from typing import Any, Callable

from . import inbox, protocol, tcpinfo
from .core import LinkCore, SendReport
from .port import Confirm, Confirmation
from .transport import SocketIOTransport, TransportError

Sink = Callable[[int, Any], None]
Failed = Callable[[str, str], None]


class Connection:
    def __init__(self, transport: SocketIOTransport, generation: int, profile: Any,
                 sink: Sink, failed: Failed, link_thread: Callable[[], bool]):
        """``failed(reason, detail)``: the link thread closes it; ``link_thread()``: the
        caller is the link thread."""
        self.transport = transport
        self.generation = generation
        self.profile = profile
        self._sink, self._failed, self._on_link_thread = sink, failed, link_thread
        self.pings_seen = 0
        self.tcp_before: dict[int, tcpinfo.TcpProgress | None] = {}  # seq -> before its write
        self.acks_may_wait = False   # proven by an ACK: later ACKs wait for the next turn
        self.said_up = False         # its subscribers heard it is up
        self.live = True
        self._pending: dict[int, Confirm] = {}   # confirmations owed, by the ACK's number
        self._numbers = itertools.count()
        self._lock = threading.Lock()

    def post(self, news: Any) -> None:
        """News about this connection for the link thread, from any thread."""
        self._sink(self.generation, news)

    def raw_socket(self):
        raw = getattr(self.transport, "raw_socket", None)
        return raw() if raw is not None else None

    # -- what goes out on it -----------------------------------------------------------
    def emit(self, event: str, payload: Any, callback: Callable | None = None) -> bool:
        """From any thread: False when the transport failed, and the connection is
        closed for it."""
        if not self.live:
            return False
        try:
            self.transport.emit(event, payload, callback)
            return True
        except TransportError as e:
            self.fail(e)
            return False

    def fail(self, e: TransportError) -> None:
        if self.transport.ending():
            # the library has the connection's end, and says so in order after what the
            # server said before it (a device:throttled): its word, not this emit's
            self.live = False
            return
        if self._on_link_thread():
            self._failed(e.reason, e.detail)
        else:
            self.post(inbox.Closed(e.reason, e.detail))

    def send_acked(self, event: str, payload: Any, on_confirmed: Confirm) -> None:
        """From any thread: confirmed by the server's ACK saying ok, on the library's
        thread; lost with the connection otherwise."""
        with self._lock:
            number = next(self._numbers)
            self._pending[number] = on_confirmed

        def on_ack(*answer):
            if not protocol.parse_ok(answer):
                return   # a refusal is no confirmation: owed until the connection ends
            with self._lock:
                confirm = self._pending.pop(number, None)
            if confirm is not None:
                confirm(Confirmation(True, answer))

        self.emit(event, payload, on_ack)

    def heartbeat(self, seq: int, wall: float, uptime_s: float, now: Callable[[], float],
                  ask_kernel: bool) -> None:
        """``ask_kernel``: no ACKs from this server (yet), the kernel says whether it
        was delivered."""
        if ask_kernel:
            self.tcp_before[seq] = tcpinfo.read(self.raw_socket())
        try:
            self.profile.send_heartbeat(self.transport, seq, wall, uptime_s, self.post, now)
        except TransportError as e:
            self.fail(e)

    def delivered(self, seq: int) -> tuple[bool | None, float | None]:
        """The kernel's word on heartbeat ``seq``: delivered, and its round trip."""
        before = self.tcp_before.pop(seq, None)
        after = tcpinfo.read(self.raw_socket())
        return tcpinfo.delivered(before, after), after.rtt_s if after is not None else None

    def report(self, core: LinkCore, action: SendReport, wall: float) -> None:
        """The connections' report, with how long this process was offline before it."""
        last = action.connections[-1] if action.connections else None
        offline_s = None
        if last is not None and core.connected_at is not None:
            ended = [r for r in core.journal.records if r.n == last["n"]]
            if ended and ended[0].lived_s is not None:
                offline_s = core.connected_at - (ended[0].opened_mono + ended[0].lived_s)

        def on_ack(*args):
            self.post(inbox.ReportAcked(action.upto_n, args))

        try:
            self.profile.send_report(self.transport, action.connections, offline_s, wall,
                                     on_ack)
        except TransportError as e:
            self.fail(e)

    # -- what the link thread reads of it ------------------------------------------------
    def read(self, core: LinkCore, now: float) -> int | None:
        """What the library's threads stored without waking the link thread, to the
        core: inbound traffic and the server's pings (proof of life). The ping count,
        when it changed since the last look."""
        transport = self.transport
        core.on_inbound(transport.last_inbound)
        pings = transport.server_pings
        if pings == self.pings_seen:
            return None
        self.pings_seen = pings
        core.on_server_ping(transport.last_server_ping or now)
        return pings

    def ended(self) -> None:
        """Gone: the confirmations it owed are lost with it."""
        self.live = False
        with self._lock:
            owed, self._pending = self._pending, {}
        for confirm in owed.values():
            confirm(Confirmation(False, (), "link lost before the server confirmed it"))
