"""Uploads over HTTP (docs/PROTOCOL.md, Uploads), the server's side: items and
proof-of-play batches from a device's queue, each key stored once (a repeat is a retry
whose answer was lost), and the answers of a struggling server when a test asks for them."""
from __future__ import annotations

import asyncio
import hashlib
import json
import time

from aiohttp import web

from fleet_server.behaviour import Behaviour
from fleet_server.devices import Device, Registry

MAX_UPLOAD_BYTES = 32 * 1024 * 1024
LOG_BUNDLES_KEPT = 20


class Uploads:
    def __init__(self, behaviour: Behaviour, registry: Registry):
        self.behaviour = behaviour
        self.registry = registry

    def _device(self, request) -> Device:
        device_id = request.match_info["device_id"]
        auth = request.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else None
        if not self.registry.admits(device_id, token):
            raise web.HTTPUnauthorized(text="unauthorized")
        return self.registry.device(device_id)

    async def _refusal(self, dev: Device, body: bytes) -> web.Response | None:
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

    async def upload(self, request) -> web.Response:
        dev = self._device(request)
        key = request.headers.get("Idempotency-Key")
        if not key or len(key) > 200:
            raise web.HTTPBadRequest(text="Idempotency-Key required")
        body = await request.read()
        refused = await self._refusal(dev, body)
        if refused is not None:
            return refused
        if key in dev.uploads:
            dev.upload_repeats += 1
        else:
            kind = request.headers.get("X-Upload-Kind", "?")
            dev.uploads[key] = (kind, hashlib.sha256(body).hexdigest())
            if kind == "log":  # an operator reads these (`fleet-server command ... logs`)
                dev.log_bundles[key] = body
                for old in list(dev.log_bundles)[:-LOG_BUNDLES_KEPT]:
                    del dev.log_bundles[old]
        return web.json_response({"ok": True, "id": key})

    async def proof_of_play(self, request) -> web.Response:
        dev = self._device(request)
        body = await request.read()
        refused = await self._refusal(dev, body)
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
