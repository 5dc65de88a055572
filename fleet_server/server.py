"""Reference fleet server (python-socketio on aiohttp).

It implements the server side of docs/PROTOCOL.md and behaves the way the field
reports say a fleet server should: SO_KEEPALIVE on every accepted socket, and when
it marks a device offline it also closes that device's socket, so "offline" and
"connected" never disagree. Identity, never the source address, keys everything:
a whole site behind one SNAT address is normal.

Admin endpoints (loopback, for the demo and tests) expose what it saw and let a test
bend its behaviour: slow ACKs, no ACKs, a slow namespace CONNECT, throttling.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import secrets
import socket
import time
from dataclasses import dataclass, field

import socketio
from aiohttp import web

log = logging.getLogger("fleet_server")

MAX_PAYLOAD_BYTES = 64 * 1024
MAX_UPLOAD_BYTES = 32 * 1024 * 1024


@dataclass
class Behaviour:
    ack_mode: str = "ok"         # ok | none (an old server) | wrong-seq | garbage
    ack_delay_s: float = 0.0     # answer them this late
    connect_delay_s: float = 0.0 # accept the namespace CONNECT this late
    heartbeat_timeout_s: float = 45.0
    code_ttl_s: float = 600.0    # pairing codes expire
    flap_limit: int = 20         # connects per identity per window before the limiter acts
    flap_window_s: float = 60.0
    throttle_s: float = 30.0     # known devices: a soft server:throttle
    quarantine_s: float = 1800.0 # unknown identities: refused outright
    pair_limit: int = 5          # pairing attempts per operator per minute
    upload_mode: str = "ok"      # ok | 500 | 429 | 413 | hang
    retry_after_s: float = 120.0 # with 429
    result_ack: str = "ok"       # ok | none: confirmations of command results lost


@dataclass
class Device:
    device_id: str
    sids: set = field(default_factory=set)
    online: bool = False
    connects: int = 0
    refused: int = 0
    max_concurrent: int = 0
    ghosts_closed: int = 0
    heartbeats: int = 0
    last_seq: int | None = None
    last_heartbeat: float | None = None   # monotonic
    reports: list = field(default_factory=list)
    events: list = field(default_factory=list)
    connect_times: list = field(default_factory=list)  # wall time of each accepted connect
    uploads: dict = field(default_factory=dict)        # idempotency key -> (kind, sha256)
    upload_repeats: int = 0
    upload_requests: list = field(default_factory=list)  # wall time of each upload request
    first_heartbeat_times: list = field(default_factory=list)  # wall, per connection
    commands: dict = field(default_factory=dict)       # command id -> its record
    log_bundles: dict = field(default_factory=dict)    # upload id -> bytes (kind log, last 20)
    heartbeat_times: list = field(default_factory=list)  # wall, the last 200 heartbeats
    seqs: set = field(default_factory=set)               # distinct heartbeat seqs received
    _sids_heard: set = field(default_factory=set)

    def view(self, now: float) -> dict:
        return {
            "online": self.online, "sockets": len(self.sids), "connects": self.connects,
            "refused": self.refused, "max_concurrent": self.max_concurrent,
            "ghosts_closed": self.ghosts_closed, "heartbeats": self.heartbeats,
            "last_seq": self.last_seq,
            "last_heartbeat_age_s": (round(now - self.last_heartbeat, 3)
                                     if self.last_heartbeat is not None else None),
            "reports": self.reports[-50:], "events": self.events[-50:],
            "connect_times": self.connect_times[-50:],
            "first_heartbeat_times": self.first_heartbeat_times[-50:],
            "heartbeat_times": self.heartbeat_times[-200:], "seqs_received": len(self.seqs),
            "uploads": len(self.uploads), "upload_repeats": self.upload_repeats,
            "upload_requests": self.upload_requests[-200:],
        }


class FleetServer:
    def __init__(self, tokens: dict[str, str] | None = None, accept_any: bool = False,
                 ping_interval: float = 25, ping_timeout: float = 20,
                 behaviour: Behaviour | None = None, profile: str = "edge-agent"):
        self.tokens = dict(tokens or {})
        self.accept_any = accept_any
        self.behaviour = behaviour or Behaviour()
        self.devices: dict[str, Device] = {}
        self.by_sid: dict[str, str] = {}
        self.transports: dict[str, asyncio.BaseTransport] = {}
        self.enrollments: dict[str, dict] = {}   # device_id -> pending enrollment
        self.codes: dict[str, str] = {}          # pairing code -> device_id
        self._connects: dict[str, list] = {}     # identity -> recent connect times
        self._quarantined: dict[str, float] = {} # identity -> until (monotonic)
        self._pair_attempts: dict[str, list] = {}
        self.throttled: dict[str, int] = {}      # identity -> soft throttles sent
        self.sio = socketio.AsyncServer(async_mode="aiohttp", ping_interval=ping_interval,
                                        ping_timeout=ping_timeout,
                                        max_http_buffer_size=MAX_PAYLOAD_BYTES,
                                        cors_allowed_origins=[])
        self.app = web.Application(client_max_size=MAX_UPLOAD_BYTES)
        self.sio.attach(self.app)
        self._routes()
        self._handlers()
        self.app.on_startup.append(self._start_reaper)
        self.profile = profile
        if profile == "screentinker":
            from . import screentinker
            screentinker.attach(self)

    # -- socket.io --------------------------------------------------------------
    def _handlers(self) -> None:
        sio = self.sio

        @sio.event
        async def connect(sid, environ, auth=None):
            claimed = auth.get("device_id") if isinstance(auth, dict) else None
            identity = claimed if isinstance(claimed, str) and claimed else "anonymous"
            now = time.monotonic()
            if self._quarantined.get(identity, 0) > now:
                raise socketio.exceptions.ConnectionRefusedError("quarantined")
            flapping = self._flapping(identity, now)
            try:
                device_id = self._authenticate(auth)
            except socketio.exceptions.ConnectionRefusedError:
                if flapping:  # an unknown identity that flaps is shut out for a while
                    self._quarantined[identity] = now + self.behaviour.quarantine_s
                    log.info("quarantining identity %s: flapping with bad credentials", identity)
                raise
            if self.behaviour.connect_delay_s:
                await asyncio.sleep(self.behaviour.connect_delay_s)
            request = environ.get("aiohttp.request")
            transport = request.transport if request is not None else None
            if transport is not None:
                sock = transport.get_extra_info("socket")
                if sock is not None:
                    # The server must notice dead peers by itself too.
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 30)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 10)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
                self.transports[sid] = transport
            self.attach_device(sid, device_id)
            # commands the device never confirmed receiving go again; it runs each id once
            for record in self.devices[device_id].commands.values():
                if not record["received"] and record["result"] is None:
                    asyncio.get_running_loop().create_task(self._send_command(sid, record))
            if flapping:
                # a paired device is never quarantined: it is asked, softly, to slow down
                self.throttled[device_id] = self.throttled.get(device_id, 0) + 1
                asyncio.get_running_loop().create_task(self.sio.emit(
                    "server:throttle", {"retry_after_s": self.behaviour.throttle_s}, to=sid))

        @sio.event
        async def disconnect(sid, *args):
            device_id = self.by_sid.pop(sid, None)
            self.transports.pop(sid, None)
            if device_id is None:
                return
            dev = self.devices[device_id]
            dev.sids.discard(sid)
            if not dev.sids:
                dev.online = False
            log.info("device %s disconnected (sid %s)", device_id, sid)

        @sio.on("device:heartbeat")
        async def heartbeat(sid, data=None):
            dev = self._device(sid)
            if dev is None or not isinstance(data, dict):
                return None
            seq = data.get("seq")
            if isinstance(seq, bool) or not isinstance(seq, int):
                return None
            dev.heartbeats += 1
            dev.last_seq = seq
            dev.heartbeat_times.append(round(time.time(), 3))
            del dev.heartbeat_times[:-200]
            if len(dev.seqs) < 100_000:
                dev.seqs.add(seq)
            if sid not in dev._sids_heard:
                dev._sids_heard.add(sid)
                dev.first_heartbeat_times.append(round(time.time(), 3))
                if len(dev._sids_heard) > 1000:
                    dev._sids_heard.clear()
            dev.last_heartbeat = time.monotonic()
            dev.online = True
            mode = self.behaviour.ack_mode
            if self.behaviour.ack_delay_s:
                await asyncio.sleep(self.behaviour.ack_delay_s)
            if mode == "none":
                return None
            if mode == "wrong-seq":
                return {"seq": seq + 1000, "server_ts": round(time.time(), 3)}
            if mode == "garbage":
                return "not-an-ack", [1, 2]
            return {"seq": seq, "server_ts": round(time.time(), 3)}

        @sio.on("device:command-result")
        async def command_result(sid, data=None):
            dev = self._device(sid)
            if dev is None or not isinstance(data, dict) or not isinstance(data.get("id"), str):
                return {"ok": False, "error": "bad result"}
            record = dev.commands.get(data["id"])
            if record is None:
                return {"ok": False, "error": "unknown command id"}
            record["results"] += 1  # a repeat (its confirmation was lost) is stored once
            if record["result"] is None:
                record["result"] = data
            if self.behaviour.result_ack == "none":
                return None  # the test switch: confirmations lost
            return {"ok": True}

        @sio.on("device:report")
        async def report(sid, data=None):
            dev = self._device(sid)
            if dev is None or not isinstance(data, dict) or not isinstance(
                    data.get("connections"), list):
                return {"ok": False, "error": "bad report"}
            dev.reports.extend(c for c in data["connections"][:100] if isinstance(c, dict))
            return {"ok": True}

        @sio.on("device:event")
        async def event(sid, data=None):
            dev = self._device(sid)
            if dev is None or not isinstance(data, dict) or not isinstance(data.get("type"), str):
                return {"ok": False, "error": "bad event"}
            dev.events.append(data)
            return {"ok": True}

    def attach_device(self, sid: str, device_id: str) -> Device:
        """A device's connection is accepted: it becomes the device's only one."""
        dev = self.devices.setdefault(device_id, Device(device_id))
        for old in list(dev.sids):
            if old == sid:
                continue
            # A device has one link; an older one still open here is a half-open ghost.
            dev.ghosts_closed += 1
            log.info("device %s reconnected; closing its stale socket %s", device_id, old)
            self._close_sid(old)
        dev.sids.add(sid)
        dev.max_concurrent = max(dev.max_concurrent, len(dev.sids))
        dev.connects += 1
        dev.connect_times.append(round(time.time(), 3))
        dev.online = True
        dev.last_heartbeat = time.monotonic()
        self.by_sid[sid] = device_id
        log.info("device %s connected (sid %s, connect #%d)", device_id, sid, dev.connects)
        return dev

    def _flapping(self, identity: str, now: float) -> bool:
        recent = [t for t in self._connects.get(identity, []) if now - t < self.behaviour.flap_window_s]
        recent.append(now)
        self._connects[identity] = recent[-1000:]
        return len(recent) > self.behaviour.flap_limit

    def _authenticate(self, auth) -> str:
        if not isinstance(auth, dict):
            raise socketio.exceptions.ConnectionRefusedError("unauthorized")
        device_id, token = auth.get("device_id"), auth.get("token")
        if not isinstance(device_id, str) or not isinstance(token, str) or not device_id:
            raise socketio.exceptions.ConnectionRefusedError("unauthorized")
        if not self.accept_any and self.tokens.get(device_id) != token:
            dev = self.devices.setdefault(device_id, Device(device_id))
            dev.refused += 1
            raise socketio.exceptions.ConnectionRefusedError("unauthorized")
        return device_id

    def _device(self, sid) -> Device | None:
        device_id = self.by_sid.get(sid)
        return self.devices.get(device_id) if device_id else None

    def _close_sid(self, sid: str) -> None:
        """Close now, without a handshake a dead peer would never answer."""
        transport = self.transports.pop(sid, None)
        if transport is not None:
            transport.abort()
        device_id = self.by_sid.pop(sid, None)
        if device_id is not None:
            self.devices[device_id].sids.discard(sid)

    async def _start_reaper(self, _app) -> None:
        self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for dev in self.devices.values():
                if (dev.online and dev.last_heartbeat is not None
                        and now - dev.last_heartbeat > self.behaviour.heartbeat_timeout_s):
                    dev.online = False
                    log.info("device %s offline: no heartbeat for %.0fs; closing its socket",
                             dev.device_id, now - dev.last_heartbeat)
                    for sid in list(dev.sids):
                        self._close_sid(sid)

    # -- admin ------------------------------------------------------------------
    def _routes(self) -> None:
        r = self.app.router
        r.add_get("/healthz", lambda _req: web.json_response({"ok": True}))
        r.add_get("/admin/devices", self._admin_devices)
        r.add_post("/admin/behaviour", self._admin_behaviour)
        r.add_post("/admin/throttle", self._admin_throttle)
        r.add_post("/admin/emit", self._admin_emit)
        r.add_get("/admin/uploads/{device_id}", self._admin_uploads)
        r.add_post("/admin/revoke", self._admin_revoke)
        r.add_post("/api/v1/commands", self._operator_command)
        r.add_post("/admin/flood", self._admin_flood)
        r.add_get("/api/v1/devices/{device_id}/commands", self._operator_commands)
        r.add_get("/admin/uploads/{device_id}/{upload_id}/content", self._admin_log_bundle)
        r.add_get("/admin/limiter", self._admin_limiter)
        r.add_get("/admin/screentinker", self._admin_screentinker)
        r.add_post("/admin/screentinker", self._admin_screentinker)
        r.add_post("/api/v1/enroll", self._enroll)
        r.add_get("/api/v1/enroll/{device_id}", self._enroll_poll)
        r.add_post("/api/v1/pair", self._pair)
        r.add_post("/api/v1/devices/{device_id}/uploads", self._upload)
        r.add_post("/api/v1/devices/{device_id}/proof-of-play", self._proof_of_play)

    async def _send_command(self, sid: str, record: dict) -> None:
        def receipt(*args):
            if args and isinstance(args[0], dict) and args[0].get("ok") is True:
                record["received"] = True
        record["sent"] += 1
        await self.sio.emit("server:command", {k: record[k] for k in ("id", "name", "args",
                                                                        "expires_at")},
                            to=sid, callback=receipt)

    async def _operator_command(self, request) -> web.Response:
        """POST {device_id, name, args, expires_in_s, id?}: queue a command for a device;
        it goes now if the device is online, else when it connects."""
        body = await _json(request)
        device_id = str(body.get("device_id"))
        dev = self.devices.get(device_id)
        if dev is None:
            raise web.HTTPNotFound(text="no such device")
        cid = str(body.get("id") or secrets.token_hex(8))
        expires = body.get("expires_in_s", 300)
        record = {"id": cid, "name": body.get("name"), "args": body.get("args") or {},
                  "expires_at": (round(time.time() + float(expires), 3)
                                 if expires is not None else None),
                  "received": False, "sent": 0, "result": None, "results": 0,
                  "created_at": round(time.time(), 3)}
        if isinstance(body.get("expires_at"), (int, float)):
            record["expires_at"] = body["expires_at"]
        dev.commands.setdefault(cid, record)
        for sid in list(dev.sids):
            await self._send_command(sid, dev.commands[cid])
        return web.json_response(dev.commands[cid])

    async def _admin_flood(self, request) -> web.Response:
        """POST {device_id, count (at most 100000), name, args?}: ``count`` commands with
        fresh ids sent at once to the device's sockets, as a misbehaving server would;
        answers how many were sent, and how many of every flood so far have a result."""
        body = await _json(request)
        dev = self.devices.get(str(body.get("device_id")))
        if dev is None:
            raise web.HTTPNotFound(text="no such device")
        count = body.get("count", 0)
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= 100_000:
            raise web.HTTPBadRequest(text="count: an integer from 0 to 100000")
        now = time.time()
        records = []
        for _ in range(count):
            cid = "flood-" + secrets.token_hex(8)
            dev.commands[cid] = {"id": cid, "name": body.get("name"),
                                 "args": body.get("args") or {},
                                 "expires_at": round(now + 300, 3), "received": False, "sent": 0,
                                 "result": None, "results": 0, "created_at": round(now, 3)}
            records.append(dev.commands[cid])
        for sid in list(dev.sids):
            for record in records:
                await self._send_command(sid, record)
        flood = [r for cid, r in dev.commands.items() if cid.startswith("flood-")]
        return web.json_response({"sent": count, "results": sum(r["result"] is not None
                                                                for r in flood),
                                  "received": sum(r["received"] for r in flood)})

    async def _operator_commands(self, request) -> web.Response:
        dev = self.devices.get(request.match_info["device_id"])
        if dev is None:
            raise web.HTTPNotFound(text="no such device")
        return web.json_response(dev.commands)

    async def _admin_log_bundle(self, request) -> web.Response:
        dev = self.devices.get(request.match_info["device_id"])
        body = dev.log_bundles.get(request.match_info["upload_id"]) if dev else None
        if body is None:
            raise web.HTTPNotFound(text="no such log bundle")
        return web.Response(body=body, content_type="application/gzip")

    async def _admin_devices(self, _request) -> web.Response:
        now = time.monotonic()
        return web.json_response({d: dev.view(now) for d, dev in self.devices.items()})

    async def _admin_behaviour(self, request) -> web.Response:
        body = await _json(request)
        for key in ("ack_mode", "ack_delay_s", "connect_delay_s", "heartbeat_timeout_s",
                    "upload_mode", "retry_after_s", "code_ttl_s", "flap_limit", "flap_window_s",
                    "throttle_s", "quarantine_s", "pair_limit", "result_ack"):
            if key in body:
                setattr(self.behaviour, key, type(getattr(self.behaviour, key))(body[key]))
        return web.json_response(vars(self.behaviour))

    async def _admin_throttle(self, request) -> web.Response:
        body = await _json(request)
        dev = self.devices.get(str(body.get("device_id")))
        if dev is None:
            raise web.HTTPNotFound(text="no such device")
        retry_after = float(body.get("retry_after_s", 30))
        for sid in list(dev.sids):
            if self.profile == "screentinker":
                await self.sio.emit("device:throttled", {"retry_after_ms": int(retry_after * 1000),
                                                         "reason": "test"}, to=sid, namespace="/device")
                if body.get("disconnect", True):
                    await self.sio.disconnect(sid, namespace="/device")
                continue
            await self.sio.emit("server:throttle", {"retry_after_s": retry_after}, to=sid)
            if body.get("disconnect", True):
                await self.sio.disconnect(sid)
        return web.json_response({"ok": True})


    async def _admin_emit(self, request) -> web.Response:
        """Send any event to a device: how tests feed the agent hostile messages."""
        body = await _json(request)
        dev = self.devices.get(str(body.get("device_id")))
        if dev is None:
            raise web.HTTPNotFound(text="no such device")
        data = body.get("data")
        if isinstance(body.get("pad_bytes"), int):
            data = {"pad": "x" * body["pad_bytes"]}
        for sid in list(dev.sids):
            await self.sio.emit(str(body.get("event")), data, to=sid)
        return web.json_response({"ok": True, "sockets": len(dev.sids)})


    # -- enrollment and pairing ---------------------------------------------------
    async def _enroll(self, request) -> web.Response:
        body = await _json(request)
        device_id = body.get("device_id")
        if not isinstance(device_id, str) or not re.match(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$", device_id):
            raise web.HTTPBadRequest(text="device_id required")
        now = time.monotonic()
        old = self.enrollments.get(device_id)
        if old is not None:
            self.codes.pop(old["code"], None)
        while True:
            code = f"{secrets.randbelow(10 ** 6):06d}"
            if code not in self.codes:
                break
        entry = {"code": code, "poll_secret": secrets.token_urlsafe(24),
                 "expires_at": now + self.behaviour.code_ttl_s, "token": None,
                 "facts": body.get("facts") if isinstance(body.get("facts"), dict) else {}}
        self.enrollments[device_id] = entry
        self.codes[code] = device_id
        log.info("device %s enrolling: pairing code %s-%s", device_id, code[:3], code[3:])
        return web.json_response({"pairing_code": code, "poll_secret": entry["poll_secret"],
                                  "expires_in_s": self.behaviour.code_ttl_s})

    async def _enroll_poll(self, request) -> web.Response:
        device_id = request.match_info["device_id"]
        entry = self.enrollments.get(device_id)
        if entry is None or (entry["token"] is None and entry["expires_at"] < time.monotonic()):
            raise web.HTTPNotFound(text="no such enrollment")
        if request.headers.get("Authorization") != f"Bearer {entry['poll_secret']}":
            raise web.HTTPForbidden(text="bad poll secret")
        if entry["token"] is None:
            return web.json_response({"status": "pending"})
        return web.json_response({"status": "paired", "token": entry["token"]})

    async def _pair(self, request) -> web.Response:
        body = await _json(request)
        operator = request.headers.get("X-Operator", "operator")[:64]
        now = time.monotonic()
        # Wrong codes are what a brute force makes: those are limited, per operator.
        failures = [t for t in self._pair_attempts.get(operator, []) if now - t < 60]
        self._pair_attempts[operator] = failures
        if len(failures) >= self.behaviour.pair_limit:
            return web.json_response({"ok": False, "error": "too many attempts"}, status=429,
                                     headers={"Retry-After": "60"})
        code = str(body.get("code", "")).replace("-", "").strip()
        if self.profile == "screentinker":
            from . import screentinker
            device_id = await screentinker.pair(self, code, str(body.get("name") or "Display"))
            if device_id is None:
                failures.append(now)
                return web.json_response({"ok": False, "error": "No device found with that "
                                                               "pairing code"}, status=404)
            log.info("operator %s paired device %s (screentinker)", operator, device_id)
            return web.json_response({"ok": True, "device_id": device_id})
        device_id = self.codes.get(code)
        entry = self.enrollments.get(device_id) if device_id else None
        if entry is None or entry["expires_at"] < now:
            failures.append(now)
            return web.json_response({"ok": False, "error": "unknown or expired code"}, status=404)
        token = secrets.token_urlsafe(32)
        entry["token"] = token
        self.codes.pop(code, None)
        self.tokens[device_id] = token
        log.info("operator %s paired device %s", operator, device_id)
        return web.json_response({"ok": True, "device_id": device_id})

    async def _admin_revoke(self, request) -> web.Response:
        body = await _json(request)
        device_id = str(body.get("device_id"))
        self.tokens.pop(device_id, None)
        self.enrollments.pop(device_id, None)
        dev = self.devices.get(device_id)
        if self.profile == "screentinker":
            from . import screentinker
            await screentinker.delete(self, device_id)
            return web.json_response({"ok": True})
        for sid in list(dev.sids) if dev else []:
            await self.sio.disconnect(sid)
        return web.json_response({"ok": True})

    async def _admin_screentinker(self, request) -> web.Response:
        """GET: the emulated server's tables. POST {"content_id"}: content it has;
        POST {"device_id", "command"}: what its dashboard's buttons send, and its answer."""
        st = self.st
        if request.method == "POST":
            body = await _json(request)
            if isinstance(body.get("content_id"), str):
                st.content.add(body["content_id"])
            if isinstance(body.get("command"), str):
                from . import screentinker
                return web.json_response(await screentinker.dashboard_command(
                    self, body.get("device_id"), body["command"]))
        return web.json_response(st.view())

    async def _admin_limiter(self, _request) -> web.Response:
        now = time.monotonic()
        return web.json_response({"throttled": self.throttled,
                                  "quarantined": [i for i, t in self._quarantined.items() if t > now]})

    # -- uploads ------------------------------------------------------------------
    def _upload_device(self, request) -> Device:
        device_id = request.match_info["device_id"]
        auth = request.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else None
        if not self.accept_any and (token is None or self.tokens.get(device_id) != token):
            raise web.HTTPUnauthorized(text="unauthorized")
        return self.devices.setdefault(device_id, Device(device_id))

    async def _upload_gate(self, dev: Device, body: bytes):
        """The test switches: answers a struggling server gives. None means go ahead."""
        dev.upload_requests.append(round(time.time(), 3))
        mode = self.behaviour.upload_mode
        if mode == "hang":
            await asyncio.sleep(3600)
        if mode == "500" or b"FAIL500" in body:
            return web.Response(status=500, text="server error")
        if mode == "429":
            return web.Response(status=429, headers={"Retry-After": f"{self.behaviour.retry_after_s:g}"})
        if mode == "413":
            return web.Response(status=413, text="too large")
        return None

    async def _upload(self, request) -> web.Response:
        dev = self._upload_device(request)
        key = request.headers.get("Idempotency-Key")
        if not key or len(key) > 200:
            raise web.HTTPBadRequest(text="Idempotency-Key required")
        body = await request.read()
        refused = await self._upload_gate(dev, body)
        if refused is not None:
            return refused
        if key in dev.uploads:
            dev.upload_repeats += 1  # a retry whose first answer was lost: stored once
        else:
            kind = request.headers.get("X-Upload-Kind", "?")
            dev.uploads[key] = (kind, hashlib.sha256(body).hexdigest())
            if kind == "log":  # an operator reads these (`fleet-server command ... logs`)
                dev.log_bundles[key] = body
                for old in list(dev.log_bundles)[:-20]:
                    del dev.log_bundles[old]
        return web.json_response({"ok": True, "id": key})

    async def _proof_of_play(self, request) -> web.Response:
        dev = self._upload_device(request)
        body = await request.read()
        refused = await self._upload_gate(dev, body)
        if refused is not None:
            return refused
        try:
            records = json.loads(body)["records"]
        except (ValueError, KeyError, TypeError):
            raise web.HTTPBadRequest(text="bad batch") from None
        acked = []
        for rec in records[:500]:
            if not isinstance(rec, dict) or not isinstance(rec.get("id"), str):
                continue
            if rec["id"] in dev.uploads:
                dev.upload_repeats += 1
            else:
                dev.uploads[rec["id"]] = ("proof-of-play", hashlib.sha256(
                    json.dumps(rec.get("record"), sort_keys=True).encode()).hexdigest())
            acked.append(rec["id"])
        return web.json_response({"ok": True, "acked": acked})

    async def _admin_uploads(self, request) -> web.Response:
        dev = self.devices.get(request.match_info["device_id"])
        if dev is None:
            return web.json_response({})
        return web.json_response({k: list(v) for k, v in dev.uploads.items()})


async def _json(request) -> dict:
    try:
        body = await request.json()
    except ValueError:
        raise web.HTTPBadRequest(text="body must be JSON") from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="body must be a JSON object")
    return body
