"""Server profiles: how the one link (watchdog, backoff, keepalive, journal) speaks to a
particular server. The core and the runner never change per server; a profile only
maps their actions onto a wire protocol and the server's messages back onto events.

- ``edge-agent``: our contract, docs/PROTOCOL.md.
- ``screentinker``: the device protocol ("contract v4") of ScreenTinker, an open-source
  signage server, so an existing fleet can adopt the agent.
"""
from __future__ import annotations

import hashlib
import json
import math
import platform
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Callable

from .. import __version__
from . import protocol

Post = Callable[..., None]   # post(kind, *args): an event into the runner, for this connection


@dataclass
class ProfileContext:
    """What a profile may know and do about the device's identity."""
    device_id: Callable[[], str]
    token: Callable[[], str | None]
    on_token: Callable[..., None] = lambda token, device_id=None: None  # a server handed a token
    on_unpaired: Callable[[float], None] = lambda settle_s: None  # the server dropped us
    facts: Callable[[], dict] = lambda: {}


class EdgeAgentProfile:
    name = "edge-agent"
    supports_events = True   # device:event with ACKs
    needs_token = True       # pairing happens over HTTP before the link
    namespace = "/"
    transports = ["websocket"]
    link_upload_kinds: frozenset = frozenset()  # uploads go over HTTP (docs/PROTOCOL.md)
    registers = False        # the handshake auth identifies us; no register step

    def __init__(self, ctx: ProfileContext):
        self.ctx = ctx

    def auth(self) -> dict | None:
        return protocol.connect_auth(self.ctx.device_id(), self.ctx.token() or "", __version__)

    def handlers(self, post: Post) -> dict:
        def throttle(_transport, *args):
            seconds = protocol.parse_throttle(args)
            post("throttle", seconds) if seconds is not None else post("malformed", protocol.THROTTLE)
        return {protocol.THROTTLE: throttle}

    def on_connected(self, transport, post: Post) -> None:
        pass

    def send_heartbeat(self, transport, seq: int, wall: float, uptime_s: float, post: Post,
                       now: Callable[[], float]) -> None:
        def on_ack(*args):
            ok, why = protocol.parse_heartbeat_ack(args, seq)
            post("ack", seq, now()) if ok else post("bad-ack", why)
        transport.emit(protocol.HEARTBEAT, protocol.heartbeat(seq, wall, uptime_s), on_ack)

    def send_report(self, transport, connections: list[dict], offline_s: float | None,
                    wall: float, on_ack: Callable) -> None:
        transport.emit(protocol.REPORT, protocol.report(self.ctx.device_id(), connections, wall),
                       on_ack)


