"""Packages the fleet publishes for screens to update themselves from (the `update`
command, docs/PROTOCOL.md). Kept in memory by their SHA-256; served with byte ranges,
so a screen resumes a download that was cut. The signature is the operator's, made
before publishing: this server never holds a signing key."""
from __future__ import annotations

import hashlib
import re

from aiohttp import web

from fleet_server.behaviour import Behaviour

MAX_RELEASE_BYTES = 64 << 20
_RANGE = re.compile(r"^bytes=(\d+)-$")


class Releases:
    def __init__(self, behaviour: Behaviour):
        self.behaviour = behaviour
        self.packages: dict[str, bytes] = {}
        self.requests: list[dict] = []   # what was asked for: the tests' view

    async def publish(self, request: web.Request) -> web.Response:
        """POST the .deb as the body: where screens fetch it, its size and SHA-256."""
        body = bytearray()
        async for chunk in request.content.iter_chunked(1 << 16):
            body += chunk
            if len(body) > MAX_RELEASE_BYTES:
                raise web.HTTPRequestEntityTooLarge(max_size=MAX_RELEASE_BYTES,
                                                    actual_size=len(body))
        if not body:
            raise web.HTTPBadRequest(text="an empty package")
        sha = hashlib.sha256(body).hexdigest()
        self.packages[sha] = bytes(body)
        return web.json_response({"url": f"/releases/{sha}.deb", "sha256": sha,
                                  "size": len(body)})

    async def view(self, _request: web.Request) -> web.Response:
        return web.json_response({"packages": sorted(self.packages), "requests": self.requests})

    async def fetch(self, request: web.Request) -> web.StreamResponse:
        data = self.packages.get(request.match_info["name"].removesuffix(".deb"))
        if data is None:
            raise web.HTTPNotFound(text="no such release")
        start = 0
        m = _RANGE.match(request.headers.get("Range", ""))
        if m:
            start = int(m.group(1))
            if start >= len(data):
                raise web.HTTPRequestRangeNotSatisfiable(
                    headers={"Content-Range": f"bytes */{len(data)}"})
        self.requests.append({"name": request.match_info["name"], "from": start})
        response = web.StreamResponse(status=206 if m else 200)
        response.content_length = len(data) - start
        response.content_type = "application/vnd.debian.binary-package"
        response.headers["Accept-Ranges"] = "bytes"
        if m:
            response.headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        await response.prepare(request)
        cut = self.behaviour.release_cut_bytes
        if cut:
            # a link that drops in the middle of a download, once
            self.behaviour.release_cut_bytes = 0
            await response.write(data[start:start + cut])
            request.transport.close()
            return response
        await response.write(data[start:])
        await response.write_eof()
        return response
