"""LinkRunner's handling of its news (inbox.py), one handler per kind, on the link
thread: the server's answers and requests, and what other threads ask of the link."""
from __future__ import annotations

import logging

from ..base import reasons as J
from . import inbox, protocol
from .core import LinkState

log = logging.getLogger("edge_agent.link")


class News:
    """LinkRunner's part that takes in news (a mixin of it: its state is the runner's)."""

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
