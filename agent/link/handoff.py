"""A server's drain in the link's shell (make before break; the rule is handover.py's):
the second connection opened beside the live one, its heartbeat sent, its news taken in
until it proves itself, then switched to or dropped. A collaborator of the runner, as
the connector is: it reads the runner's settings and tells the runner's core."""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from ..base.journal_fields import MessageId, journal
from . import inbox
from .connection import Connection
from .handover import DropSecond, OpenSecond, ProveSecond, Switch
from .transport import TransportError

if TYPE_CHECKING:
    from .runner import LinkRunner

log = logging.getLogger("edge_agent.link")

ACTIONS = (OpenSecond, ProveSecond, Switch, DropSecond)


class Handoff:
    def __init__(self, runner: LinkRunner):
        self.runner = runner
        self.connection: Connection | None = None   # the new one, until proven
        self._took = 0.0   # its handshake

    def execute(self, action: Any) -> None:
        r = self.runner
        if isinstance(action, OpenSecond):
            self.open()
        elif isinstance(action, ProveSecond) and self.connection is not None:
            self.connection.heartbeat(action.seq, r.clock.wall(),
                                      r.clock.monotonic() - r.started, r.clock.monotonic,
                                      ask_kernel=False)
        elif isinstance(action, Switch):
            self.switch(action)
        elif isinstance(action, DropSecond):
            self.drop(action.reason)

    def open(self) -> None:
        """A new connection beside the live one; the core hears whether it opened. Its
        news comes here (takes()) until it carries the link."""
        r = self.runner
        r.generation += 1
        transport = r.factory(r.generation, r.sink)
        started = time.monotonic()
        try:
            transport.open()
        except TransportError as e:
            log.info("drain: the new connection failed (%s: %s); the live one stays until "
                     "the server closes it", e.reason, e.detail)
            r.execute_all(r.core.on_second_failed(r.clock.monotonic(), e.reason))
            return
        self._took = time.monotonic() - started
        self.connection = Connection(transport, r.generation, r.profile, r.sink,
                                     self._failed, r.on_link_thread)
        r.execute_all(r.core.on_second_opened(r.clock.monotonic()))

    def _failed(self, reason: str, detail: str) -> None:
        r = self.runner
        r.execute_all(r.core.on_second_failed(r.clock.monotonic(), reason))

    def takes(self, generation: int | None, news: Any) -> bool:
        """News about the new connection: its proof, or its end; the rest waits for it
        to carry the link. False: not this one's."""
        if self.connection is None or generation != self.connection.generation:
            return False
        r = self.runner
        if isinstance(news, inbox.HeartbeatAcked):
            r.execute_all(r.core.on_second_proven(news.seq, news.at))
        elif isinstance(news, inbox.Closed):
            log.info("drain: the new connection ended before its proof (%s); the live one "
                     "stays until the server closes it", news.reason)
            r.execute_all(r.core.on_second_failed(r.clock.monotonic(), news.reason))
        elif isinstance(news, (inbox.ReconnectWindow, inbox.Throttled)):
            r.news.table[type(news)](news)
        return True

    def drop(self, reason: str) -> None:
        second, self.connection = self.connection, None
        if second is None:
            return
        log.info("drain: the new connection was not proven (%s); the live one stays", reason)
        second.ended()
        second.transport.abort()

    def switch(self, proof: Switch) -> None:
        """The proven new connection carries the link; the old one's unconfirmed sends
        are lost with it (its parts send them again on the new one's up: the server
        keeps each id once), and it is closed politely."""
        r = self.runner
        second, self.connection = self.connection, None
        if second is None:
            return
        old = r.connection
        r.connector.connection_ended()
        r.connection = second
        second.acks_may_wait = True
        transport, clock = second.transport, r.clock
        skew = transport.clock_skew_s()
        r.server_clock.measured_skew(skew, clock.wall(), clock.monotonic())
        r.core.on_switched(clock.monotonic(), clock.wall(), transport.server_ping_interval_s,
                           transport.local_addr(), self._took, skew, (proof.seq, proof.sent_at))
        log.info("link moved: the server drained; connection %d from %s proven, the old one "
                 "closed", r.core.journal.total_connections, transport.local_addr(),
                 extra=journal(MessageId.LINK_UP, CONNECTION=r.core.journal.total_connections))
        if old is not None:
            old.transport.close()
