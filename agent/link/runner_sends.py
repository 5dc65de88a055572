"""What LinkRunner says to the server on a connection: heartbeats (and, where the
server ACKs none, the kernel's word on their delivery), the connections' report,
commands' results, uploads and the outbox's events; each emit that finds the link gone
closes it."""
from __future__ import annotations

from . import inbox, protocol, tcpinfo
from .core import LinkState, SendReport
from .delivery import LOST
from .transport import TransportError


class Sends:
    """LinkRunner's part that emits (a mixin of it: its state is the runner's)."""

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
        the server ACKs it: an emit on a silently dropped link proves nothing. A server
        without events (ScreenTinker) hears those it keeps an incident of, once each,
        once it has registered this connection."""
        if self.outbox is None or self.transport is None:
            return
        if not self.profile.supports_events:
            if self.uploads_ready():
                for event in self.outbox.pending():
                    message = self.profile.incident(event.payload())
                    if message is not None:
                        self._emit(*message, None)
                        if self.transport is None:
                            break   # the emit found the link gone: kept for the next one
                    self.outbox.ack(event.id)   # no ACK exists there: said once, or never
            return
        if self.core.state != LinkState.ONLINE or not self.core.watchdog.acked:
            return
        for event in self.cargo.events_to_send(self.outbox.pending(), self.generation):
            # on the library's thread, without waking this one: the server has the
            # event, whichever connection carried it, and the outbox is thread-safe
            def on_ack(*args, event_id=event.id):
                if protocol.parse_ok(args):
                    self.outbox.ack(event_id)

            self._emit(protocol.EVENT, event.payload(), on_ack)

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
