"""An emulation of ScreenTinker's device protocol (contract v4), server side, for tests.

It follows the public behaviour the agent's `screentinker` profile speaks to: namespace
/device, device:register with a token or a pairing code, device:registered and
device:paired (the latter on every reconnect of a paired device, as the real server
does), device:heartbeat answered by device:heartbeat-ack (switchable off, like older
servers), device:throttled, device:unpaired / device:auth-error, and
device:connectivity-report, device:screenshot and device:play-event (ACKed by callback,
or with `st_upload_ack = "none"` never, like a server that does not ACK uploads).
It is ours, not ScreenTinker's code.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import time

NS = "/device"


def attach(server) -> None:
    sio = server.sio
    server.st_pending = {}   # pairing code -> sid
    server.st_registers = {} # device_id or code -> register count

    def dev_for(sid):
        device_id = server.by_sid.get(sid)
        return server.devices.get(device_id) if device_id else None

    @sio.on("connect", namespace=NS)
    async def connect(sid, environ, auth=None):
        request = environ.get("aiohttp.request")
        if request is not None:
            server.transports[sid] = request.transport

    @sio.on("disconnect", namespace=NS)
    async def disconnect(sid, *args):
        device_id = server.by_sid.pop(sid, None)
        server.transports.pop(sid, None)
        if device_id and device_id in server.devices:
            dev = server.devices[device_id]
            dev.sids.discard(sid)
            dev.online = bool(dev.sids)

    @sio.on("device:register", namespace=NS)
    async def register(sid, data=None):
        if not isinstance(data, dict) or data.get("contract_version") != "v4":
            return
        device_id, token = data.get("device_id"), data.get("device_token")
        key = device_id or data.get("pairing_code")
        server.st_registers[key] = server.st_registers.get(key, 0) + 1
        if device_id and token:
            if server.tokens.get(device_id) != token:
                await sio.emit("device:auth-error", {"error": "invalid token",
                                                     "offline_s": server.behaviour.st_settle_s},
                               to=sid, namespace=NS)
                return
            server.attach_device(sid, device_id)
            await sio.emit("device:registered", {"device_id": device_id, "status": "paired"},
                           to=sid, namespace=NS)
            await sio.emit("device:paired", {"name": device_id, "device_id": device_id},
                           to=sid, namespace=NS)
            return
        code = data.get("pairing_code")
        if isinstance(code, str) and len(code) == 6 and code.isdigit():
            server.st_pending[code] = sid
            await sio.emit("device:registered", {"status": "pending"}, to=sid, namespace=NS)

    @sio.on("device:heartbeat", namespace=NS)
    async def heartbeat(sid, data=None):
        dev = dev_for(sid)
        if dev is None or not isinstance(data, dict) or not isinstance(data.get("client_ms"), int):
            return
        dev.heartbeats += 1
        dev.last_heartbeat = time.monotonic()
        if sid not in dev._sids_heard:
            dev._sids_heard.add(sid)
            dev.first_heartbeat_times.append(round(time.time(), 3))
        if server.behaviour.ack_mode == "none":
            return  # an older server: no heartbeat-ack at all
        await sio.emit("device:heartbeat-ack", {"server_ms": int(time.time() * 1000),
                                                "client_ms": data["client_ms"]},
                       to=sid, namespace=NS)

    @sio.on("device:connectivity-report", namespace=NS)
    async def connectivity(sid, data=None):
        dev = dev_for(sid)
        if dev is not None and isinstance(data, dict):
            dev.reports.append(data)


    async def answer_upload():
        if server.behaviour.st_upload_ack == "none":
            await asyncio.sleep(3600)  # python-socketio ACKs whatever a handler returns
        return {"ok": True}

    def store(dev, upload_id, kind, body: bytes) -> bool:
        if not isinstance(upload_id, str) or not 0 < len(upload_id) <= 200:
            return False
        if upload_id in dev.uploads:
            dev.upload_repeats += 1  # a retry whose proof was lost: stored once
        else:
            dev.uploads[upload_id] = (kind, hashlib.sha256(body).hexdigest())
        return True

    @sio.on("device:screenshot", namespace=NS)
    async def screenshot(sid, data=None):
        dev = dev_for(sid)
        if dev is None:
            return {"error": "not registered"}
        if not isinstance(data, dict) or not isinstance(data.get("image"), bytes):
            return {"error": "bad screenshot"}
        dev.upload_requests.append(round(time.time(), 3))
        store(dev, data.get("upload_id"), "screenshot", data["image"])
        return await answer_upload()

    @sio.on("device:play-event", namespace=NS)
    async def play_event(sid, data=None):
        dev = dev_for(sid)
        if dev is None:
            return {"error": "not registered"}
        events = data.get("events") if isinstance(data, dict) else None
        if not isinstance(events, list):
            return {"error": "bad play-event"}
        dev.upload_requests.append(round(time.time(), 3))
        acked = []
        for ev in events[:500]:
            if isinstance(ev, dict):
                record = {k: v for k, v in ev.items() if k != "upload_id"}
                if store(dev, ev.get("upload_id"), "proof-of-play",
                         json.dumps(record, sort_keys=True).encode()):
                    acked.append(ev["upload_id"])
        answer = await answer_upload()
        return {**answer, "acked": acked}


async def pair(server, code: str):
    """Operator pairs a pending code: the device gets its id and token in the link."""
    sid = server.st_pending.pop(code, None)
    if sid is None:
        return None
    device_id = "st-" + secrets.token_hex(6)
    token = secrets.token_urlsafe(32)
    server.tokens[device_id] = token
    await server.sio.emit("device:registered", {"device_id": device_id, "device_token": token,
                                                "status": "paired"}, to=sid, namespace=NS)
    await server.sio.emit("device:paired", {"name": device_id, "device_id": device_id},
                          to=sid, namespace=NS)
    return device_id
