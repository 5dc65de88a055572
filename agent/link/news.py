"""The link thread's news (inbox.py), one handler per kind: the server's answers and
what other threads ask of the link."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

from ..base import reasons as J
from . import inbox, protocol
from .cargo import Parcel
from .core import LinkState
from .delivery import LOST

if TYPE_CHECKING:
    from .runner import LinkRunner

log = logging.getLogger("edge_agent.link")


class News:
    """The runner's handlers of its news (a collaborator of it: each acts on the
    runner's core and its connection)."""

    def __init__(self, runner: LinkRunner):
        self.runner = runner
        self._warned: set[str] = set()
        self.table: dict[type, Callable[[Any], None]] = {
            inbox.HeartbeatAcked: self._heartbeat_acked,
            inbox.Stop: lambda news: runner.execute_all(runner.core.stop(runner.clock.monotonic())),
            inbox.Pause: lambda news: runner.execute_all(
                runner.core.pause(runner.clock.monotonic(), J.REFUSED)),
            inbox.Resume: lambda news: runner.core.resume(runner.clock.monotonic()),
            inbox.NetworkUp: self._network_up,
            inbox.Deliver: self._deliver,
            inbox.Forget: lambda news: runner.cargo.forget(news.key),
            inbox.CredentialsDropped: self._credentials_dropped,
            inbox.Registered: self._registered,
            inbox.BadAck: lambda news: self.warn_once(
                "ack", f"ignoring malformed heartbeat ack: {news.why}"),
            inbox.Malformed: lambda news: self.warn_once(
                "malformed:" + news.what, f"ignoring malformed {news.what} message"),
            inbox.UnknownEvent: self._unknown_event,
            inbox.Emit: self._emit,
            inbox.Unpaired: self._unpaired,
            inbox.ReportAcked: self._report_acked,
            inbox.Closed: lambda news: runner.connector.closed(news.reason, news.detail),
            inbox.Throttled: self._throttled,
            inbox.ReconnectWindow: self._reconnect_window,
            inbox.Drain: self._drain,
        }

    def _network_up(self, news: inbox.NetworkUp) -> None:
        r = self.runner
        if r.core.on_network_up(r.clock.monotonic()):
            log.info("network is back: connecting now instead of waiting out the backoff")

    def _deliver(self, news: inbox.Deliver) -> None:
        """Messages under one proof of delivery (cargo.py): nothing goes before the link
        is ready for it."""
        r = self.runner
        parcel: Parcel = news.parcel
        connection = r.connection
        if connection is None or not r.ready():
            parcel.finish(LOST, "link not up and registered")
            return
        seq = r.core.seq
        r.cargo.sending(parcel)
        for message in parcel.messages:
            connection.emit(message.event, message.payload)
        if r.connection is not connection:
            return  # the emit found the link gone: connection_ended settled it as lost
        r.cargo.sent(parcel.key, connection.generation, seq, connection.transport.server_pings)

    def _emit(self, news: inbox.Emit) -> None:
        if self.runner.connection is not None:
            self.runner.connection.emit(news.event, news.payload)

    def _credentials_dropped(self, news: inbox.CredentialsDropped) -> None:
        if self.runner.core.state == LinkState.ONLINE:
            log.info("%s: registering again", news.why)
            self.runner.connector.closed(J.SERVER_DISCONNECT, news.why)

    def _registered(self, news: inbox.Registered) -> None:
        r = self.runner
        if r.connection is not None and r.cargo.registered(r.connection.generation):
            r.pipe.tell(r.pipe.subscribers.registered)

    def _unknown_event(self, news: inbox.UnknownEvent) -> None:
        name = str(news.name)[:64]
        self.warn_once("unknown:" + name, f"ignoring unknown server event {name!r}")

    def _unpaired(self, news: inbox.Unpaired) -> None:
        r = self.runner
        r.core.on_throttle(news.settle_s, r.clock.monotonic())
        log.warning("%s: registering again with pairing code %s", news.why,
                    r.profile.pairing_code)
        r.connector.closed(J.SERVER_DISCONNECT, news.why)

    def _report_acked(self, news: inbox.ReportAcked) -> None:
        if protocol.parse_ok(news.answer):
            self.runner.core.on_report_acked(news.upto_n)

    def _throttled(self, news: inbox.Throttled) -> None:
        r = self.runner
        hold = r.core.on_throttle(news.seconds, r.clock.monotonic())
        log.warning("server asked to hold off: no new connection for %.0fs", hold)

    def _reconnect_window(self, news: inbox.ReconnectWindow) -> None:
        window = self.runner.core.on_reconnect_window(news.seconds)
        log.info("server's reconnect window: %.0fs (after losing the server, the first "
                 "try comes at a random moment within it)", window)

    def _drain(self, news: inbox.Drain) -> None:
        r = self.runner
        delay = r.core.on_drain(news.seconds, r.clock.monotonic())
        if delay is not None:
            log.info("server drains within %.0fs: opening a new connection in %.1fs, the "
                     "live one kept until the new one is proven", news.seconds, delay)

    def _heartbeat_acked(self, news: inbox.HeartbeatAcked) -> None:
        r = self.runner
        rtt = r.core.on_ack(news.seq, news.at)
        if rtt is not None:
            log.debug("heartbeat %d acked, rtt %.1f ms", news.seq, rtt * 1000)
        if r.connection is not None:
            r.connection.acks_may_wait = r.core.watchdog.proven_live(r.clock.monotonic())
        if r.cargo.waiting and r.connection is not None:
            r.cargo.heartbeat_acked(r.connection.generation, news.seq)

    def warn_once(self, key: str, message: str) -> None:
        if key not in self._warned and len(self._warned) < 256:
            self._warned.add(key)
            log.warning(message)
