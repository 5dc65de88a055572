"""LinkRunner's connects: the transport made for each (its keepalive, connect bound and
race), opened, and what came of it told to the core and the journal; and the site's
idle limit, recalled before a connect on a network and kept once learnt."""
from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import Callable

from ..base.server_clock import CLOCK_SKEWED, NOTABLE_SKEW_S
from ..base import reasons as J
from ..base.journal_fields import MessageId, journal
from ..events.model import Event
from .idle_memory import network_key
from .transport import SocketIOTransport, TransportError

log = logging.getLogger("edge_agent.link")


class Connecting:
    """LinkRunner's part that connects (a mixin of it: its state is the runner's)."""

    # -- the server's clock, as each handshake measures it (base/server_clock.py) -------
    def _judge_clock(self) -> None:
        """This device's clock gone far from the server's, or back: an event and a
        status line, on a change only (in memory: nothing on the card)."""
        change = self.server_clock.change(self.clock.wall(), self.clock.monotonic())
        if change is None:
            return
        kind, skew = change
        if kind == CLOCK_SKEWED:
            log.warning("this device's clock is %.0f s %s the server's: commands' expiry "
                        "is judged by the server's clock", abs(skew),
                        "behind" if skew > 0 else "ahead of")
        else:
            log.info("this device's clock is back within %.0f s of the server's", abs(skew))
        self._published = None      # the status file says it now
        if self.outbox is not None:
            self.outbox.put(Event(kind, self.clock.wall(), {"skew_s": round(skew, 1)}))

    def _clock_now(self, snapshot: dict) -> dict:
        """The link's snapshot with the skew as it is now, not as the handshake saw it:
        a set-time or NTP's jump since shows at once."""
        skew = self.server_clock.skew_s(self.clock.wall(), self.clock.monotonic())
        if skew is not None and snapshot.get("clock_skew_s") is not None:
            snapshot["clock_skew_s"] = round(skew, 1)
        return snapshot

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
                        self.server.display, e.reason, e.detail, delay, attempt + 1,
                        extra=journal(REASON=e.reason))
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
        self.server_clock.measured_skew(skew, self.clock.wall(), self.clock.monotonic())
        self.core.on_connected(now, self.clock.wall(), transport.server_ping_interval_s,
                               transport.local_addr(), took, skew)
        dialed = transport.dialed
        log.info("link up: connected to %s from %s%s in %.0f ms%s%s (connection %d)",
                 self.server.display, transport.local_addr(),
                 f" via {dialed.via}" if dialed is not None and dialed.via != "direct" else "",
                 took * 1000, _phases(dialed), _race_said(transport),
                 self.core.journal.total_connections,
                 extra=journal(MessageId.LINK_UP, CONNECTION=self.core.journal.total_connections))
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

    def _default_transport(self, generation: int, sink: Callable) -> SocketIOTransport:
        profile = self.profile
        keepalive = self.link.keepalive
        if self.core.idle.learning:   # a NAT or conntrack reaper is kept busy by these too
            keepalive = dataclasses.replace(keepalive, idle_s=max(1, min(
                keepalive.idle_s, int(self.core.idle.interval_s))))
        return SocketIOTransport(
            url=self.server.url, auth=profile.auth(), namespace=profile.namespace,
            transports=profile.transports, keepalive=keepalive,
            connect_timeout_s=self.connect_bound.current(), egress=self.server.egress,
            generation=generation, sink=sink, handlers=profile.handlers(self._poster(generation)),
            race_after_s=self._race_after())

    def _race_after(self) -> float | None:
        """When a second dial races this connect, if at all (connect_bound.py decides)."""
        if not self._race:
            return None
        return self.connect_bound.race_after(
            held=self.core.held(self.clock.monotonic()),
            shared_loss=self.core.after_shared_loss)

    def _recall_idle_limit(self) -> None:
        """On the first connect on a network: what was learnt there before."""
        if self._idle_memory is None or not self.link.idle.enabled:
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
