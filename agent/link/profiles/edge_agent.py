"""Our own contract, docs/PROTOCOL.md: the token in the handshake, ACKed heartbeats,
events and command results, uploads over HTTP."""
from __future__ import annotations

import threading
from typing import Callable

from ... import __version__
from .. import inbox, protocol
from .contract import Post, ProfileContext


# how long the library's thread waits for the ledger before it answers a command
RECEIPT_WAIT_S = 5.0


class EdgeAgentProfile:
    name = "edge-agent"
    supports_events = True   # device:event with ACKs
    pairs_in_link = False    # pairing happens over HTTP before the link
    namespace = "/"
    transports = ["websocket"]
    link_upload_kinds: frozenset = frozenset()  # uploads go over HTTP (docs/PROTOCOL.md)
    registers = False        # the handshake auth identifies us; no register step
    pairing_code = None      # the enroller shows the server's code (identity/enroller.py)

    def __init__(self, ctx: ProfileContext):
        self.ctx = ctx

    def auth(self) -> dict | None:
        return protocol.connect_auth(self.ctx.device_id(), self.ctx.token() or "", __version__)

    def upload_gap_s(self, event: str, payload: dict) -> float:
        return 0.0   # carries no uploads over the link

    def handlers(self, post: Post) -> dict:
        def throttle(_transport, *args):
            seconds = protocol.parse_throttle(args)
            post(inbox.Throttled(seconds) if seconds is not None else inbox.Malformed(protocol.THROTTLE))

        def reconnect_window(_transport, *args):
            seconds = protocol.parse_reconnect_window(args)
            post(inbox.ReconnectWindow(seconds) if seconds is not None
                 else inbox.Malformed(protocol.RECONNECT_WINDOW))

        def drain(_transport, *args):
            seconds = protocol.parse_drain(args)
            post(inbox.Drain(seconds) if seconds is not None else inbox.Malformed(protocol.DRAIN))

        def command(_transport, data=None, *_):
            # the receipt tells the server not to send it again: it goes out once the
            # part that serves it has the command in its ledger, durably, never before (a power
            # cut in between would lose it for good). The result follows on its own.
            recorded = threading.Event()
            post(inbox.Request(protocol.REQUEST_COMMAND, data, protocol.COMMAND, recorded.set))
            if recorded.wait(RECEIPT_WAIT_S):
                return {"ok": True}
            # not recorded yet (a card slow to sync): the server may send it again, and
            # the ledger runs an id at most once
            return {"ok": False, "error": "not recorded yet; send it again"}
        return {protocol.THROTTLE: throttle, protocol.COMMAND: command,
                protocol.RECONNECT_WINDOW: reconnect_window, protocol.DRAIN: drain}

    @staticmethod
    def command_result(result: dict) -> tuple[str, dict, bool]:
        """(event, payload, whether the server confirms it)."""
        return protocol.COMMAND_RESULT, result, True

    @staticmethod
    def declaration() -> tuple[str, dict] | None:
        return None   # the commands' refusals say what the screen cannot do

    @staticmethod
    def incident(event: dict) -> tuple[str, dict] | None:
        return None   # every event goes as itself, until the server ACKs it

    def on_connected(self, transport, post: Post) -> None:
        pass

    @staticmethod
    def enqueue_problem(kind: str, payload: bytes) -> str | None:
        return None  # HTTP uploads carry any bytes (docs/PROTOCOL.md)

    def send_heartbeat(self, transport, seq: int, wall: float, uptime_s: float, post: Post,
                       now: Callable[[], float]) -> None:
        def on_ack(*args):
            ok, why = protocol.parse_heartbeat_ack(args, seq)
            post(inbox.HeartbeatAcked(seq, now()) if ok else inbox.BadAck(why))
        transport.emit(protocol.HEARTBEAT, protocol.heartbeat(seq, wall, uptime_s), on_ack)

    def send_report(self, transport, connections: list[dict], offline_s: float | None,
                    wall: float, on_ack: Callable) -> None:
        transport.emit(protocol.REPORT, protocol.report(self.ctx.device_id(), connections, wall),
                       on_ack)

    def upload_message(self, item) -> str:
        return "the edge-agent profile sends uploads over HTTP"

    def forget_pairing(self) -> None:
        pass   # the enroller pairs again

    def network_returned(self) -> None:
        pass   # the connection report says what the link saw