class ScreenTinkerProfile:
    """ScreenTinker's device protocol, contract v4, as its public behaviour describes it."""
    name = "screentinker"
    supports_events = False  # no ACKed event channel in contract v4
    needs_token = False      # an unpaired device registers with its pairing code
    namespace = "/device"
    transports = ["websocket", "polling"]
    MAX_HOLD_S = 300.0
    STALE_RTT_S = 5.0
    link_upload_kinds = frozenset({"screenshot", "proof-of-play"})
    registers = True         # uploads wait for device:registered on each connection
    # A Socket.IO server closes the connection on a message over its buffer limit
    # (1 MB by default in both the Node and the Python server): a bigger screenshot
    # would kill the link on every retry, so it is refused before it is sent.
    MAX_MESSAGE_BYTES = 900_000

    def __init__(self, ctx: ProfileContext):
        self.ctx = ctx
        self.pairing_code = f"{secrets.randbelow(10 ** 6):06d}"  # reused until paired
        self.paired = ctx.token() is not None
        self.clock_offset_ms: float | None = None
        self._sent: dict[int, int] = {}  # client_ms -> seq
        self._cold_start = True
        self._lock = threading.Lock()
        self._paired_seen = False

    def auth(self) -> dict | None:
        return None  # ScreenTinker identifies devices by device:register, not the handshake

    def register_payload(self) -> dict:
        token = self.ctx.token()
        body = ({"device_id": self.ctx.device_id(), "device_token": token} if token
                else {"pairing_code": self.pairing_code})
        facts = self.ctx.facts()
        return {**body, "device_info": facts, "fingerprint": fingerprint(facts),
                "client_type": "edge-agent", "client_version": __version__,
                "platform": f"linux-{platform.machine()}", "contract_version": "v4",
                "capabilities": ["heartbeat-ack", "connectivity-report", "throttle"]}

    def on_connected(self, transport, post: Post) -> None:
        transport.emit("device:register", self.register_payload())

    def handlers(self, post: Post) -> dict:
        def refresh_if_newly_paired():
            # device:paired comes on every reconnect of a paired device too: only the
            # transition unpaired -> paired, once the token is in hand, asks for a
            # refresh register, or answering it would be a storm. The library runs each
            # message on its own thread, so registered and paired may come in any order.
            with self._lock:
                if self._paired_seen and self.ctx.token() and not self.paired:
                    self.paired = True
                    post("emit", "device:register", self.register_payload())

        def registered(_t, data=None, *_):
            if not isinstance(data, dict):
                return post("malformed", "device:registered")
            token, device_id = data.get("device_token"), data.get("device_id")
            if not (isinstance(device_id, str) and 0 < len(device_id) <= 128):
                device_id = None
            if isinstance(token, str) and 16 <= len(token) <= 4096:
                self.ctx.on_token(token, device_id)
                refresh_if_newly_paired()
            if device_id and data.get("status") != "pending" and self.ctx.token():
                post("registered")  # the server knows who we are: uploads may go

        def paired(_t, data=None, *_):
            self._paired_seen = True
            refresh_if_newly_paired()

        def unpaired(_t, data=None, *_):
            settle_s = 0.0
            if isinstance(data, dict):
                for key, scale in (("offline_s", 1.0), ("offline_ms", 0.001),
                                   ("retry_after_ms", 0.001)):
                    value = data.get(key)
                    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                        settle_s = max(0.0, min(float(value) * scale, self.MAX_HOLD_S))
            if self.paired or self.ctx.token():
                self.paired = self._paired_seen = False
                self.pairing_code = f"{secrets.randbelow(10 ** 6):06d}"
                self.ctx.on_unpaired(settle_s)
                post("re-register", settle_s)

        def heartbeat_ack(_t, data=None, *_):
            if not isinstance(data, dict):
                return post("bad-ack", "heartbeat-ack is not an object")
            client_ms, server_ms = data.get("client_ms"), data.get("server_ms")
            seq = self._sent.pop(client_ms, None) if isinstance(client_ms, int) else None
            if seq is None:
                return post("bad-ack", f"heartbeat-ack for unknown client_ms {str(client_ms)[:20]}")
            now_ms = time.time() * 1000
            rtt_ms = now_ms - client_ms
            if isinstance(server_ms, (int, float)) and 0 <= rtt_ms <= self.STALE_RTT_S * 1000:
                # NTP-style: the server's clock at the midpoint of the round trip
                self.clock_offset_ms = server_ms - (client_ms + rtt_ms / 2)
            post("ack", seq, time.monotonic())

        def throttled(_t, data=None, *_):
            ms = data.get("retry_after_ms") if isinstance(data, dict) else None
            if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms):
                return post("malformed", "device:throttled")
            post("throttle", max(1.0, min(ms / 1000.0, self.MAX_HOLD_S)))

        return {"device:registered": registered, "device:paired": paired,
                "device:unpaired": unpaired, "device:auth-error": unpaired,
                "device:heartbeat-ack": heartbeat_ack, "device:throttled": throttled}

    def send_heartbeat(self, transport, seq: int, wall: float, uptime_s: float, post: Post,
                       now: Callable[[], float]) -> None:
        client_ms = int(wall * 1000)
        while client_ms in self._sent:
            client_ms += 1
        self._sent[client_ms] = seq
        if len(self._sent) > 64:
            del self._sent[min(self._sent)]
        transport.emit("device:heartbeat", {"device_id": self.ctx.device_id(), "client_ms": client_ms,
                                            "telemetry": {"uptime_s": round(uptime_s)},
                                            "display_power": "on"})

    def send_report(self, transport, connections: list[dict], offline_s: float | None,
                    wall: float, on_ack: Callable) -> None:
        last = connections[-1] if connections else {}
        transport.emit("device:connectivity-report", {
            "device_id": self.ctx.device_id(),
            "offline_ms": round((offline_s or 0.0) * 1000),
            "link_lost": last.get("ended_reason"),
            "ip_changed": len({c.get("local_addr", "").rsplit(":", 1)[0] for c in connections}) > 1,
            "cold_start": self._cold_start})
        self._cold_start = False
        on_ack({"ok": True})  # ScreenTinker does not ACK reports: sent once is all it gets


    # -- uploads over the link --------------------------------------------------
    def upload_message(self, kind: str, items: list) -> tuple[str, dict] | str:
        """The message carrying queued ``items`` (Item-like: id, payload, created_at),
        or a one-line reason it cannot be carried."""
        if kind == "screenshot":
            item = items[0]
            if len(item.payload) > self.MAX_MESSAGE_BYTES:
                return (f"screenshot of {len(item.payload)} bytes is over the "
                        f"{self.MAX_MESSAGE_BYTES} a Socket.IO message may carry")
            return "device:screenshot", {
                "device_id": self.ctx.device_id(), "upload_id": item.id,
                "taken_ms": round(item.created_at * 1000), "mime": _image_mime(item.payload),
                "image": item.payload}   # a binary attachment, not base64
        if kind == "proof-of-play":
            events = []
            for item in items:
                try:
                    record = json.loads(item.payload)
                except ValueError:
                    record = None
                if not isinstance(record, dict):
                    record = {"record": item.payload.decode("utf-8", "replace")}
                events.append({**record, "upload_id": item.id})
            return "device:play-event", {"device_id": self.ctx.device_id(), "events": events}
        return f"the screentinker profile carries no {kind} uploads"

    @staticmethod
    def upload_answer(args: tuple) -> tuple[set | None, str | None]:
        """A server's answer to an upload message: (ids it names as stored, or None for
        all; a refusal, or None). Anything but an explicit error counts as stored."""
        data = args[0] if args else None
        if isinstance(data, dict):
            error = data.get("error")
            if data.get("ok") is False or (isinstance(error, str) and error):
                return None, str(error or "refused")[:200]
            acked = data.get("acked")
            if isinstance(acked, list):
                return {a for a in acked if isinstance(a, str)}, None
        return None, None


def _image_mime(data: bytes) -> str:
    if data.startswith(b"\x89PNG"):
        return "image/png"
    if data.startswith(b"\xff\xd8"):
        return "image/jpeg"
    return "application/octet-stream"


def fingerprint(facts: dict) -> str:
    from ..identity import device
    basis = f"{device.board_serial()}|{facts.get('model', '')}|{device.machine_id()}"
    return hashlib.sha256(basis.encode()).hexdigest()


PROFILES = {"edge-agent": EdgeAgentProfile, "screentinker": ScreenTinkerProfile}
