"""A fleet server that sends what no fleet server should: for the tests of what the agent
takes in (tests/test_link_inputs.py).

A real python-socketio server on aiohttp, speaking the edge-agent protocol far enough
to get a device online (any token is accepted, heartbeats are ACKed). When the test
asks (``POST /go``, once it has seen the agent online) it misbehaves on the latest
connection, once:

- ``--big-bytes N``: one Socket.IO event of N bytes, in one websocket frame;
- ``--dense-bytes N``: one Socket.IO event of N bytes of JSON that is all empty
  objects (``[{},{},...]``), the text that costs most memory to parse;
- ``--binary-parts COUNTxBYTES``: one Socket.IO event with COUNT binary attachments
  of BYTES each;
  (repeat these options for several, sent in the order given, 0.5 s apart);
- ``--malformed N``: N Engine.IO messages the client library cannot decode, then
  one event it can (``device:end-of-junk``);
- ``--registered-flood N``: as a ScreenTinker server (namespace ``/device``), N
  ``device:registered`` with alternating tokens, as fast as it can send them;
- ``--paired-names COUNTxBYTES``: as ScreenTinker, COUNT ``device:paired`` each
  naming the screen with BYTES characters, one ``device:unpaired`` between them;
- ``--answers-per-register N``: as ScreenTinker, every ``device:register`` (no
  ``/go`` needed) is answered with N ``device:registered`` with alternating tokens,
  and the connection is then ended, so that each reconnection brings N more;
- ``--answer-status S``: the ``status`` those answers carry (``provisioning``, or
  ``online``: what ScreenTinker says of a claimed screen).

As ScreenTinker it registers any code and ACKs heartbeats with
``device:heartbeat-ack``.

``GET /state`` says what it did: wall times of each connect and heartbeat, and when it
finished sending the big messages or the malformed ones. The server itself never reads
more than 64 KiB from the agent.

    python -m devtools.hostile_peer --port-file F --big-bytes 41943040
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import time

import socketio
from aiohttp import web

from fleet_server.serving import serve_until_stopped

# Socket.IO packets the client library cannot make sense of, sent in turn: JSON cut
# short, a namespace nobody joined, an unknown packet type, an ACK for nothing, an
# event with no name, an event that is not a list. (A packet that announces binary
# attachments is not here: the agent ends the connection on it, by design.)
TOKENS = ("a" * 64, "b" * 64)
MALFORMED = ('2["device:x",{', '2/nowhere,["x"]', '9junk', '3999["ack for nothing"]',
             '2[]', '2{"not": "a list"}', '2["x"')


ST = "/device"   # ScreenTinker's namespace


class HostilePeer:
    def __init__(self, big: list[tuple[str, int, int]], malformed: int,
                 registered_flood: int = 0, paired_names: tuple[int, int] = (0, 0),
                 answers_per_register: int = 1, answer_status: str = "provisioning"):
        self.big, self.malformed = big, malformed
        self.answers_per_register, self.answer_status = answers_per_register, answer_status
        self.registered_flood, self.paired_names = registered_flood, paired_names
        self.sio = socketio.AsyncServer(async_mode="aiohttp", ping_interval=25, ping_timeout=20,
                                        max_http_buffer_size=64 * 1024)
        self.app = web.Application()
        self.sio.attach(self.app)
        self.app.router.add_get("/state", self._state)
        self.app.router.add_post("/go", self._go)
        self.state = {"connects": [], "heartbeats": [], "registers": 0, "answers": 0,
                      "big_sent_at": None,
                      "malformed_sent_at": None, "flood_sent_at": None, "send_error": None}
        self._latest: str | None = None
        sio = self.sio

        @sio.event
        async def connect(sid, environ, auth=None):
            self.state["connects"].append(time.time())
            self._latest = sid

        @sio.on("*")
        async def any_event(event, sid, data=None):
            if event != "device:heartbeat" or not isinstance(data, dict):
                return {"ok": True}
            self.state["heartbeats"].append(time.time())
            return {"seq": data.get("seq"), "server_ts": time.time()}

        @sio.on("connect", namespace=ST)
        async def st_connect(sid, environ, auth=None):
            self.state["connects"].append(time.time())
            self._latest = sid

        @sio.on("device:register", namespace=ST)
        async def st_register(sid, data=None):
            self.state["registers"] += 1
            for i in range(self.answers_per_register):
                await sio.emit("device:registered", {"device_id": "st-screen-1", "device_token":
                                                     TOKENS[i % 2], "status": self.answer_status},
                               to=sid, namespace=ST)
                self.state["answers"] += 1
            if self.answers_per_register > 1:
                await sio.disconnect(sid, namespace=ST)

        @sio.on("device:heartbeat", namespace=ST)
        async def st_heartbeat(sid, data=None):
            self.state["heartbeats"].append(time.time())
            if isinstance(data, dict):
                await sio.emit("device:heartbeat-ack", {"client_ms": data.get("client_ms")},
                               to=sid, namespace=ST)

    async def _go(self, request):
        if self._latest is None:
            return web.json_response({"error": "nobody connected"}, status=409)
        asyncio.get_running_loop().create_task(self._misbehave(self._latest))
        return web.json_response({"ok": True})

    async def _misbehave(self, sid: str) -> None:
        eio_sid = self.sio.manager.eio_sid_from_sid(sid, "/")
        try:
            for i, (kind, count, size) in enumerate(self.big):
                if i:
                    await asyncio.sleep(0.5)
                if kind == "binary":
                    await self.sio.emit("device:binary", [bytes(size)] * count, to=sid)
                else:
                    await self._send_big(eio_sid, kind, size)
                self.state["big_sent_at"] = time.time()
            if self.malformed:
                for data in itertools.islice(itertools.cycle(MALFORMED), self.malformed):
                    await self.sio.eio.send(eio_sid, data)
                # a well-formed event last: once the agent logs it, it has read them all
                await self.sio.emit("device:end-of-junk", {}, to=sid)
                self.state["malformed_sent_at"] = time.time()
            for i in range(self.registered_flood):
                await self.sio.emit("device:registered", {
                    "device_id": "st-screen-1", "device_token": TOKENS[i % 2],
                    "status": "provisioning"}, to=sid, namespace=ST)
            count, size = self.paired_names
            for i in range(count):
                if i:
                    await self.sio.emit("device:unpaired", {}, to=sid, namespace=ST)
                await self.sio.emit("device:paired", {"name": "n" * size}, to=sid, namespace=ST)
            self.state["flood_sent_at"] = time.time()
        except Exception as e:  # the agent hung up on us: that is what the test wants
            self.state["send_error"] = f"{type(e).__name__}: {e}"

    async def _send_big(self, eio_sid: str, kind: str, size: int) -> None:
        # '4' Engine.IO MESSAGE, '2' Socket.IO EVENT, exactly ``size`` bytes in all:
        # ["device:big","xxxx..."] or ["device:dense",[{},{},...]] (padded with spaces)
        if kind == "dense":
            head, tail = '42["device:dense",[{}', "]]"
            n = max(0, size - len(head) - len(tail)) // 3
            text = head + ",{}" * n + tail
            text = text[:-len(tail)] + " " * max(0, size - len(text)) + tail
        else:
            head = '42["device:big","'
            text = head + "x" * max(0, size - len(head) - 2) + '"]'
        await self.sio.eio.send(eio_sid, text[1:])  # the library adds the '4'

    async def _state(self, request):
        return web.json_response(self.state)


async def serve(args) -> None:
    peer = HostilePeer(args.big, args.malformed, args.registered_flood, args.paired_names,
                       args.answers_per_register, args.answer_status)
    await serve_until_stopped(peer.app, "127.0.0.1", args.port, args.port_file)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="hostile-peer", description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file")
    p.add_argument("--big-bytes", dest="big", action="append", default=[],
                   type=lambda v: ("big", 1, int(v)))
    p.add_argument("--dense-bytes", dest="big", action="append",
                   type=lambda v: ("dense", 1, int(v)))
    p.add_argument("--binary-parts", dest="big", action="append",
                   type=lambda v: ("binary", *map(int, v.split("x"))))
    p.add_argument("--malformed", type=int, default=0)
    p.add_argument("--registered-flood", type=int, default=0)
    p.add_argument("--paired-names", type=lambda v: tuple(map(int, v.split("x"))), default=(0, 0))
    p.add_argument("--answers-per-register", type=int, default=1)
    p.add_argument("--answer-status", default="provisioning")
    asyncio.run(serve(p.parse_args(argv)))


if __name__ == "__main__":
    main()
