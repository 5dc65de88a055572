"""The link thread: drives LinkCore with a real clock and a real Socket.IO transport.

All decisions live in the core; this loop only sleeps until the core's next
deadline or the next event, executes the actions the core returns, and routes the
library's callbacks (which arrive on its own threads) back through one queue.

LinkRunner is in four parts: the loop and its actions here; its connects and the
site's idle limit (runner_connect.py); what it says to the server (runner_sends.py);
the news it takes in (runner_news.py).
"""
from __future__ import annotations

import logging
import random
import threading
import time
from typing import Callable

from ..base.clock import Clock, SystemClock
from ..base.server_clock import ServerClock
from ..runtime.loop import Loop
from ..runtime.watchdog_gate import WatchdogGate
from ..base import reasons as J
from ..base.journal_fields import MessageId, journal
from . import inbox, tcpinfo
from .cargo import Cargo
from .connect_bound import ConnectBound
from .idle_memory import IdleMemory
from .core import Abort, Connect, LinkCore, LinkPolicy, LinkState, SendHeartbeat, SendReport, VerifyDelivery
from ..config.model import Debug, Link, Server
from .runner_connect import Connecting
from .runner_news import News
from .runner_sends import Sends
from .schedule_store import ScheduleStore
from .transport import SocketIOTransport
from .upgrade import ABORT_JOIN_S
from .wakeup import Wakeup

log = logging.getLogger("edge_agent.link")

# The loop re-reads the transport's inbound timestamp and ping count at least this
# often. Waking at a deadline computed from a stale timestamp is safe (it only comes
# early), so this bounds the gap between watchdog-gate ticks and how late a ping's
# proof of delivery is seen (next to its own two ping intervals): an idle agent wakes
# for its heartbeats, and otherwise rarely.
MAX_WAIT_S = 30.0

TransportFactory = Callable[[int, Callable], SocketIOTransport]


