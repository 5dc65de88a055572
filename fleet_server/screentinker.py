"""An emulation of ScreenTinker's device protocol, server side, for fast tests.

It follows what the real server (server/ws/deviceSocket.js of
github.com/screentinker/screentinker, run by tests/test_screentinker_real.py) does
with each message, and accepts nothing it would not: a device registers on /device
with a pairing code and gets an id and a token at once (status ``provisioning``);
the operator's pairing claims it (``device:paired``); a later register with the
token answers status ``online``; an unknown device id gets ``device:unpaired``, a
wrong token ``device:auth-error``; the fingerprint of a known screen relinks it to
its row. ``device:play-event`` is one record (``play_start`` / ``play_end``, content
ids the server knows); ``device:screenshot`` carries ``image_b64`` of at most 2 MiB;
neither is ever ACKed. What the newer contract (1.9) adds is switchable: heartbeats
are answered with ``device:heartbeat-ack``, a dashboard command goes only to a screen
that declared its capability (at a register with its token), and at most one
play_start per device is stored every 2 s, unless ``--ack-mode none`` (1.2); and
``/admin/throttle`` sends ``device:throttled``. Where the generations differ in what
they accept, the emulation accepts only what both do (a fingerprint relinks only a
claimed row, never one live on another connection).
It is ours, not ScreenTinker's code.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
import time
import uuid

NS = "/device"
MAX_IMAGE_B64 = 2 * 1024 * 1024
# 1.9's capability vocabulary (server/lib/player-capabilities.js); a declared name outside
# it is dropped, and a dashboard command goes only to a device that declared its need.
VOCABULARY = frozenset({
    "playback.video", "playback.image", "playback.widget", "playback.youtube", "playback.zones",
    "playback.transitions", "playback.pip", "audio.mute", "audio.volume", "display.rotation",
    "display.power", "display.resolution", "display.brightness", "remote.screenshot",
    "remote.stream", "remote.input", "system.reboot", "system.restart_player",
    "system.self_update", "system.kiosk", "system.brightness", "system.screen_timeout",
    "system.install_apk", "system.shell", "system.time", "system.device_owner", "sync.clock",
    "sync.native", "offline.cache"})
NEEDS = {"reboot": "system.reboot", "shutdown": "system.reboot", "screen_on": "display.power",
         "screen_off": "display.power", "launch": "system.restart_player",
         "refresh": "system.restart_player", "screenshot": "remote.screenshot",
         "set_volume": "audio.volume", "set_brightness": "display.brightness",
         "shell": "system.shell", "set_time": "system.time", "set_timezone": "system.time"}
# what 1.9 relays of a device:shell-result to the dashboard (deviceSocket.js)
SHELL_CMD_CHARS, SHELL_OUTPUT_CHARS = 500, 8000
PLAY_LOG_MIN_GAP_S = 2.0  # 1.9 stores at most one play_start per device in this window


def parse_declared(raw) -> list[str] | None:
    """What 1.9 keeps of a declaration: None (absent or malformed) or the known names."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return None
    if not isinstance(raw, list):
        return None
    return [c for c in raw if isinstance(c, str) and c in VOCABULARY]


class State:
    def __init__(self):
        self.rows: dict[str, dict] = {}          # device id -> the devices table row
        self.fingerprints: dict[str, str | None] = {}  # fingerprint -> device id
        self.registers: dict[str, int] = {}      # device id or pairing code -> count
        self.content: set[str] = set()           # content ids the server has
        self.play_logs: list[dict] = []
        self.screenshots: dict[str, str] = {}    # device id -> sha256 of the latest image
        self.telemetry: list[dict] = []
        self.sessions: dict[str, str] = {}       # sid -> authenticated device id
        self.last_play_start: dict[str, float] = {}  # device id -> monotonic, stored
        self.shell_results: list[dict] = []      # what the dashboard's terminal was told

    def view(self) -> dict:
        return {"devices": self.rows, "play_logs": self.play_logs,
                "screenshots": self.screenshots, "telemetry": self.telemetry[-50:],
                "registers": self.registers, "shell_results": self.shell_results[-50:],
                "pending": sorted(r["pairing_code"] for r in self.rows.values() if r["pairing_code"])}


