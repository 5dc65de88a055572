"""The link thread: drives LinkCore with a real clock and a real Socket.IO transport,
and is the link's port (port.py) for the other parts.

All decisions live in the core; this loop only sleeps until the core's next
deadline or the next event, executes the actions the core returns, and routes the
library's callbacks (which arrive on its own threads) back through one queue.

Its collaborators: the connection of the moment (connection.py), its connects and
their ends (connector.py), the handlers of its news (news.py), what rides under its
proof of delivery (cargo.py), and its port for the other parts (pipe.py).
"""
from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any, Callable, NamedTuple

from ..base.clock import Clock, SystemClock
from ..base.server_clock import ServerClock
from ..runtime.loop import Loop
from ..runtime.watchdog_gate import WatchdogGate
from ..base import reasons as J
from . import inbox
from .cargo import Cargo
from .connection import Connection
from .connector import Connector
from .idle_memory import IdleMemory
from .core import (Abort, Connect, LinkCore, LinkPolicy, LinkState, SendHeartbeat, SendReport,
                   VerifyDelivery)
from .handoff import ACTIONS as HANDOFF_ACTIONS, Handoff
from ..config.model import Debug, Link, Server
from .news import News
from .pipe import Pipe
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


class Settings(NamedTuple):
    """What the link is configured with. ``paused``: nothing to connect with yet (not
    paired); resume() when there is. ``race=False``: never a second dial (the behaviour
    before it, for comparisons)."""
    link: Link
    server: Server
    debug: Debug = Debug(None, None, None)
    paused: bool = False
    race: bool = True


class Hooks(NamedTuple):
    """What the link tells the process, on its thread: its state when it changed
    (``on_status``), each wake-up (``on_turn``: others' work, so an idle agent wakes no
    other thread), a refusal of the credentials, and this device's clock gone far from
    the server's or back (``on_clock(kind, skew_s)``)."""
    on_status: Callable[[dict], None] | None = None
    on_turn: Callable[[], None] | None = None
    on_refused: Callable[[str], None] | None = None
    on_clock: Callable[[str, float], None] | None = None


class Keeps(NamedTuple):
    """Where the link keeps what outlives a connection: the reconnect schedule, each
    network's idle limit, the server's clock as the handshakes measure it (for the
    parts that judge by it)."""
    schedule_store: ScheduleStore | None = None
    idle_memory: IdleMemory | None = None
    server_clock: ServerClock | None = None


class Seams(NamedTuple):
    """What tests and tools put in place of the real thing."""
    clock: Clock | None = None
    transport_factory: TransportFactory | None = None
    rng: random.Random | None = None


