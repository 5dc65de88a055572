"""The link's connects and their ends: the transport made for each (its keepalive, connect bound and
race), opened, and what came of it told to the core and the journal; the site's idle
limit, recalled before a connect on a network and kept once learnt; and the server's
clock as each handshake measures it."""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from ..base.server_clock import CLOCK_SKEWED, NOTABLE_SKEW_S
from ..base import reasons as J
from ..base.journal_fields import MessageId, journal
from .connect_bound import ConnectBound
from .connection import Connection
from .core import LinkState
from .idle_memory import network_key
from .transport import SocketIOTransport, TransportError

if TYPE_CHECKING:
    from .runner import LinkRunner

log = logging.getLogger("edge_agent.link")


class Connector:
    """The runner's connects (a collaborator of it: it reads the runner's settings and
    tells the runner's core)."""

    def __init__(self, runner: LinkRunner):
        self.runner = runner
        self.bound = ConnectBound(runner.server.connect_timeout_s)
        self.opening: SocketIOTransport | None = None   # during a connect
        self._network: str | None = None   # where the idle limit in use was learnt

    def connect(self, attempt: int) -> None:
        """One attempt: the runner's new connection, or the core hears why not."""
        connection = self._open(attempt)
        if connection is None:
            return
        self.runner.connection = connection
        try:
            self.runner.profile.on_connected(connection.transport, connection.post)
        except TransportError as e:
            self.closed(e.reason, e.detail)

    def recover(self) -> None:
        """A restart after the loop died: whatever connection it died with is gone, and
        the core is told so, as it is of any lost connection."""
        r = self.runner
        now = r.clock.monotonic()
        if r.core.state == LinkState.CONNECTING:
            transport, self.opening = self.opening, None
            if transport is not None:
                transport.abort()
            r.core.on_connect_failed(now, J.CONNECT_FAILED, "the link loop restarted")
        elif r.core.state == LinkState.ONLINE:
            self.closed(J.TRANSPORT_ERROR, "the link loop restarted")
        self.connection_ended()

    def _open(self, attempt: int) -> Connection | None:
        r = self.runner
        core, clock = r.core, r.clock
        if r.identity() is None and not r.profile.pairs_in_link:
            now = clock.monotonic()
            core.on_connect_failed(now, J.REFUSED)
            core.pause(now, J.REFUSED)
            return None
        # a connect blocks for up to connect_timeout_s: say so, not the state before it
        r.publish()
        r.generation += 1
        generation = r.generation
        self._recall_idle_limit()   # before the transport: its keepalive follows the limit
        transport = r.factory(generation, r.sink)
        self.opening = transport   # a bug in open() leaves it to the runner's recover()
        started = time.monotonic()   # the handshake's real duration, whatever the clock
        try:
            transport.open()
        except TransportError as e:
            self.opening = None
            self._failed(e, attempt, getattr(transport, "raced", False))
            return None
        took = time.monotonic() - started
        # the handshake the bound learns is the winning dial's own, not the wait before it
        self.bound.succeeded(took - getattr(transport, "winner_offset_s", 0.0))
        self.opening = None
        connection = Connection(transport, generation, r.profile, r.sink, self.closed,
                                r.on_link_thread)
        now = clock.monotonic()
        skew = transport.clock_skew_s()
        r.server_clock.measured_skew(skew, clock.wall(), clock.monotonic())
        core.on_connected(now, clock.wall(), transport.server_ping_interval_s,
                          transport.local_addr(), took, skew)
        dialed = transport.dialed
        log.info("link up: connected to %s from %s%s in %.0f ms%s%s (connection %d)",
                 r.server.display, transport.local_addr(),
                 f" via {dialed.via}" if dialed is not None and dialed.via != "direct" else "",
                 took * 1000, _phases(dialed), _race_said(transport),
                 core.journal.total_connections,
                 extra=journal(MessageId.LINK_UP, CONNECTION=core.journal.total_connections))
        if skew is not None and abs(skew) >= NOTABLE_SKEW_S:
            log.warning("this device's clock is %.0f s %s the server's: is it synchronised "
                        "(NTP reachable from this site)?", abs(skew),
                        "behind" if skew > 0 else "ahead of")
        return connection

    def _failed(self, e: TransportError, attempt: int, raced: bool) -> None:
        r = self.runner
        if e.timed_out:
            self.bound.timed_out(raced=raced)
        if e.busy:
            self.bound.busy()
        now = r.clock.monotonic()
        if e.retry_after_s is not None:   # refused for now: the credentials stand
            r.core.on_throttle(e.retry_after_s, now)
        r.core.on_connect_failed(now, e.reason, e.detail)
        delay = r.core.attempt_at() - now
        log.warning("connect to %s failed (%s: %s), retrying in %.1fs (attempt %d)",
                    r.server.display, e.reason, e.detail, delay, attempt + 1,
                    extra=journal(REASON=e.reason))
        if e.reason == J.REFUSED and r.hooks.on_refused is not None:
            r.hooks.on_refused(e.detail)

    def default_transport(self, generation: int, sink: Any) -> SocketIOTransport:
        r = self.runner
        profile = r.profile
        keepalive = r.link.keepalive
        if r.core.idle.learning:   # a NAT or conntrack reaper is kept busy by these too
            keepalive = dataclasses.replace(keepalive, idle_s=max(1, min(
                keepalive.idle_s, int(r.core.idle.interval_s))))

        def post(news: Any) -> None:
            sink(generation, news)

        return SocketIOTransport(
            url=r.server.url, auth=profile.auth(), namespace=profile.namespace,
            transports=profile.transports, keepalive=keepalive,
            connect_timeout_s=self.bound.current(), egress=r.server.egress,
            generation=generation, sink=sink, handlers=profile.handlers(post),
            race_after_s=self._race_after())

    def _race_after(self) -> float | None:
        """When a second dial races this connect, if at all (connect_bound.py decides)."""
        r = self.runner
        if not r.settings.race:
            return None
        return self.bound.race_after(held=r.core.held(r.clock.monotonic()),
                                     shared_loss=r.core.after_shared_loss)

    # -- a connection's end ------------------------------------------------------------
    def connection_ended(self) -> None:
        """Whatever rode on the connection is lost with it; its subscribers hear it."""
        r = self.runner
        if r.core.state != LinkState.ONLINE:
            r.handoff.drop(J.SHUTDOWN)   # a drain's new connection goes with the link
        r.cargo.connection_ended()
        connection, r.connection = r.connection, None
        if connection is not None:
            connection.ended()
            if connection.said_up:
                r.pipe.tell(r.pipe.subscribers.down)

    def abort(self, reason: str) -> None:
        r = self.runner
        transport = r.transport
        self.connection_ended()
        if reason == J.SHUTDOWN:
            log.info("link closed: shutting down")
            if transport is not None:
                transport.close()
            return
        log.warning("link lost: %s, reconnecting in %.1fs", self._why(reason),
                    r.core.attempt_at() - r.clock.monotonic(), extra=self._lost(reason))
        if transport is not None:
            transport.abort()

    def _lost(self, reason: str) -> dict:
        return journal(MessageId.LINK_LOST, REASON=reason,
                       CONNECTION=self.runner.core.journal.total_connections)

    def _why(self, reason: str) -> str:
        core = self.runner.core
        wd = core.watchdog
        ack_timeout_s = self.runner.link.liveness.ack_timeout_s
        if reason == J.ACK_TIMEOUT and not wd.armed:
            return (f"the server's TCP acknowledged no heartbeat for {ack_timeout_s:.1f}s "
                    f"(seq {core.seq}, {wd.consecutive_misses} missed; this server "
                    f"sends no heartbeat acks)")
        if reason == J.ACK_TIMEOUT:
            return (f"no heartbeat ack for {ack_timeout_s:.1f}s "
                    f"(seq {core.seq}, {wd.consecutive_misses} missed)")
        if reason == J.SILENCE:
            return f"nothing received for {wd.silence_timeout():.1f}s"
        if reason == J.IDLE_REAP:
            return f"{reason} ({core.last_detail})"
        return reason

    def closed(self, reason: str, detail: str) -> None:
        """On the link thread: the connection ended (the server, the transport)."""
        r = self.runner
        if r.core.state != LinkState.ONLINE:
            return
        r.core.on_closed(r.clock.monotonic(), reason, detail)
        transport = r.transport
        self.connection_ended()
        log.warning("link lost: %s%s, reconnecting in %.1fs", reason,
                    f" ({detail})" if detail else "",
                    r.core.attempt_at() - r.clock.monotonic(), extra=self._lost(reason))
        if transport is not None:
            transport.abort()

    # -- the site's idle limit -------------------------------------------------------
    def _recall_idle_limit(self) -> None:
        """On the first connect on a network: what was learnt there before."""
        r = self.runner
        memory = r.keeps.idle_memory
        if memory is None or not r.link.idle.enabled:
            return
        network = network_key()
        if network == self._network:
            return
        self._network = network
        r.core.idle.recall(memory.recall(network), r.clock.monotonic())
        if r.core.idle.learning:
            log.info("this network (%s) reaps idle flows: heartbeat every %gs, as learnt "
                     "before", network, r.core.idle.interval_s)
        r.core.idle.changed = False

    def keep_idle_limit(self) -> None:
        r = self.runner
        idle = r.core.idle
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
        if r.keeps.idle_memory is not None:
            r.keeps.idle_memory.keep(self._network or network_key(), idle.memory())

    # -- the server's clock, as each handshake measures it (base/server_clock.py) -------
    def judge_clock(self) -> bool:
        """This device's clock gone far from the server's, or back: a line and the
        runner's hook, on a change only (in memory: nothing on the card). True: changed."""
        r = self.runner
        change = r.server_clock.change(r.clock.wall(), r.clock.monotonic())
        if change is None:
            return False
        kind, skew = change
        if kind == CLOCK_SKEWED:
            log.warning("this device's clock is %.0f s %s the server's: commands' expiry "
                        "is judged by the server's clock", abs(skew),
                        "behind" if skew > 0 else "ahead of")
        else:
            log.info("this device's clock is back within %.0f s of the server's", abs(skew))
        if r.hooks.on_clock is not None:
            r.hooks.on_clock(kind, skew)
        return True

    def clock_now(self, snapshot: dict) -> dict:
        """The link's snapshot with the skew as it is now, not as the handshake saw it:
        a set-time or NTP's jump since shows at once."""
        r = self.runner
        skew = r.server_clock.skew_s(r.clock.wall(), r.clock.monotonic())
        if skew is not None and snapshot.get("clock_skew_s") is not None:
            snapshot["clock_skew_s"] = round(skew, 1)
        return snapshot


def _phases(dialed) -> str:
    """ (dns 2, tcp 11, tls 40, upgrade 9 ms): where a slow connect spent its time."""
    if dialed is None or not dialed.phases:
        return ""
    return " (" + ", ".join(f"{name.removesuffix('_s')} {seconds * 1000:.0f}"
                            for name, seconds in dialed.phases.items()) + " ms)"


def _race_said(transport) -> str:
    """ after a race won by the second dial (begun 0.5 s in): what the race changed."""
    if not getattr(transport, "raced", False):
        return ""
    offset = getattr(transport, "winner_offset_s", 0.0)
    if offset > 0:
        return (f" after a race won by the {getattr(transport, 'winner', 'second')} dial "
                f"(begun {offset:.1f} s in)")
    return " after a race won by the first dial"
