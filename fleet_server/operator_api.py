"""The operator's API (`/api/v1/pair`, `/api/v1/commands`, a device's commands) and the
admin endpoints (`/admin/*`, loopback, for the demo and tests): they expose what the
server saw and let a test bend its behaviour (slow ACKs, no ACKs, a slow namespace
CONNECT, throttling, hostile messages)."""
from __future__ import annotations

import logging
import secrets
import time

from aiohttp import web

from agent.link.protocol import THROTTLE

from fleet_server import screentinker
from fleet_server.devices import Device
from fleet_server.enrollment import PAIR_WINDOW_S
from fleet_server.serving import read_json

log = logging.getLogger("fleet_server")

BEHAVIOUR_KEYS = ("ack_mode", "ack_delay_s", "connect_delay_s", "heartbeat_timeout_s",
                  "upload_mode", "retry_after_s", "code_ttl_s", "flap_limit", "flap_window_s",
                  "throttle_s", "quarantine_s", "pair_limit", "result_ack",
                  "release_cut_bytes", "refuse_for_now_s")


class OperatorApi:
    def __init__(self, server):
        """``server``: the FleetServer whose parts it shows and steers (the ScreenTinker
        emulation's functions take the server itself)."""
        self.server = server
        self.sio = server.sio
        self.behaviour = server.behaviour
        self.registry = server.registry

    def _known(self, device_id: str) -> Device:
        dev = self.registry.devices.get(device_id)
        if dev is None:
            raise web.HTTPNotFound(text="no such device")
        return dev

    async def healthz(self, _request) -> web.Response:
        if self.server.sessions.draining:   # a balancer takes the node out
            return web.json_response({"ok": False, "draining": True}, status=503)
        return web.json_response({"ok": True})

    # -- the operator's ------------------------------------------------------------
    async def pair(self, request) -> web.Response:
        """What an operator sends after reading the code off the screen."""
        body = await read_json(request)
        operator = request.headers.get("X-Operator", "operator")[:64]
        now = time.monotonic()
        enrollment = self.server.enrollment
        if enrollment.pairing_limited(operator, now):
            return web.json_response({"ok": False, "error": "too many attempts"}, status=429,
                                     headers={"Retry-After": str(PAIR_WINDOW_S)})
        code = str(body.get("code", "")).replace("-", "").strip()
        if self.server.profile == "screentinker":
            device_id = await screentinker.pair(self.server, code, str(body.get("name") or "Display"))
            if device_id is None:
                enrollment.pair_failed(operator, now)
                return web.json_response({"ok": False, "error": "No device found with that "
                                                               "pairing code"}, status=404)
            log.info("operator %s paired device %s (screentinker)", operator, device_id)
            return web.json_response({"ok": True, "device_id": device_id})
        device_id = enrollment.pair(code, now)
        if device_id is None:
            enrollment.pair_failed(operator, now)
            return web.json_response({"ok": False, "error": "unknown or expired code"}, status=404)
        log.info("operator %s paired device %s", operator, device_id)
        return web.json_response({"ok": True, "device_id": device_id})

    async def queue_command(self, request) -> web.Response:
        """POST {device_id, name, args, expires_in_s, id?}: queue a command for a device;
        it goes now if the device is online, else when it connects."""
        body = await read_json(request)
        dev = self._known(str(body.get("device_id")))
        cid = str(body.get("id") or secrets.token_hex(8))
        expires = body.get("expires_in_s", 300)
        expires_at = round(time.time() + float(expires), 3) if expires is not None else None
        if isinstance(body.get("expires_at"), (int, float)):
            expires_at = body["expires_at"]
        record = await self.server.commands.queue(dev, cid, body.get("name"),
                                                  body.get("args") or {}, expires_at)
        return web.json_response(record)

    async def device_commands(self, request) -> web.Response:
        return web.json_response(self._known(request.match_info["device_id"]).commands)

    # -- the tests' ----------------------------------------------------------------
    async def devices(self, _request) -> web.Response:
        now = time.monotonic()
        return web.json_response({d: dev.view(now) for d, dev in self.registry.devices.items()})

    async def set_behaviour(self, request) -> web.Response:
        body = await read_json(request)
        for key in BEHAVIOUR_KEYS:
            if key in body:
                setattr(self.behaviour, key, type(getattr(self.behaviour, key))(body[key]))
        return web.json_response(vars(self.behaviour))

    async def throttle(self, request) -> web.Response:
        body = await read_json(request)
        dev = self._known(str(body.get("device_id")))
        retry_after = float(body.get("retry_after_s", 30))
        for sid in list(dev.sids):
            if self.server.profile == "screentinker":
                await self.sio.emit("device:throttled", {"retry_after_ms": int(retry_after * 1000),
                                                         "reason": "test"}, to=sid, namespace=screentinker.NS)
                if body.get("disconnect", True):
                    await self.sio.disconnect(sid, namespace=screentinker.NS)
                continue
            await self.sio.emit(THROTTLE, {"retry_after_s": retry_after}, to=sid)
            if body.get("disconnect", True):
                await self.sio.disconnect(sid)
        return web.json_response({"ok": True})

    async def emit(self, request) -> web.Response:
        """Send any event to a device: how tests feed the agent hostile messages."""
        body = await read_json(request)
        dev = self._known(str(body.get("device_id")))
        data = body.get("data")
        if isinstance(body.get("pad_bytes"), int):
            data = {"pad": "x" * body["pad_bytes"]}
        for sid in list(dev.sids):
            await self.sio.emit(str(body.get("event")), data, to=sid)
        return web.json_response({"ok": True, "sockets": len(dev.sids)})

    async def flood(self, request) -> web.Response:
        """POST {device_id, count (at most 100000), name, args?}: ``count`` commands with
        fresh ids sent at once to the device's sockets, as a misbehaving server would;
        answers how many were sent, and how many of every flood so far have a result."""
        body = await read_json(request)
        dev = self._known(str(body.get("device_id")))
        count = body.get("count", 0)
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= 100_000:
            raise web.HTTPBadRequest(text="count: an integer from 0 to 100000")
        return web.json_response(await self.server.commands.flood(dev, count, body.get("name"),
                                                                  body.get("args")))

    async def revoke(self, request) -> web.Response:
        body = await read_json(request)
        device_id = str(body.get("device_id"))
        self.server.enrollment.revoke(device_id)
        dev = self.registry.devices.get(device_id)
        if self.server.profile == "screentinker":
            await screentinker.delete(self.server, device_id)
            return web.json_response({"ok": True})
        for sid in list(dev.sids) if dev else []:
            await self.sio.disconnect(sid)
        return web.json_response({"ok": True})

    async def device_uploads(self, request) -> web.Response:
        dev = self.registry.devices.get(request.match_info["device_id"])
        if dev is None:
            return web.json_response({})
        return web.json_response({k: list(v) for k, v in dev.uploads.items()})

    async def log_bundle(self, request) -> web.Response:
        dev = self.registry.devices.get(request.match_info["device_id"])
        body = dev.log_bundles.get(request.match_info["upload_id"]) if dev else None
        if body is None:
            raise web.HTTPNotFound(text="no such log bundle")
        return web.Response(body=body, content_type="application/gzip")

    async def limiter(self, _request) -> web.Response:
        return web.json_response(self.server.sessions.limiter.view(time.monotonic()))

    async def screentinker_tables(self, request) -> web.Response:
        """GET: the emulated server's tables. POST {"content_id"}: content it has;
        POST {"device_id", "command", "payload"}: what its dashboard's buttons send, and
        its answer."""
        st = self.server.st
        if request.method == "POST":
            body = await read_json(request)
            if isinstance(body.get("content_id"), str):
                st.content.add(body["content_id"])
            if isinstance(body.get("command"), str):
                payload = body.get("payload")
                return web.json_response(await screentinker.dashboard_command(
                    self.server, body.get("device_id"), body["command"],
                    payload if isinstance(payload, dict) else None))
        return web.json_response(st.view())