class LinkRunner:
    def __init__(self, settings: Settings, *, profile: Any,
                 identity: Callable[[], tuple[str, str] | None], hooks: Hooks = Hooks(),
                 keeps: Keeps = Keeps(), gate: WatchdogGate | None = None,
                 seams: Seams = Seams()):
        """``profile``: the server's (link/profiles/); ``identity()``: (device id, token)
        to connect with, None while there is none."""
        self.settings, self.hooks, self.keeps = settings, hooks, keeps
        self.link, self.server, self.debug = settings.link, settings.server, settings.debug
        link, self.clock = self.link, seams.clock or SystemClock()
        self.core = LinkCore(LinkPolicy(liveness=link.liveness, backoff=link.backoff,
                                        stable_after_s=link.stable_after_s,
                                        wake_min_interval_s=link.wake_min_interval_s,
                                        idle=link.idle), seams.rng)
        self.core.paused = settings.paused
        # the ACK deadline's kernel timer runs on real time only
        self.wakeup = Wakeup(cancellable_deadlines=isinstance(self.clock, SystemClock))
        self.connection: Connection | None = None
        self.generation = 0
        self.connector = Connector(self)
        self.handoff = Handoff(self)   # a server's drain: the new connection
        self.factory = seams.transport_factory or self.connector.default_transport
        self._max_wait_s = self.debug.link_max_wait_s or MAX_WAIT_S
        self.identity = identity
        self.profile = profile
        self.cargo = Cargo()
        self.server_clock = keeps.server_clock or ServerClock()
        self.pipe = Pipe(self)    # the port the other parts are given
        self.started = self.clock.monotonic()
        self._published: tuple | None = None
        self._loop_thread: int | None = None
        self._begun = False
        self.news = News(self)
        self._stop_asked = False
        self.proven_once = False   # this process's link has been proven live
        self._prepared = False   # the first state published
        self._stall_at: float | None = None
        self.loop = Loop("link", self._turns, max_silence_s=self.max_silence_s, gate=gate,
                         stopping=lambda: self._stop_asked, pause=self._wait_before_restart)

    @property
    def transport(self) -> SocketIOTransport | None:
        return self.connection.transport if self.connection is not None else None

    # -- called from any thread -------------------------------------------------
    def sink(self, generation: int | None, news) -> None:
        """From any thread: news (inbox.py) about the connection ``generation`` names; a
        server's request goes to the part serving it. An ACK on a proven connection waits
        for the next turn and calls off its deadline's timer (wakeup.py: each wake-up cost
        two context switches a heartbeat); a connection's first ACK (it proves the link,
        the watchdog's pet) and any while a parcel waits for its proof wake the thread."""
        if isinstance(news, inbox.Request):
            self.pipe.serve_request(news)
            return
        connection = self.connection
        if (isinstance(news, inbox.HeartbeatAcked) and connection is not None
                and generation == connection.generation
                and connection.acks_may_wait and not self.cargo.waiting):
            self.wakeup.put((generation, news), wake=False)
            self.wakeup.call_off((generation, news.seq))
            return
        self.wakeup.put((generation, news))

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
        """Dropped on this side: a new connection registers anew (ScreenTinker)."""
        self.sink(None, inbox.CredentialsDropped(why))

    # -- state, for the process ---------------------------------------------------------
    @property
    def max_silence_s(self) -> float:
        """The longest this loop may go without a tick while healthy: one blocking
        connect attempt plus one abort, with margin."""
        return self.server.connect_timeout_s + 2 * ABORT_JOIN_S + self._max_wait_s + 2.0

    def seconds_to_next_attempt(self) -> float:
        return max(0.0, self.core.attempt_at() - self.clock.monotonic())

    def outage(self) -> bool:
        """The link is down for a reason of the network's or the server's."""
        core = self.core
        return core.state != LinkState.ONLINE and core.last_reason in J.OUTAGE_REASONS

    def ready(self) -> bool:
        """Online, and (where the profile registers) confirmed by the server on this
        connection: a message before device:registered would be dropped unread."""
        connection = self.connection
        return (connection is not None and self.core.state == LinkState.ONLINE
                and (not self.profile.registers or self.cargo.registered_on(connection.generation)))

    def link_live(self) -> bool:
        core = self.core
        return core.state == LinkState.ONLINE and core.watchdog.proven_live(self.clock.monotonic())

    def raw_socket(self):
        """The live connection's kernel socket, or None (any thread: diagnostics read
        it; the link thread asks the kernel about its heartbeats)."""
        connection = self.connection
        return connection.raw_socket() if connection is not None else None

    def snapshot(self) -> dict:
        return self.connector.clock_now(self.core.snapshot(self.clock.monotonic()))

    def journal_snapshot(self, last: int = 10) -> list[dict]:
        """The latest connections, for `edge-agent status`."""
        return [r.to_dict() for r in list(self.core.journal.records)[-last:]]

    # -- the loop ---------------------------------------------------------------
    def begin(self) -> None:
        """The reconnect schedule of a previous process, and the first state published.
        The daemon calls it before any thread starts (the loop's first turn does if it
        did not), so the status file, which other threads rewrite too, never shows an
        empty link."""
        if self._begun:
            return
        self._begun = True
        now = self.clock.monotonic()
        store = self.keeps.schedule_store
        attempts, resume_at = store.load() if store else (0, None)
        if resume_at is not None:
            # never further out than the cap: a bogus file must not silence the agent
            resume_at = min(resume_at, now + self.link.backoff.cap_s)
            log.info("continuing the reconnect schedule of the previous process: attempt %d %s",
                     attempts + 1, f"in {resume_at - now:.1f}s" if resume_at > now else "now")
        self.core.start(now, resume_at, attempts)
        self.publish()

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

    def on_link_thread(self) -> bool:   # connection.py: an emit's failure closes at once here
        return threading.get_ident() == self._loop_thread

    def _wait_before_restart(self, seconds: float) -> bool:
        """The loop died: wait out its backoff (news waits); True: asked to stop."""
        until = time.monotonic() + seconds   # the thread really waits: real time
        while not self._stop_asked and (left := until - time.monotonic()) > 0:
            self.wakeup.wait(left)
        return self._stop_asked

    def _shut_down(self) -> None:
        """However the loop ended, a stop asked closes the link politely, journaled."""
        if self._stop_asked and self.core.state != LinkState.STOPPED:
            self.execute_all(self.core.stop(self.clock.monotonic()))
            self.publish()

    def _turns(self) -> None:
        self._loop_thread = threading.get_ident()
        if not self._prepared:
            self.begin()
            if self.debug.stall_link_after_s is not None:
                self._stall_at = self.started + self.debug.stall_link_after_s
            self._prepared = True
        else:
            self.connector.recover()
        while True:
            self.loop.turn()
            self.read_transport()
            self.take_in_events()
            if self.core.state == LinkState.STOPPED:
                break
            now = self.clock.monotonic()
            if self._stall_at is not None and now >= self._stall_at:
                _stall_forever()
            if self.hooks.on_turn is not None and self._others_may_turn():
                self.hooks.on_turn()   # before the sends: no writer waits on their reads' GIL
                self.read_transport()   # what came meanwhile, before the core judges silence
                self.take_in_events()   # and what their work asked of the link, this turn
            self.execute_all(self.core.poll(self.clock.monotonic()))
            if self.connector.judge_clock():
                self._published = None      # the status file says it now
            self._say_up()
            self.publish()
            self.wakeup.wait(min(max(self.next_wakeup() - self.clock.monotonic(), 0.0),
                                 self._max_wait_s))
        self.publish()

    def _others_may_turn(self) -> bool:
        """Others' periodic work (telemetry, the inventory, systemd's line) waits while the
        process makes and proves its first connection (a start, or a restart mid-heal, is
        on the link's time); once proven, or while it waits to try again, every turn."""
        if not self.proven_once:
            self.proven_once = self.link_live()
        return self.proven_once or self.core.state == LinkState.WAITING

    def take_in_events(self) -> None:
        # one at a time: news behind one whose handler raised waits for the restart
        while (item := self.wakeup.take()) is not None:
            generation, news = item
            if self.handoff.takes(generation, news):
                continue
            if type(news) in inbox.CONNECTION_NEWS and (
                    self.connection is None or generation != self.connection.generation):
                log.debug("dropped %s: its connection is gone", type(news).__name__)
                continue   # about a connection already torn down
            # the kind only: news may carry what must never be logged (a register with
            # the token)
            log.debug("link news: %s", type(news).__name__)
            self.news.table[type(news)](news)

    def next_wakeup(self) -> float:
        """The core's next deadline; on a proven connection, the ACK deadline goes on the
        timer the ACK itself calls off."""
        ack = self.core.watchdog.ack_deadline()
        connection = self.connection
        if (ack is not None and connection is not None and connection.acks_may_wait
                and self.core.state == LinkState.ONLINE and self.wakeup.cancellable):
            seq, at = ack
            self.wakeup.arm((connection.generation, seq), at)
            return self.core.next_wakeup(acks=False)
        self.wakeup.disarm()
        return self.core.next_wakeup()

    def read_transport(self) -> None:
        """What the library's threads stored without waking us (connection.read), and
        the server's pings as proof of delivery where nothing is ACKed."""
        connection = self.connection
        if connection is None:
            return
        pings = connection.read(self.core, self.clock.monotonic())
        if pings is not None and self.cargo.waiting:
            self.cargo.server_pinged(connection.generation, pings)

    def _say_up(self) -> None:
        """The connection proven live (and registered, where the server registers us):
        the port's subscribers hear it once."""
        connection = self.connection
        if (connection is not None and not connection.said_up and self.ready()
                and self.core.watchdog.proven_live(self.clock.monotonic())):
            connection.said_up = True
            self.pipe.tell(self.pipe.subscribers.up)

    # -- actions ----------------------------------------------------------------
    def execute_all(self, actions: list) -> None:
        for action in actions:
            self.execute(action)

    def execute(self, action) -> None:
        connection = self.connection
        if isinstance(action, Connect):
            self.connector.connect(action.attempt)
        elif isinstance(action, SendHeartbeat) and connection is not None:
            connection.heartbeat(action.seq, self.clock.wall(),
                                 self.clock.monotonic() - self.started, self.clock.monotonic,
                                 ask_kernel=not self.core.watchdog.armed)
        elif isinstance(action, VerifyDelivery) and connection is not None:
            delivered, rtt = connection.delivered(action.seq)
            self.execute_all(self.core.on_delivery(action.seq, delivered,
                                                   self.clock.monotonic(), rtt))
        elif isinstance(action, SendReport) and connection is not None:
            connection.report(self.core, action, self.clock.wall())
        elif isinstance(action, Abort):
            self.connector.abort(action.reason)
        elif isinstance(action, HANDOFF_ACTIONS):
            self.handoff.execute(action)

    def publish(self) -> None:
        """The reconnect schedule to its store and the state to on_status, when either
        changed: only what an operator would call a change (RTT jitter is not one), read
        off the core rather than a snapshot, as this runs on every turn of the loop."""
        core = self.core
        self.connector.keep_idle_limit()
        current = core.journal.current
        state = core.state
        next_attempt = core.attempt_at() if state == LinkState.WAITING else 0.0
        key = (state, core.paused, core.last_reason, current.n if current else None,
               state == LinkState.ONLINE and core.watchdog.proven_live(self.clock.monotonic()),
               core.backoff.attempts, core.hold_until, next_attempt, core.idle.interval_s)
        if key == self._published:
            return
        self._published = key
        if self.keeps.schedule_store is not None:
            self.keeps.schedule_store.save(core.backoff.attempts, next_attempt)
        if self.hooks.on_status is not None:
            self.hooks.on_status(self.snapshot())


def _stall_forever() -> None:
    """Test hook ([debug] stall_link_after_s): a wedged link thread, as a library bug
    or a hung DNS lookup would leave it. The watchdog gate must notice."""
    log.warning("debug: link thread stalling on purpose")
    while True:
        time.sleep(3600)
