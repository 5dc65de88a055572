"""The link thread: drives LinkCore with a real clock and a real Socket.IO transport.

All decisions live in the core; this loop only sleeps until the core's next
deadline or the next event, executes the actions the core returns, and routes the
library's callbacks (which arrive on its own threads) back through one queue.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import random
import threading
import time
from typing import Callable

from ..base.clock import NOTABLE_SKEW_S, Clock, SystemClock
from ..runtime.loop import Loop
from ..runtime.watchdog_gate import WatchdogGate
from ..base import reasons as J
from . import inbox, protocol, tcpinfo
from .cargo import Cargo
from .connect_bound import ConnectBound
from .idle_memory import IdleMemory, network_key
from .delivery import LOST
from .core import Abort, Connect, LinkCore, LinkPolicy, LinkState, SendHeartbeat, SendReport, VerifyDelivery
from .profiles import PROFILES, ProfileContext
from .schedule_store import ScheduleStore
from .transport import ABORT_JOIN_S, SocketIOTransport, TransportError
from .wakeup import Wakeup

log = logging.getLogger("edge_agent.link")

# The loop re-reads the transport's inbound timestamp and ping count at least this
# often. Waking at a deadline computed from a stale timestamp is safe (it only comes
# early), so this bounds the gap between watchdog-gate ticks and how late a ping's
# proof of delivery is seen (next to its own two ping intervals): an idle agent wakes
# for its heartbeats, and otherwise rarely.
MAX_WAIT_S = 30.0

TransportFactory = Callable[[int, Callable], SocketIOTransport]


class LinkRunner:
    def __init__(self, config, *, clock: Clock | None = None,
                 transport_factory: TransportFactory | None = None,
                 on_status: Callable[[dict], None] | None = None,
                 on_turn: Callable[[], None] | None = None,
                 gate: WatchdogGate | None = None,
                 on_link_up: Callable[[], None] | None = None,
                 on_refused: Callable[[str], None] | None = None,
                 identity: Callable[[], tuple[str, str] | None] | None = None,
                 outbox=None, profile=None,
                 schedule_store: ScheduleStore | None = None,
                 commands=None, paused: bool = False,
                 idle_memory: IdleMemory | None = None,
                 rng: random.Random | None = None, race: bool = True):
        """``paused``: nothing to connect with yet (not paired); resume() when there is.
        ``race=False``: never a second dial (the behaviour before it, for comparisons)."""
        self.config = config
        self.clock = clock or SystemClock()
        self.core = LinkCore(LinkPolicy(liveness=config.link.liveness, backoff=config.link.backoff,
                                        stable_after_s=config.link.stable_after_s,
                                        wake_min_interval_s=config.link.wake_min_interval_s,
                                        idle=config.link.idle), rng)
        self.core.paused = paused
        # the ACK deadline's kernel timer runs on real time only
        self.wakeup = Wakeup(cancellable_deadlines=isinstance(self.clock, SystemClock))
        self._acks_may_wait = False   # this connection has been proven by an ACK
        self.transport: SocketIOTransport | None = None
        self.generation = 0
        self._factory = transport_factory or self._default_transport
        self.connect_bound = ConnectBound(config.server.connect_timeout_s)
        self._race = race
        self._max_wait_s = config.debug.link_max_wait_s or MAX_WAIT_S
        self._idle_memory = idle_memory
        self._network: str | None = None   # where the idle limit in use was learnt
        self._on_status = on_status
        # others' work done on this thread's wake-ups: an idle agent wakes no other thread
        self._on_turn = on_turn
        self._on_link_up = on_link_up
        self._on_refused = on_refused
        self.identity = identity or (lambda: (config.identity.device_id, config.identity.token))
        self.outbox = outbox
        self.profile = profile or PROFILES[config.server.profile](ProfileContext(
            device_id=lambda: (self.identity() or (config.identity.device_id, None))[0],
            token=lambda: (self.identity() or (None, None))[1]))
        self.cargo = Cargo(outbox.capacity if outbox is not None else 0)
        self._store = schedule_store
        self._started = self.clock.monotonic()
        self._published: tuple | None = None
        self._warned: set[str] = set()
        self.commands = commands        # the command service (remote operations), if any
        self._pings_seen = 0
        self._tcp_before: dict[int, tcpinfo.TcpProgress | None] = {}  # seq -> before its write
        self._loop_thread: int | None = None
        self._begun = False
        self._handlers = self._handler_table()
        self._stop_asked = False
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
        return self.config.server.connect_timeout_s + 2 * ABORT_JOIN_S + self._max_wait_s + 2.0

    def proof_window_s(self) -> float:
        """How long delivery proof may take on this link: a heartbeat ACK's round trip,
        or, from a server that ACKs nothing, two of its ping intervals."""
        live = self.config.link.liveness
        return max(live.heartbeat_interval_s + live.ack_timeout_s,
                   2 * self.core.watchdog.server_ping_interval_s + live.ack_timeout_s)

    def seconds_to_next_attempt(self) -> float:
        return max(0.0, self.core.attempt_at() - self.clock.monotonic())

    def outage(self) -> bool:
        """The link is down for a reason of the network's or the server's."""
        core = self.core
        return core.state != LinkState.ONLINE and core.last_reason in J.OUTAGE_REASONS

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
            resume_at = min(resume_at, now + self.config.link.backoff.cap_s)
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
            if self.config.debug.stall_link_after_s is not None:
                self._stall_at = self._started + self.config.debug.stall_link_after_s
            self._prepared = True
        else:
            self._recover()
        while True:
            self.loop.turn()
            if self._on_turn is not None:
                self._on_turn()
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
            self._flush_outbox()
            self._publish()
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

    def _connect(self, attempt: int) -> None:
        if self.identity() is None and not self.profile.pairs_in_link:
            now = self.clock.monotonic()
            self.core.on_connect_failed(now, J.REFUSED)
            self.core.pause(now, J.REFUSED)
            return
        # a connect blocks for up to connect_timeout_s: say so, not the state before it
        self._publish()
        self.generation += 1
        self._recall_idle_limit()   # before the transport: its keepalive follows the limit
        transport = self._factory(self.generation, self.sink)
        self._opening = transport   # a bug in open() leaves it to _recover() to abort
        started = time.monotonic()   # the handshake's real duration, whatever the clock
        try:
            transport.open()
        except TransportError as e:
            self._opening = None
            if e.timed_out:
                self.connect_bound.timed_out(raced=getattr(transport, "raced", False))
            if e.busy:
                self.connect_bound.busy()
            now = self.clock.monotonic()
            self.core.on_connect_failed(now, e.reason, e.detail)
            delay = self.core.attempt_at() - now
            log.warning("connect to %s failed (%s: %s), retrying in %.1fs (attempt %d)",
                        self.config.server.display, e.reason, e.detail, delay, attempt + 1)
            if e.reason == J.REFUSED and self._on_refused is not None:
                self._on_refused(e.detail)
            return
        took = time.monotonic() - started
        # the handshake the bound learns is the winning dial's own, not the wait before it
        self.connect_bound.succeeded(took - getattr(transport, "winner_offset_s", 0.0))
        self.transport, self._opening = transport, None
        self._acks_may_wait = False
        self._pings_seen = 0
        self._tcp_before.clear()
        now = self.clock.monotonic()
        skew = transport.clock_skew_s()
        self.core.on_connected(now, self.clock.wall(), transport.server_ping_interval_s,
                               transport.local_addr(), took, skew)
        dialed = transport.dialed
        log.info("link up: connected to %s from %s%s in %.0f ms%s%s (connection %d)",
                 self.config.server.display, transport.local_addr(),
                 f" via {dialed.via}" if dialed is not None and dialed.via != "direct" else "",
                 took * 1000, _phases(dialed), _race_said(transport),
                 self.core.journal.total_connections)
        if skew is not None and abs(skew) >= NOTABLE_SKEW_S:
            log.warning("this device's clock is %.0f s %s the server's: is it synchronised "
                        "(NTP reachable from this site)?", abs(skew),
                        "behind" if skew > 0 else "ahead of")
        try:
            self.profile.on_connected(transport, self._poster(self.generation))
        except TransportError as e:
            self._closed(e.reason, e.detail)
            return
        if self._on_link_up is not None:
            self._on_link_up()
        if self.commands is not None:
            for report in self.commands.unacked():  # until the server confirms each
                self._send_result(report.result)

    def _poster(self, generation: int):
        return functools.partial(self.sink, generation)

    def _send_heartbeat(self, seq: int) -> None:
        if self.transport is None:
            return
        if not self.core.watchdog.armed:   # no ACKs from this server (yet): ask the kernel
            self._tcp_before[seq] = tcpinfo.read(self.raw_socket())
        try:
            self.profile.send_heartbeat(self.transport, seq, self.clock.wall(),
                                        self.clock.monotonic() - self._started,
                                        self._poster(self.generation), self.clock.monotonic)
        except TransportError as e:
            self._closed(e.reason, e.detail)

    def _verify_delivery(self, seq: int) -> None:
        before = self._tcp_before.pop(seq, None)
        after = tcpinfo.read(self.raw_socket())
        for action in self.core.on_delivery(seq, tcpinfo.delivered(before, after),
                                            self.clock.monotonic(),
                                            after.rtt_s if after is not None else None):
            self._execute(action)

    def raw_socket(self):
        """The live connection's kernel socket, or None (any thread: diagnostics read
        it; the link thread asks the kernel about its heartbeats)."""
        transport = self.transport
        raw = getattr(transport, "raw_socket", None)
        return raw() if raw is not None else None

    def _send_report(self, action: SendReport) -> None:
        if self.transport is None:
            return
        gen = self.generation
        last = action.connections[-1] if action.connections else None
        offline_s = None
        if last is not None and self.core.connected_at is not None:
            ended = [r for r in self.core.journal.records if r.n == last["n"]]
            if ended and ended[0].lived_s is not None:
                offline_s = self.core.connected_at - (ended[0].opened_mono + ended[0].lived_s)

        def on_ack(*args):
            self.sink(gen, inbox.ReportAcked(action.upto_n, args))

        try:
            self.profile.send_report(self.transport, action.connections, offline_s,
                                     self.clock.wall(), on_ack)
        except TransportError as e:
            self._closed(e.reason, e.detail)

    def _emit(self, event: str, payload, callback) -> None:
        if self.transport is None:
            return
        try:
            self.transport.emit(event, payload, callback)
        except TransportError as e:
            self._closed(e.reason, e.detail)

    def _send_upload(self, news: inbox.SendUpload) -> None:
        request = news.request
        if not self.uploads_ready():
            request.finish(LOST, "link not up and registered")
            return
        generation, seq = self.generation, self.core.seq
        self.cargo.upload_sending(request)
        for event, payload in request.messages:
            self._emit(event, payload, None)
        if self.transport is None:
            return  # the emit found the link gone: _closed settled it as lost
        self.cargo.upload_sent(request.key, generation, seq, self.transport.server_pings)

    def _flush_outbox(self) -> None:
        """Hardware events go out in order once the link has carried an ACK, each until
        the server ACKs it: an emit on a silently dropped link proves nothing."""
        if (self.outbox is None or not self.profile.supports_events or self.transport is None
                or self.core.state != LinkState.ONLINE
                or not self.core.watchdog.acked):
            return
        for event in self.cargo.events_to_send(self.outbox.pending(), self.generation):
            # on the library's thread, without waking this one: the server has the
            # event, whichever connection carried it, and the outbox is thread-safe
            def on_ack(*args, event_id=event.id):
                if protocol.parse_ok(args):
                    self.outbox.ack(event_id)

            self._emit(protocol.EVENT, event.payload(), on_ack)

    def _abort(self, reason: str) -> None:
        self.cargo.connection_ended()
        transport, self.transport = self.transport, None
        if reason == J.SHUTDOWN:
            log.info("link closed: shutting down")
            if transport is not None:
                transport.close()
            return
        log.warning("link lost: %s, reconnecting in %.1fs", self._why(reason),
                    self.core.attempt_at() - self.clock.monotonic())
        if transport is not None:
            transport.abort()

    def _why(self, reason: str) -> str:
        wd = self.core.watchdog
        if reason == J.ACK_TIMEOUT and not wd.armed:
            return (f"the server's TCP acknowledged no heartbeat for "
                    f"{self.config.link.liveness.ack_timeout_s:.1f}s (seq {self.core.seq}, "
                    f"{wd.consecutive_misses} missed; this server sends no heartbeat acks)")
        if reason == J.ACK_TIMEOUT:
            return (f"no heartbeat ack for {self.config.link.liveness.ack_timeout_s:.1f}s "
                    f"(seq {self.core.seq}, {wd.consecutive_misses} missed)")
        if reason == J.SILENCE:
            return f"nothing received for {wd.silence_timeout():.1f}s"
        if reason == J.IDLE_REAP:
            return f"{reason} ({self.core.last_detail})"
        return reason

    # -- the site's idle limit ---------------------------------------------------
    def _recall_idle_limit(self) -> None:
        """On the first connect on a network: what was learnt there before."""
        if self._idle_memory is None or not self.config.link.idle.enabled:
            return
        network = network_key()
        if network == self._network:
            return
        self._network = network
        self.core.idle.recall(self._idle_memory.recall(network), self.clock.monotonic())
        if self.core.idle.learning:
            log.info("this network (%s) reaps idle flows: heartbeat every %gs, as learnt "
                     "before", network, self.core.idle.interval_s)
        self.core.idle.changed = False

    def _keep_idle_limit(self) -> None:
        idle = self.core.idle
        if not idle.changed:
            return
        idle.changed = False
        if idle.learning:
            log.warning("connections die after the same idle time: heartbeat every %gs "
                        "(configured %gs) while this site reaps idle flows",
                        idle.interval_s, idle.configured_s)
        else:
            log.info("heartbeat back to every %gs: this site no longer reaps idle flows",
                     idle.configured_s)
        if self._idle_memory is not None:
            self._idle_memory.keep(self._network or network_key(), idle.memory())

    def _closed(self, reason: str, detail: str) -> None:
        if self.core.state != LinkState.ONLINE:
            return
        self.core.on_closed(self.clock.monotonic(), reason, detail)
        self.cargo.connection_ended()
        transport, self.transport = self.transport, None
        log.warning("link lost: %s%s, reconnecting in %.1fs", reason,
                    f" ({detail})" if detail else "",
                    self.core.attempt_at() - self.clock.monotonic())
        if transport is not None:
            transport.abort()

    # -- news -------------------------------------------------------------------
    def _handler_table(self) -> dict:
        return {
            inbox.HeartbeatAcked: self._heartbeat_acked,
            inbox.Stop: self._on_stop,
            inbox.Pause: self._on_pause,
            inbox.Resume: self._on_resume,
            inbox.OutboxChanged: self._outbox_changed,
            inbox.NetworkUp: self._network_up,
            inbox.SendUpload: self._send_upload,
            inbox.ForgetUpload: self._forget_upload,
            inbox.CommandFinished: self._command_finished,
            inbox.CredentialsDropped: self._credentials_dropped,
            inbox.Registered: self._registered,
            inbox.BadAck: self._bad_ack,
            inbox.Malformed: self._malformed,
            inbox.UnknownEvent: self._unknown_event,
            inbox.Emit: self._emit_for_profile,
            inbox.Unpaired: self._unpaired,
            inbox.CommandReceived: self._command_received,
            inbox.CommandResultAcked: self._command_result_acked,
            inbox.ReportAcked: self._report_acked,
            inbox.Closed: self._connection_closed,
            inbox.Throttled: self._throttled,
            inbox.ReconnectWindow: self._reconnect_window,
        }

    def _on_stop(self, news: inbox.Stop) -> None:
        for action in self.core.stop(self.clock.monotonic()):
            self._execute(action)

    def _on_pause(self, news: inbox.Pause) -> None:
        for action in self.core.pause(self.clock.monotonic(), J.REFUSED):
            self._execute(action)

    def _on_resume(self, news: inbox.Resume) -> None:
        self.core.resume(self.clock.monotonic())

    def _outbox_changed(self, news: inbox.OutboxChanged) -> None:
        pass   # woken to flush; every turn does

    def _network_up(self, news: inbox.NetworkUp) -> None:
        if self.core.on_network_up(self.clock.monotonic()):
            log.info("network is back: connecting now instead of waiting out the backoff")

    def _forget_upload(self, news: inbox.ForgetUpload) -> None:
        self.cargo.forget_upload(news.key)

    def _command_finished(self, news: inbox.CommandFinished) -> None:
        for report in self.commands.finished(news.command_id, news.outcome, news.started):
            self._send_result(report.result)

    def _credentials_dropped(self, news: inbox.CredentialsDropped) -> None:
        if self.core.state == LinkState.ONLINE:
            log.info("%s: registering again", news.why)
            self._closed(J.SERVER_DISCONNECT, news.why)

    def _registered(self, news: inbox.Registered) -> None:
        if self.cargo.registered(self.generation) and self._on_link_up is not None:
            self._on_link_up()

    def _bad_ack(self, news: inbox.BadAck) -> None:
        self._warn_once("ack", f"ignoring malformed heartbeat ack: {news.why}")

    def _malformed(self, news: inbox.Malformed) -> None:
        self._warn_once("malformed:" + news.what, f"ignoring malformed {news.what} message")

    def _emit_for_profile(self, news: inbox.Emit) -> None:
        self._emit(news.event, news.payload, None)

    def _connection_closed(self, news: inbox.Closed) -> None:
        self._closed(news.reason, news.detail)

    def _unknown_event(self, news: inbox.UnknownEvent) -> None:
        name = str(news.name)[:64]
        self._warn_once("unknown:" + name, f"ignoring unknown server event {name!r}")

    def _unpaired(self, news: inbox.Unpaired) -> None:
        self.core.on_throttle(news.settle_s, self.clock.monotonic())
        log.warning("%s: registering again with pairing code %s", news.why,
                    self.profile.pairing_code)
        self._closed(J.SERVER_DISCONNECT, news.why)

    def _command_received(self, news: inbox.CommandReceived) -> None:
        if self.commands is None:
            log.warning("server asked for a command (%s) and this agent runs none", news.via)
            reports = []
        else:
            reports = self.commands.received(news.raw)   # the ledger written, durably
        if news.recorded is not None:
            news.recorded()      # now the receipt may go out
        for report in reports:
            self._send_result(report.result, report.kept)

    def _command_result_acked(self, news: inbox.CommandResultAcked) -> None:
        if protocol.parse_ok(news.answer):
            self.commands.acked(news.command_id)

    def _report_acked(self, news: inbox.ReportAcked) -> None:
        if protocol.parse_ok(news.answer):
            self.core.on_report_acked(news.upto_n)

    def _throttled(self, news: inbox.Throttled) -> None:
        hold = self.core.on_throttle(news.seconds, self.clock.monotonic())
        log.warning("server asked to hold off: no new connection for %.0fs", hold)

    def _reconnect_window(self, news: inbox.ReconnectWindow) -> None:
        window = self.core.on_reconnect_window(news.seconds)
        log.info("server's reconnect window: %.0fs (after losing the server, the first "
                 "try comes at a random moment within it)", window)

    def _heartbeat_acked(self, news: inbox.HeartbeatAcked) -> None:
        rtt = self.core.on_ack(news.seq, news.at)
        if rtt is not None:
            log.debug("heartbeat %d acked, rtt %.1f ms", news.seq, rtt * 1000)
        self._acks_may_wait = self.core.watchdog.proven_live(self.clock.monotonic())
        if self.cargo.uploads_waiting:
            self.cargo.heartbeat_acked(self.generation, news.seq)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned and len(self._warned) < 256:
            self._warned.add(key)
            log.warning(message)

    def _send_result(self, result: dict, kept: bool = True) -> None:
        """A command's result to the server, until it confirms (it stays in the ledger
        unconfirmed, and goes again on the next connection). A refusal the ledger does
        not keep (a flood's rate-limited, busy, too old) goes once, unconfirmed, and
        changes no status: a flood costs this thread one emit per command."""
        if self.transport is None:
            return
        if not kept:
            self._emit(*self.profile.command_result(result)[:2], None)
            return
        gen = self.generation
        event, payload, confirms = self.profile.command_result(result)
        if confirms:
            def on_ack(*args, cid=result["id"]):
                self.sink(gen, inbox.CommandResultAcked(cid, args))
            self._emit(event, payload, on_ack)
        else:
            self._emit(event, payload, None)
            if self.transport is not None:
                self.commands.acked(result["id"])  # no confirmation exists: sent once
        if self._on_status is not None:
            self._on_status(self.snapshot())

    # -- status -----------------------------------------------------------------
    def snapshot(self) -> dict:
        return self.core.snapshot(self.clock.monotonic())

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

    # -- wiring -----------------------------------------------------------------
    def _default_transport(self, generation: int, sink: Callable) -> SocketIOTransport:
        cfg = self.config
        profile = self.profile
        keepalive = cfg.link.keepalive
        if self.core.idle.learning:   # a NAT or conntrack reaper is kept busy by these too
            keepalive = dataclasses.replace(keepalive, idle_s=max(1, min(
                keepalive.idle_s, int(self.core.idle.interval_s))))
        return SocketIOTransport(
            url=cfg.server.url, auth=profile.auth(), namespace=profile.namespace,
            transports=profile.transports, keepalive=keepalive,
            connect_timeout_s=self.connect_bound.current(), egress=cfg.server.egress,
            generation=generation, sink=sink, handlers=profile.handlers(self._poster(generation)),
            race_after_s=self._race_after())

    def _race_after(self) -> float | None:
        """When a second dial races this connect, if at all (connect_bound.py decides)."""
        if not self._race:
            return None
        return self.connect_bound.race_after(
            held=self.core.held(self.clock.monotonic()),
            shared_loss=self.core.after_shared_loss)


def _phases(dialed) -> str:
    """ (dns 2, tcp 11, tls 40, upgrade 9 ms): where a slow connect spent its time."""
    if dialed is None or not dialed.phases:
        return ""
    return " (" + ", ".join(f"{name.removesuffix('_s')} {seconds * 1000:.0f}"
                            for name, seconds in dialed.phases.items()) + " ms)"


def _race_said(transport) -> str:
    """ after a race won by the second dial (begun 1.0 s in): what the race changed."""
    if not getattr(transport, "raced", False):
        return ""
    offset = getattr(transport, "winner_offset_s", 0.0)
    if offset > 0:
        return f" after a race won by the second dial (begun {offset:.1f} s in)"
    return " after a race won by the first dial"


def _stall_forever() -> None:
    """Test hook ([debug] stall_link_after_s): a wedged link thread, as a library bug
    or a hung DNS lookup would leave it. The watchdog gate must notice."""
    log.warning("debug: link thread stalling on purpose")
    while True:
        time.sleep(3600)
