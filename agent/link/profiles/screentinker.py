"""ScreenTinker's device protocol ("contract v4") as its servers read it, so an existing
ScreenTinker fleet can adopt the agent (docs/PROTOCOL.md; tested against the real 1.2 and
1.9 servers, tests/test_screentinker_real.py)."""
from __future__ import annotations

import base64
import hashlib
import json
import math
import platform
import secrets
import threading
import time
from typing import Callable

from ... import __version__
from ...base.hardware import machine_id
from ...base.identifiers import new_code
from ...base.identifiers import usable_device_id, usable_token
from ...base.upload_kinds import PROOF_OF_PLAY, SCREENSHOT
from .. import inbox
from ..protocol import REQUEST_COMMAND
from . import screentinker_commands, screentinker_incidents
from .screentinker_commands import CAPABILITIES, NEEDS_MEANS, PLAYER_EVENTS
from .contract import Post, ProfileContext


class ScreenTinkerProfile:
    """ScreenTinker's device protocol, as its server reads it (server/ws/deviceSocket.js
    of github.com/screentinker/screentinker; tested against that server, see
    tests/test_screentinker_real.py and docs/PROTOCOL.md).

    A device registers on /device with a pairing code and gets its id and token at
    once (status ``provisioning``); the operator then claims it on the dashboard
    (``device:paired``, status ``online`` from then on). Uploads wait for the claim.
    The released server ACKs nothing; newer ones answer heartbeats with
    ``device:heartbeat-ack`` and may send ``device:throttled``.
    """
    name = "screentinker"
    supports_events = False  # device:event exists only in newer servers, typed by them
    pairs_in_link = True     # an unclaimed device registers with its pairing code
    # where the operator claims the code, and how long it lasts: the device makes the
    # code and the server sets no deadline on it (1.9 refuses a code whose screen it has
    # not seen for 15 min, server/lib/pair-lockout.js, and deletes a registration still
    # unclaimed a day after it was made; the screen then registers with a new code)
    CLAIM_WHERE = "the ScreenTinker dashboard (Add display)"
    CODE_EXPIRY = "no expiry while this screen stays connected"
    namespace = "/device"
    transports = ["websocket", "polling"]
    MAX_HOLD_S = 300.0
    link_upload_kinds = frozenset({SCREENSHOT, PROOF_OF_PLAY})
    registers = True         # uploads wait for device:registered on each connection
    # The server drops a screenshot whose image_b64 is longer than this, unread.
    MAX_IMAGE_B64 = 2 * 1024 * 1024
    PLAY_EVENTS = ("play_start", "play_end")
    # 1.9 stores at most one play_start per device every 2 s and drops the rest without a
    # word (server/ws/deviceSocket.js, PLAY_LOG_MIN_GAP_MS): queued plays go out at
    # least this far apart, a margin over 2 s for the link's own jitter
    PLAY_START_GAP_S = 2.5
    # what 1.9 relays of a shell result to the dashboard (deviceSocket.js slices it so)
    SHELL_CMD_SHOWN = 500
    NOT_RUN = -1       # the exit of a line that never ran, as 1.9's players tell it
    SHELL_LINES = 64   # the lines of shell commands still awaiting their result, at most

    _command = staticmethod(screentinker_commands.command)

    def __init__(self, ctx: ProfileContext):
        self.ctx = ctx
        self.pairing_code = ctx.pairing_code() or new_code()
        self._sent: dict[int, int] = {}  # client_ms -> seq
        self._boot_unreported = ctx.cold_start
        self._network_returned = False
        self._lock = threading.Lock()
        self._registered_with_token = False
        self._shell_lines: dict[str, str] = {}   # command id -> its line, for its result

    @property
    def paired(self) -> bool:
        """Claimed by an operator: what the server says once it answers status online."""
        return self.ctx.token() is not None and self.ctx.claimed()

    def auth(self) -> dict | None:
        return None  # ScreenTinker identifies devices by device:register, not the handshake

    def register_payload(self) -> dict:
        token = self.ctx.token()
        body = ({"device_id": self.ctx.device_id(), "device_token": token} if token
                else {"pairing_code": self.pairing_code})
        facts = self.ctx.facts()
        return {**body, "device_info": device_info(facts), "fingerprint": fingerprint(facts),
                "client_type": "edge-agent", "client_version": __version__,
                "platform": f"linux-{platform.machine()}", "contract_version": "v4",
                "capabilities": self.capabilities()}

    def capabilities(self) -> list[str]:
        """Exactly what the allowed commands can do here: a capability declared for a
        command this screen refuses, or has no means for (no backlight, no sound
        server), would offer the operator a button that fails."""
        means = self.ctx.means() if self.ctx.means is not None else None
        return sorted({cap for name, cap in CAPABILITIES.items()
                       if name in self.ctx.allowed_commands
                       and (means is None or name not in NEEDS_MEANS or name in means)})

    def network_returned(self) -> None:
        """The device's own network (a link with carrier) came back after being down: the
        outage the next report covers was, at least partly, a lost link (any thread)."""
        self._network_returned = True

    def on_connected(self, transport, post: Post) -> None:
        self._registered_with_token = self.ctx.token() is not None
        transport.emit("device:register", self.register_payload())

    def forget_pairing(self) -> None:
        """Credentials dropped (unpair, or the server no longer knows us): a new code."""
        self.pairing_code = new_code()

    def handlers(self, post: Post) -> dict:
        def registered(_t, data=None, *_):
            if not isinstance(data, dict):
                return post(inbox.Malformed("device:registered"))
            token, device_id, status = (data.get("device_token"), data.get("device_id"),
                                        data.get("status"))
            if not usable_device_id(device_id):
                return post(inbox.Malformed("device:registered (device_id)"))
            if not usable_token(token):   # never kept: it would go into a header some day
                return post(inbox.Malformed("device:registered (device_token)"))
            with self._lock:
                if token != self.ctx.token() or device_id != self.ctx.device_id():
                    self.ctx.on_token(token, device_id, self.pairing_code)
                if status == "online" and not self.ctx.claimed():
                    self.ctx.on_claimed("")
            if self.paired:
                post(inbox.Registered())  # claimed, and the server knows who we are: uploads go
            cold, self._boot_unreported = self._boot_unreported, False
            if cold and status == "online" and self._registered_with_token:
                # a screen the server knew is back from a boot: the gap in its log was a
                # reboot (only the first registration of a boot's first process says so)
                post(inbox.Emit("device:connectivity-report",
                                self._report([], None, link_lost=False, cold_start=True)))

        def paired(_t, data=None, *_):
            name = data.get("name") if isinstance(data, dict) else None
            with self._lock:
                newly = not self.ctx.claimed()
                self.ctx.on_claimed(name if isinstance(name, str) else "")
            if newly and self.ctx.token():
                # register again with the token: the server then links this device's
                # fingerprint to its row, so a later re-registration finds it again
                post(inbox.Emit("device:register", self.register_payload()))
            if self.paired:
                post(inbox.Registered())

        def unpaired(_t, data=None, *_):
            # the server no longer has this device (deleted on the dashboard)
            self._drop("the server no longer knows this device", data, post)

        def auth_error(_t, data=None, *_):
            error = data.get("error") if isinstance(data, dict) else None
            why = f"the server refused {'the token' if self._registered_with_token else 'the registration'}" \
                  + (f": {str(error)[:120]}" if error else "")
            self._drop(why, data, post)

        def heartbeat_ack(_t, data=None, *_):
            if not isinstance(data, dict):
                return post(inbox.BadAck("heartbeat-ack is not an object"))
            client_ms = data.get("client_ms")
            seq = self._sent.pop(client_ms, None) if isinstance(client_ms, int) else None
            if seq is None:
                return post(inbox.BadAck(f"heartbeat-ack for unknown client_ms {str(client_ms)[:20]}"))
            post(inbox.HeartbeatAcked(seq, time.monotonic()))

        def throttled(_t, data=None, *_):
            ms = data.get("retry_after_ms") if isinstance(data, dict) else None
            if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms):
                return post(inbox.Malformed("device:throttled"))
            post(inbox.Throttled(max(1.0, min(ms / 1000.0, self.MAX_HOLD_S))))

        def command(_t, data=None, *_):
            kind = data.get("type") if isinstance(data, dict) else None
            name, args = self._command(kind, data.get("payload") if kind else None)
            # no command ids on this protocol: each message is one request
            cid = "st-" + secrets.token_hex(6)
            if name == "shell":
                self._remember_line(cid, args.get("cmd"))
            post(inbox.Request(REQUEST_COMMAND, {"id": cid, "name": name, "args": args},
                               "device:command"))

        def screenshot_request(_t, data=None, *_):
            post(inbox.Request(REQUEST_COMMAND, {"id": "st-" + secrets.token_hex(6),
                                                 "name": "screenshot", "args": {}},
                               "device:screenshot-request"))

        handlers = {"device:registered": registered, "device:paired": paired,
                    "device:unpaired": unpaired, "device:auth-error": auth_error,
                    "device:heartbeat-ack": heartbeat_ack, "device:throttled": throttled,
                    "device:command": command, "device:screenshot-request": screenshot_request}
        for event in PLAYER_EVENTS:
            handlers[event] = lambda *_: None
        return handlers

    def command_result(self, result: dict) -> tuple[str, dict, bool]:
        """No result channel on this protocol: a device:log line, which newer servers
        show on the dashboard (the released one ignores it); the journal and `edge-agent
        status` have it too. A shell line's result is 1.9's own device:shell-result,
        which it relays to the dashboard's terminal (``exit`` -1: it never ran, and the
        output says why)."""
        if result["name"] == "shell":
            with self._lock:
                cmd = self._shell_lines.pop(result["id"], "")
            exit_status = result.get("exit")
            if isinstance(exit_status, bool) or not isinstance(exit_status, int):
                exit_status = self.NOT_RUN
            output = result.get("output") or ""
            if exit_status == self.NOT_RUN:
                output = result.get("error") or output
            return "device:shell-result", {"device_id": self.ctx.device_id(), "cmd": cmd,
                                           "output": output, "exit": exit_status}, False
        text = result.get("output") if result["ok"] else result.get("error")
        return "device:log", {"device_id": self.ctx.device_id(), "tag": "edge-agent",
                              "level": "i" if result["ok"] else "w",
                              "message": f"edge-agent {result['name']}: "
                                         f"{'ok' if result['ok'] else 'error'}: {text or ''}"[:2000]}, False

    def declaration(self) -> tuple[str, dict] | None:
        """A registration again, with the token: 1.9 stores the capabilities it declares
        (and answers as at any registration); before the claim, nothing to declare."""
        if self.ctx.token() is None or not self.ctx.claimed():
            return None
        return "device:register", self.register_payload()

    def _remember_line(self, cid: str, cmd) -> None:
        """The line a shell result answers: the result names its command by id only."""
        with self._lock:
            self._shell_lines[cid] = cmd[:self.SHELL_CMD_SHOWN] if isinstance(cmd, str) else ""
            while len(self._shell_lines) > self.SHELL_LINES:
                del self._shell_lines[next(iter(self._shell_lines))]

    def incident(self, event: dict) -> tuple[str, dict] | None:
        """1.9's incident feed (screentinker_incidents.py); 1.2 drops it unread."""
        payload = screentinker_incidents.incident(event)
        return None if payload is None else (
            "device:event", {"device_id": self.ctx.device_id(), **payload})

    def _drop(self, why: str, data, post: Post) -> None:
        settle_s = 0.0
        if isinstance(data, dict):
            for key, scale in (("offline_s", 1.0), ("offline_ms", 0.001),
                               ("retry_after_ms", 0.001)):
                value = data.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    settle_s = max(0.0, min(float(value) * scale, self.MAX_HOLD_S))
        with self._lock:
            self.forget_pairing()
            self.ctx.on_unpaired()
        post(inbox.Unpaired(settle_s, why))

    def send_heartbeat(self, transport, seq: int, wall: float, uptime_s: float, post: Post,
                       now: Callable[[], float]) -> None:
        client_ms = int(wall * 1000)
        while client_ms in self._sent:
            client_ms += 1
        self._sent[client_ms] = seq
        if len(self._sent) > 64:
            del self._sent[min(self._sent)]
        transport.emit("device:heartbeat", {"device_id": self.ctx.device_id(), "client_ms": client_ms,
                                            "telemetry": heartbeat_telemetry(self.ctx.telemetry())})

    def send_report(self, transport, connections: list[dict], offline_s: float | None,
                    wall: float, on_ack: Callable) -> None:
        """After a reconnect: why this process was offline. The server files it by
        ``cold_start === true`` (a reboot), then ``link_lost === true`` (the device's own
        link), else the network beyond it; a reconnect is never a boot."""
        link_lost, self._network_returned = self._network_returned, False
        transport.emit("device:connectivity-report", self._report(
            connections, offline_s, link_lost=link_lost, cold_start=False))
        on_ack({"ok": True})  # ScreenTinker does not ACK reports: sent once is all it gets

    def _report(self, connections: list[dict], offline_s: float | None, *, link_lost: bool,
                cold_start: bool) -> dict:
        return {"device_id": self.ctx.device_id(),
                "offline_ms": round((offline_s or 0.0) * 1000),
                "link_lost": link_lost,
                "ip_changed": len({c.get("local_addr", "").rsplit(":", 1)[0]
                                   for c in connections}) > 1,
                "cold_start": cold_start}

    # -- uploads over the link --------------------------------------------------
    @staticmethod
    def enqueue_problem(kind: str, payload: bytes) -> str | None:
        """Why the server would drop this upload unread, checked before it is queued."""
        if kind == SCREENSHOT:
            return screenshot_problem(payload)
        if kind == PROOF_OF_PLAY:
            return play_record(payload)[1]
        return None

    def upload_gap_s(self, event: str, payload: dict) -> float:
        """How long this upload message must follow the previous one of its kind, for
        the server to keep it."""
        if event == "device:play-event" and payload.get("event") == "play_start":
            return self.PLAY_START_GAP_S
        return 0.0

    def upload_message(self, item) -> tuple[str, dict] | str:
        """The message carrying a queued item (Item-like: id, kind, payload) as the
        server reads it, or a one-line reason the server would drop it unread (then
        it is never sent)."""
        if item.kind == SCREENSHOT:
            reason = screenshot_problem(item.payload)
            if reason:
                return reason
            return "device:screenshot", {"device_id": self.ctx.device_id(),
                                         "image_b64": base64.b64encode(item.payload).decode("ascii")}
        if item.kind == PROOF_OF_PLAY:
            record, reason = play_record(item.payload)
            if reason:
                return reason
            return "device:play-event", {"device_id": self.ctx.device_id(), **record}
        return f"the screentinker profile carries no {item.kind} uploads"