def attach(server) -> None:
    sio = server.sio
    st = server.st = State()

    async def version(_request):
        # what both generations answer (server.js, app.get('/api/version')): how an agent
        # left at [server] profile = "auto" knows a ScreenTinker server
        from aiohttp import web
        return web.json_response({"hash": "emulated", "version": "1.9-emulated"})
    server.app.router.add_get("/api/version", version)
    for device_id, token in server.tokens.items():  # --device ID:TOKEN: already claimed
        st.rows[device_id] = {"id": device_id, "token": token, "pairing_code": None,
                              "status": "offline", "user": "operator", "name": device_id,
                              "device_info": None, "sid": None, "capabilities": None}

    def session(sid, data) -> str | None:
        """The device this socket registered as, if ``data`` names it (requireDeviceAuth)."""
        device_id = st.sessions.get(sid)
        if device_id is None:
            return None
        if isinstance(data, dict) and data.get("device_id") not in (None, device_id):
            return None
        return device_id

    async def authenticated(sid, device_id: str, status: str, token: str):
        st.sessions[sid] = device_id
        server.attach_device(sid, device_id)
        await sio.emit("device:registered", {"device_id": device_id, "device_token": token,
                                             "status": status}, to=sid, namespace=NS)

    @sio.on("connect", namespace=NS)
    async def connect(sid, environ, auth=None):
        request = environ.get("aiohttp.request")
        if request is not None:
            server.transports[sid] = request.transport

    @sio.on("disconnect", namespace=NS)
    async def disconnect(sid, *args):
        st.sessions.pop(sid, None)
        device_id = server.by_sid.pop(sid, None)
        server.transports.pop(sid, None)
        if device_id and device_id in server.devices:
            dev = server.devices[device_id]
            dev.sids.discard(sid)
            dev.online = bool(dev.sids)

    @sio.on("device:register", namespace=NS)
    async def register(sid, data=None):
        if not isinstance(data, dict):
            return
        device_id, token, code = data.get("device_id"), data.get("device_token"), data.get("pairing_code")
        fingerprint = data.get("fingerprint")
        key = device_id or code
        if key:
            st.registers[str(key)] = st.registers.get(str(key), 0) + 1
        known = st.rows.get(st.fingerprints.get(fingerprint)) if fingerprint else None
        if known is not None and not device_id and code and (
                known["user"] or known["pairing_code"] == str(code)):
            # a known screen registering afresh: linked back to its row with a new token,
            # if an operator claimed it (or it shows the same code), and never while that
            # row is live on another connection (1.9; 1.2 relinked any row)
            if any(d == known["id"] for d in st.sessions.values()):
                await sio.emit("device:auth-error", {
                    "error": "This display is currently active on another connection."},
                    to=sid, namespace=NS)
                return
            known["token"] = secrets.token_hex(32)
            await authenticated(sid, known["id"], "online", known["token"])
            if known["user"]:
                await sio.emit("device:paired", {"name": known["name"]}, to=sid, namespace=NS)
            return
        if fingerprint and (device_id or code):
            st.fingerprints.setdefault(fingerprint, device_id)
            if device_id and st.fingerprints[fingerprint] is None:
                st.fingerprints[fingerprint] = device_id
        if device_id:
            row = st.rows.get(device_id)
            if row is None:
                await sio.emit("device:unpaired", {"reason": "not_found"}, to=sid, namespace=NS)
                return
            if row["token"] != token:
                await sio.emit("device:auth-error", {"error": "Invalid device token"},
                               to=sid, namespace=NS)
                return
            if fingerprint:
                st.fingerprints[fingerprint] = device_id
            declared = parse_declared(data.get("capabilities"))
            if declared is not None:  # only here, as 1.9 does: not at a register by code
                row["capabilities"] = declared
            await authenticated(sid, device_id, "online", row["token"])
            return
        if code:
            if any(r["pairing_code"] == str(code) for r in st.rows.values()):
                # UNIQUE(devices.pairing_code): 1.9 answers so, 1.2's insert throws
                await sio.emit("device:auth-error", {"error": "Registration failed, please retry."},
                               to=sid, namespace=NS)
                return
            row = {"id": str(uuid.uuid4()), "token": secrets.token_hex(32),
                   "pairing_code": str(code), "status": "provisioning", "user": None,
                   "name": None, "device_info": data.get("device_info"), "sid": sid,
                   "capabilities": None}
            st.rows[row["id"]] = row
            if fingerprint:
                st.fingerprints[fingerprint] = row["id"]
            await authenticated(sid, row["id"], "provisioning", row["token"])

    @sio.on("device:heartbeat", namespace=NS)
    async def heartbeat(sid, data=None):
        device_id = session(sid, data)
        if device_id is None or not isinstance(data, dict) or data.get("device_id") != device_id:
            return
        dev = server.devices[device_id]
        dev.heartbeats += 1
        dev.last_heartbeat = time.monotonic()
        st.rows[device_id]["status"] = "online"
        if isinstance(data.get("telemetry"), dict):
            st.telemetry.append({"device_id": device_id, **data["telemetry"]})
        if sid not in dev._sids_heard:
            dev._sids_heard.add(sid)
            dev.first_heartbeat_times.append(round(time.time(), 3))
        if server.behaviour.ack_mode == "none":
            return  # the released server: no heartbeat-ack at all
        await sio.emit("device:heartbeat-ack", {"server_ms": int(time.time() * 1000),
                                                "client_ms": data.get("client_ms")},
                       to=sid, namespace=NS)

    @sio.on("device:connectivity-report", namespace=NS)
    async def connectivity(sid, data=None):
        device_id = session(sid, data)
        if device_id is not None and isinstance(data, dict):
            server.devices[device_id].reports.append(data)

    @sio.on("device:screenshot", namespace=NS)
    async def screenshot(sid, data=None):
        device_id = session(sid, data)
        image = data.get("image_b64") if isinstance(data, dict) else None
        if device_id is None or data.get("device_id") != device_id or not isinstance(image, str) \
                or not image or len(image) > MAX_IMAGE_B64:
            return  # the real server returns without a word, and so do we
        try:
            raw = base64.b64decode(image, validate=True)
        except binascii.Error:
            return
        dev = server.devices[device_id]
        dev.upload_requests.append(round(time.time(), 3))
        st.screenshots[device_id] = hashlib.sha256(raw).hexdigest()

    @sio.on("device:shell-result", namespace=NS)
    async def shell_result(sid, data=None):
        # 1.9 relays it to the dashboard as dashboard:shell-result, as strings cut short
        device_id = session(sid, data)
        if device_id is None or not isinstance(data, dict) or data.get("device_id") != device_id:
            return
        st.shell_results.append({"device_id": device_id,
                                 "cmd": str(data.get("cmd") or "")[:SHELL_CMD_CHARS],
                                 "output": str(data.get("output") or "")[:SHELL_OUTPUT_CHARS],
                                 "exit": data.get("exit")})
        del st.shell_results[:-50]

    @sio.on("device:play-event", namespace=NS)
    async def play_event(sid, data=None):
        device_id = session(sid, data)
        if device_id is None or not isinstance(data, dict) or data.get("device_id") != device_id:
            return
        content_id = data.get("content_id") or None
        server.devices[device_id].upload_requests.append(round(time.time(), 3))
        if data.get("event") == "play_start":
            if content_id is not None and content_id not in st.content:
                return  # a foreign key the real server's sqlite refuses
            last = st.last_play_start.get(device_id, -PLAY_LOG_MIN_GAP_S)
            if server.behaviour.ack_mode != "none" and time.monotonic() - last < PLAY_LOG_MIN_GAP_S:
                return  # 1.9's flood guard: no row, and no word to the device
            st.last_play_start[device_id] = time.monotonic()
            st.play_logs.append({"device_id": device_id, "content_id": content_id,
                                 "content_name": data.get("content_name") or "Unknown",
                                 "started_at": time.time(), "ended_at": None, "completed": None})
        elif data.get("event") == "play_end":
            for log in reversed(st.play_logs):
                if (log["device_id"] == device_id and log["content_id"] == content_id
                        and content_id is not None and log["ended_at"] is None):
                    log["ended_at"], log["completed"] = time.time(), bool(data.get("completed"))
                    break