class LinkRunner(Connecting, Sends, News):
    def __init__(self, link: Link, server: Server, *, profile,
                 identity: Callable[[], tuple[str, str] | None],
                 debug: Debug = Debug(None, None, None), clock: Clock | None = None,
                 transport_factory: TransportFactory | None = None,
                 on_status: Callable[[dict], None] | None = None,
                 on_turn: Callable[[], None] | None = None,
                 gate: WatchdogGate | None = None,
                 on_link_up: Callable[[], None] | None = None,
                 on_refused: Callable[[str], None] | None = None,
                 outbox=None,
                 schedule_store: ScheduleStore | None = None,
                 commands=None, paused: bool = False,
                 idle_memory: IdleMemory | None = None,
                 server_clock: ServerClock | None = None,
                 rng: random.Random | None = None, race: bool = True):
        """``profile``: the server's (link/profiles/); ``identity()``: (device id, token)
        to connect with, None while there is none. ``paused``: nothing to connect with
        yet (not paired); resume() when there is. ``race=False``: never a second dial
        (the behaviour before it, for comparisons). ``server_clock``: where each
        handshake's measure of the server's clock goes (base/server_clock.py), for the
        parts that judge by it."""
        self.link, self.server, self.debug = link, server, debug
        self.clock = clock or SystemClock()
        self.core = LinkCore(LinkPolicy(liveness=link.liveness, backoff=link.backoff,
                                        stable_after_s=link.stable_after_s,
                                        wake_min_interval_s=link.wake_min_interval_s,
                                        idle=link.idle), rng)
        self.core.paused = paused
        # the ACK deadline's kernel timer runs on real time only
        self.wakeup = Wakeup(cancellable_deadlines=isinstance(self.clock, SystemClock))
        self._acks_may_wait = False   # this connection has been proven by an ACK
        self.transport: SocketIOTransport | None = None
        self.generation = 0
        self._factory = transport_factory or self._default_transport
        self.connect_bound = ConnectBound(server.connect_timeout_s)
        self._race = race
        self._max_wait_s = debug.link_max_wait_s or MAX_WAIT_S
        self._idle_memory = idle_memory
        self._network: str | None = None   # where the idle limit in use was learnt
        self._on_status = on_status
        # others' work done on this thread's wake-ups: an idle agent wakes no other thread
        self._on_turn = on_turn
        self._on_link_up = on_link_up
        self._on_refused = on_refused
        self.identity = identity
        self.outbox = outbox
        self.profile = profile
        self.cargo = Cargo(outbox.capacity if outbox is not None else 0)
        self._store = schedule_store
        self._started = self.clock.monotonic()
        self._published: tuple | None = None
        self._warned: set[str] = set()
        self.commands = commands        # the command service (remote operations), if any
        self.server_clock = server_clock or ServerClock()
        self._pings_seen = 0
        self._tcp_before: dict[int, tcpinfo.TcpProgress | None] = {}  # seq -> before its write
        self._loop_thread: int | None = None
        self._begun = False
        self._handlers = self._handler_table()
        self._stop_asked = False
        self._proven_once = False   # this process's link has been proven live
        self._prepared = False   # the commands started, the first state published
        self._opening: SocketIOTransport | None = None   # during a connect
        self._stall_at: float | None = None
        self.loop = Loop("link", self._turns, max_silence_s=self.max_silence_s, gate=gate,
                         stopping=lambda: self._stop_asked, pause=self._wait_before_restart)

    # -- called from any thread -------------------------------------------------
    def sink(self, generation: int | None, news) -> None:
        """From any thread: news (inbox.py) for the link thread; ``generation`` names
        the connection news of inbox.CONNECTION_NEWS is about.

        A heartbeat's ACK on a connection already proven waits for the loop's next turn
        and calls off its deadline's timer (wakeup.py): woken by each ACK, or by each
        deadline, the link thread cost two context switches per heartbeat (the wait, then
        the GIL the library's read thread held). The first ACK of a connection wakes it
        at once: it proves the link, and systemd's watchdog is petted only then; so does
        any ACK while an upload waits for its proof of delivery."""
        if (isinstance(news, inbox.HeartbeatAcked) and self._acks_may_wait
                and not self.cargo.uploads_waiting):
            self.wakeup.put((generation, news), wake=False)
            self.wakeup.call_off((generation, news.seq))
            return
        self.wakeup.put((generation, news))

    def declare(self) -> None:
        """From any thread: what the screen can do changed; a profile that declares it at
        registration (ScreenTinker's capabilities) says it again on the live link."""
        message = self.profile.declaration()
        if message is not None:
            self.sink(None, inbox.Emit(*message))

    def events_queued(self) -> None:
        """From any thread: the outbox holds something new to send. Put on the link
        thread itself (telemetry, sampled on its tick) it needs no wake-up: each turn
        flushes the outbox after its tick."""
        if threading.get_ident() != self._loop_thread:
            self.sink(None, inbox.OutboxChanged())

    def request_stop(self) -> None:
        self._stop_asked = True
        self.sink(None, inbox.Stop())

    def network_up(self) -> None:
        self.sink(None, inbox.NetworkUp())

    def pause(self) -> None:
        """No usable credentials: stop connecting (and drop the link) until resume()."""
        self.sink(None, inbox.Pause())

    def resume(self) -> None:
        self.sink(None, inbox.Resume())

    def credentials_dropped(self, why: str) -> None:
        """The credentials were dropped on this side: drop the link and register anew
        (profiles that register inside the link)."""
        self.sink(None, inbox.CredentialsDropped(why))

    def deliver(self, request) -> None:
        """Send a queued upload over the link (profiles that carry them). ``request``
        has key, messages [(event, payload)] and finish(verdict, detail); finish is
        called exactly once, from the link thread, unless forget() came first."""
        self.sink(None, inbox.SendUpload(request))

    def forget(self, key) -> None:
        self.sink(None, inbox.ForgetUpload(key))

    def command_finished(self, command_id: str, outcome, started: float) -> None:
        self.sink(None, inbox.CommandFinished(command_id, outcome, started))

    def uploads_ready(self) -> bool:
        """Online, and (where the profile registers) confirmed by the server on this
        connection: an upload before device:registered would be dropped unread."""
        return (self.transport is not None and self.core.state == LinkState.ONLINE
                and (not self.profile.registers or self.cargo.registered_on(self.generation)))

    # -- the loop ---------------------------------------------------------------
    @property
    def max_silence_s(self) -> float:
        """The longest this loop may go without a tick while healthy: one blocking
        connect attempt plus one abort, with margin."""
        return self.server.connect_timeout_s + 2 * ABORT_JOIN_S + self._max_wait_s + 2.0

    def proof_window_s(self) -> float:
        """How long delivery proof may take on this link: a heartbeat ACK's round trip,
        or, from a server that ACKs nothing, two of its ping intervals."""
        live = self.link.liveness
        return max(live.heartbeat_interval_s + live.ack_timeout_s,
                   2 * self.core.watchdog.server_ping_interval_s + live.ack_timeout_s)

    def seconds_to_next_attempt(self) -> float:
        return max(0.0, self.core.attempt_at() - self.clock.monotonic())

    def outage(self) -> bool:
        """The link is down for a reason of the network's or the server's."""
        core = self.core
        return core.state != LinkState.ONLINE and core.last_reason in J.OUTAGE_REASONS

    def _others_may_turn(self) -> bool:
        """Others' periodic work (telemetry, the inventory, systemd's line) waits while the
        process makes and proves its first connection: a start, or a restart in the
        middle of a heal, is on the link's time. Once it has been proven, or while it
        waits to try again, every turn does it."""
        if not self._proven_once:
            self._proven_once = self.link_live()
        return self._proven_once or self.core.state == LinkState.WAITING

    def link_live(self) -> bool:
        core = self.core
        return core.state == LinkState.ONLINE and core.watchdog.proven_live(self.clock.monotonic())

    def begin(self) -> None:
        """The reconnect schedule of a previous process, and the first state published.
        The daemon calls it before any thread starts (the loop's first turn does if it
        did not), so the status file, which other threads rewrite too, never shows an
        empty link."""
        if self._begun:
            return
        self._begun = True
        now = self.clock.monotonic()
        attempts, resume_at = self._store.load() if self._store else (0, None)
        if resume_at is not None:
            # never further out than the cap: a bogus file must not silence the agent
            resume_at = min(resume_at, now + self.link.backoff.cap_s)
            log.info("continuing the reconnect schedule of the previous process: attempt %d %s",
                     attempts + 1, f"in {resume_at - now:.1f}s" if resume_at > now else "now")
        self.core.start(now, resume_at, attempts)
        self._publish()

    def start(self, then: Callable[[], None] | None = None) -> None:
        """Runs the link on its own thread; ``then()`` once it has ended."""
        def ended() -> None:
            self._shut_down()
            if then is not None:
                then()
        self.loop.start(ended)

    def run(self) -> None:
        """The same, on the calling thread."""
        try:
            self.loop.run()
        finally:
            self._shut_down()

    def _wait_before_restart(self, seconds: float) -> bool:
        """The loop died: wait out its backoff (news meanwhile waits in the inbox) and
        say whether to give up instead, asked to stop."""
        until = time.monotonic() + seconds   # the thread really waits: real time
        while not self._stop_asked and (left := until - time.monotonic()) > 0:
            self.wakeup.wait(left)
        return self._stop_asked

    def _recover(self) -> None:
        """A restart after the loop died: whatever connection it died with is gone, and
        the core is told so, as it is of any lost connection."""
        now = self.clock.monotonic()
        if self.core.state == LinkState.CONNECTING:
            transport, self._opening = self._opening, None
            if transport is not None:
                transport.abort()
            self.core.on_connect_failed(now, J.CONNECT_FAILED, "the link loop restarted")
        elif self.core.state == LinkState.ONLINE:
            self._closed(J.TRANSPORT_ERROR, "the link loop restarted")
        self.cargo.connection_ended()

    def _shut_down(self) -> None:
        """However the loop ended: a stop asked while it waited to restart still closes
        the link politely and is journaled."""
        if self._stop_asked and self.core.state != LinkState.STOPPED:
            for action in self.core.stop(self.clock.monotonic()):
                self._execute(action)
            self._publish()

    def _turns(self) -> None:
        self._loop_thread = threading.get_ident()
        if not self._prepared:
            if self.commands is not None:
                self.commands.start()  # results of commands from before: sent once connected
            self.begin()
            if self.debug.stall_link_after_s is not None:
                self._stall_at = self._started + self.debug.stall_link_after_s
            self._prepared = True
        else:
            self._recover()
        while True:
            self.loop.turn()
            if self.transport is not None:
                self._read_transport()
            self._take_in_events()
            if self.core.state == LinkState.STOPPED:
                break
            now = self.clock.monotonic()
            if self._stall_at is not None and now >= self._stall_at:
                _stall_forever()
            for action in self.core.poll(now):
                self._execute(action)
            self._judge_clock()
            self._flush_outbox()
            self._publish()
            if self._on_turn is not None and self._others_may_turn():
                self._on_turn()
            self.wakeup.wait(min(max(self._next_wakeup() - self.clock.monotonic(), 0.0),
                                 self._max_wait_s))
        self._publish()

    def _take_in_events(self) -> None:
        # one at a time: news behind one whose handler raised waits for the restart
        while (item := self.wakeup.take()) is not None:
            generation, news = item
            if type(news) in inbox.CONNECTION_NEWS and (
                    generation != self.generation or self.transport is None):
                log.debug("dropped %s: its connection is gone", type(news).__name__)
                continue   # about a connection already torn down
            # the kind only: news may carry what must never be logged (a register with
            # the token)
            log.debug("link news: %s", type(news).__name__)
            self._handlers[type(news)](news)

    def _next_wakeup(self) -> float:
        """The core's next deadline; on a proven connection, the ACK deadline goes on the
        timer the ACK itself calls off."""
        ack = self.core.watchdog.ack_deadline()
        if (ack is not None and self._acks_may_wait and self.core.state == LinkState.ONLINE
                and self.wakeup.cancellable):
            seq, at = ack
            self.wakeup.arm((self.generation, seq), at)
            return self.core.next_wakeup(acks=False)
        self.wakeup.disarm()
        return self.core.next_wakeup()

    def _read_transport(self) -> None:
        """What the library's threads stored without waking us: inbound traffic and
        the server's pings (proof of life, and of delivery where nothing is ACKed)."""
        transport = self.transport
        self.core.on_inbound(transport.last_inbound)
        pings = transport.server_pings
        if pings != self._pings_seen:
            self._pings_seen = pings
            self.core.on_server_ping(transport.last_server_ping or self.clock.monotonic())
            if self.cargo.uploads_waiting:
                self.cargo.server_pinged(self.generation, pings)

    # -- actions ----------------------------------------------------------------
    def _execute(self, action) -> None:
        if isinstance(action, Connect):
            self._connect(action.attempt)
        elif isinstance(action, SendHeartbeat):
            self._send_heartbeat(action.seq)
        elif isinstance(action, VerifyDelivery):
            self._verify_delivery(action.seq)
        elif isinstance(action, SendReport):
            self._send_report(action)
        elif isinstance(action, Abort):
            self._abort(action.reason)

    def raw_socket(self):
        """The live connection's kernel socket, or None (any thread: diagnostics read
        it; the link thread asks the kernel about its heartbeats)."""
        transport = self.transport
        raw = getattr(transport, "raw_socket", None)
        return raw() if raw is not None else None

    def _abort(self, reason: str) -> None:
        self.cargo.connection_ended()
        transport, self.transport = self.transport, None
        if reason == J.SHUTDOWN:
            log.info("link closed: shutting down")
            if transport is not None:
                transport.close()
            return
        log.warning("link lost: %s, reconnecting in %.1fs", self._why(reason),
                    self.core.attempt_at() - self.clock.monotonic(), extra=self._lost(reason))
        if transport is not None:
            transport.abort()

    def _lost(self, reason: str) -> dict:
        return journal(MessageId.LINK_LOST, REASON=reason,
                       CONNECTION=self.core.journal.total_connections)

    def _why(self, reason: str) -> str:
        wd = self.core.watchdog
        if reason == J.ACK_TIMEOUT and not wd.armed:
            return (f"the server's TCP acknowledged no heartbeat for "
                    f"{self.link.liveness.ack_timeout_s:.1f}s (seq {self.core.seq}, "
                    f"{wd.consecutive_misses} missed; this server sends no heartbeat acks)")
        if reason == J.ACK_TIMEOUT:
            return (f"no heartbeat ack for {self.link.liveness.ack_timeout_s:.1f}s "
                    f"(seq {self.core.seq}, {wd.consecutive_misses} missed)")
        if reason == J.SILENCE:
            return f"nothing received for {wd.silence_timeout():.1f}s"
        if reason == J.IDLE_REAP:
            return f"{reason} ({self.core.last_detail})"
        return reason

    def _closed(self, reason: str, detail: str) -> None:
        if self.core.state != LinkState.ONLINE:
            return
        self.core.on_closed(self.clock.monotonic(), reason, detail)
        self.cargo.connection_ended()
        transport, self.transport = self.transport, None
        log.warning("link lost: %s%s, reconnecting in %.1fs", reason,
                    f" ({detail})" if detail else "",
                    self.core.attempt_at() - self.clock.monotonic(), extra=self._lost(reason))
        if transport is not None:
            transport.abort()

    # -- status -----------------------------------------------------------------
    def snapshot(self) -> dict:
        return self._clock_now(self.core.snapshot(self.clock.monotonic()))

    def journal_snapshot(self, last: int = 10) -> list[dict]:
        """The latest connections, for `edge-agent status`."""
        return [r.to_dict() for r in list(self.core.journal.records)[-last:]]

    def _publish(self) -> None:
        """The reconnect schedule to its store and the state to on_status, when either
        changed: only what an operator would call a change (RTT jitter is not one), read
        off the core rather than a snapshot, as this runs on every turn of the loop."""
        core = self.core
        self._keep_idle_limit()
        current = core.journal.current
        state = core.state
        next_attempt = core.attempt_at() if state == LinkState.WAITING else 0.0
        key = (state, core.paused, core.last_reason, current.n if current else None,
               state == LinkState.ONLINE and core.watchdog.proven_live(self.clock.monotonic()),
               core.backoff.attempts, core.hold_until, next_attempt, core.idle.interval_s)
        if key == self._published:
            return
        self._published = key
        if self._store is not None:
            self._store.save(core.backoff.attempts, next_attempt)
        if self._on_status is not None:
            self._on_status(self.snapshot())



def _stall_forever() -> None:
    """Test hook ([debug] stall_link_after_s): a wedged link thread, as a library bug
    or a hung DNS lookup would leave it. The watchdog gate must notice."""
    log.warning("debug: link thread stalling on purpose")
    while True:
        time.sleep(3600)