def screenshot_problem(data: bytes) -> str | None:
    """Why the server would drop this screenshot unread, or None."""
    if _image_mime(data) not in ("image/jpeg", "image/png"):
        return "a screenshot must be a JPEG or PNG image"
    encoded = 4 * ((len(data) + 2) // 3)
    if encoded > ScreenTinkerProfile.MAX_IMAGE_B64:
        return (f"screenshot of {len(data)} bytes is {encoded} in base64, over the "
                f"{ScreenTinkerProfile.MAX_IMAGE_B64} the server accepts")
    return None


PLAY_FIELDS: dict[str, type | tuple[type, ...]] = {"event": str, "content_id": str, "content_name": str, "zone_id": str,
               "completed": bool, "duration_sec": (int, float)}


def play_record(payload: bytes) -> tuple[dict, str | None]:
    """A proof-of-play record as ScreenTinker's device:play-event reads it:
    ``{"event": "play_start"|"play_end", "content_id": ..., "content_name": ...,
    "zone_id": ..., "completed": ..., "duration_sec": ...}``. Returns it (known fields
    only), or the reason the server would not store it, naming the field."""
    try:
        record = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return {}, "not a JSON object"
    if not isinstance(record, dict):
        return {}, "not a JSON object"
    if record.get("event") not in ScreenTinkerProfile.PLAY_EVENTS:
        return {}, "event: must be play_start or play_end"
    out = {}
    for key, typ in PLAY_FIELDS.items():
        value = record.get(key)
        if value is None:
            continue
        if isinstance(value, bool) and typ is not bool or not isinstance(value, typ):
            return {}, f"{key}: wrong type"
        if isinstance(value, str) and len(value) > 256:
            return {}, f"{key}: longer than 256 characters"
        out[key] = value
    if out["event"] == "play_end" and not out.get("content_id"):
        return {}, "content_id: play_end needs the content_id its play_start named"
    return out, None


# ScreenTinker's device_telemetry columns, from the agent's own sample
# (1.9 added the address, the display's name and its mode; 1.2 ignores those)
TELEMETRY_NAMES = {"uptime_s": "uptime_seconds", "cpu_percent": "cpu_usage",
                   "mem_available_mb": "ram_free_mb", "mem_total_mb": "ram_total_mb",
                   "disk_free_mb": "storage_free_mb", "disk_total_mb": "storage_total_mb",
                   "ipv4": "local_ip", "ipv6": "local_ip6", "display_name": "attached_display",
                   "display_mode": "video_mode", "wifi_ssid": "wifi_ssid",
                   "wifi_signal_dbm": "wifi_rssi"}


def heartbeat_telemetry(sample: dict) -> dict:
    return {theirs: sample[ours] for ours, theirs in TELEMETRY_NAMES.items() if ours in sample}


def device_info(facts: dict) -> dict:
    """What ScreenTinker's devices table and dashboard read (its columns are named for
    Android players: ``android_version`` carries the OS)."""
    info = {"android_version": facts.get("os"), "app_version": f"edge-agent {__version__}",
            "hardware_model": facts.get("model")}
    width, height = facts.get("screen_width"), facts.get("screen_height")
    if width and height:
        info["screen_width"], info["screen_height"] = width, height
    return info


def _image_mime(data: bytes) -> str:
    if data.startswith(b"\x89PNG"):
        return "image/png"
    if data.startswith(b"\xff\xd8"):
        return "image/jpeg"
    return "application/octet-stream"


def fingerprint(facts: dict) -> str:
    # the board's serial as the facts read it (a card copied to another board is told
    # apart: identity/board.py), the model, the OS's machine id
    basis = f"{facts.get('serial', '')}|{facts.get('model', '')}|{machine_id()}"
    return hashlib.sha256(basis.encode()).hexdigest()