async def pair(server, code: str, name: str = "Display") -> str | None:
    """The operator claims the screen showing ``code``; it hears device:paired if online."""
    st = server.st
    row = next((r for r in st.rows.values() if r["pairing_code"] == code), None)
    if row is None:
        return None
    row.update(pairing_code=None, user="operator", status="online", name=name)
    for sid, device_id in list(st.sessions.items()):
        if device_id == row["id"]:
            await server.sio.emit("device:paired", {"device_id": row["id"], "name": name},
                                  to=sid, namespace=NS)
    return row["id"]


async def dashboard_command(server, device_id, command: str, payload: dict | None = None) -> dict:
    """A dashboard button: a device:command (or a screenshot request) to the screen's
    sockets, with 1.9's answer to the dashboard. 1.9 (the emulation's default) refuses
    a command whose capability the screen did not declare; 1.2 (``--ack-mode none``)
    sends everything. ``payload``: what the button sends with it (the volume and
    brightness sliders: ``{"level": percent / 100}``)."""
    row = server.st.rows.get(device_id)
    need = NEEDS.get(command)
    declared = (row or {}).get("capabilities") or []
    if server.behaviour.ack_mode != "none" and need and need not in declared:
        return {"delivered": False, "reason": "unsupported", "capability": need}
    sids = [sid for sid, dev in server.st.sessions.items() if dev == device_id]
    for sid in sids:
        if command == "screenshot":
            await server.sio.emit("device:screenshot-request", {}, to=sid, namespace=NS)
        else:
            await server.sio.emit("device:command", {"type": command, "payload": payload or {}},
                                  to=sid, namespace=NS)
    return {"delivered": bool(sids)}


async def delete(server, device_id: str) -> bool:
    """The operator deletes the screen on the dashboard: nothing is said to it; its
    next register with the token gets device:unpaired."""
    return server.st.rows.pop(device_id, None) is not None
