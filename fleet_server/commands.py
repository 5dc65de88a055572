"""Remote operations (docs/PROTOCOL.md, Commands), the server's side: its record of each
command, sending it (again on every connect until the device confirms receipt) and
storing its result once, however often the device repeats it."""
from __future__ import annotations

import asyncio
import secrets
import time

import socketio

from agent.link.protocol import COMMAND

from fleet_server.behaviour import Behaviour
from fleet_server.devices import Device, Registry

FLOOD_PREFIX = "flood-"


def _record(cid: str, name, args, expires_at, now: float) -> dict:
    return {"id": cid, "name": name, "args": args, "expires_at": expires_at,
            "received": False, "sent": 0, "result": None, "results": 0,
            "created_at": round(now, 3)}


class Commands:
    def __init__(self, sio: socketio.AsyncServer, behaviour: Behaviour, registry: Registry):
        self.sio = sio
        self.behaviour = behaviour
        self.registry = registry

    async def send(self, sid: str, record: dict) -> None:
        def receipt(*args):
            if args and isinstance(args[0], dict) and args[0].get("ok") is True:
                record["received"] = True
        record["sent"] += 1
        await self.sio.emit(COMMAND, {k: record[k] for k in ("id", "name", "args",
                                                               "expires_at")},
                            to=sid, callback=receipt)

    def resend_unreceived(self, sid: str, dev: Device) -> None:
        """At connect: commands the device never confirmed receiving go again; it runs
        each id once."""
        for record in dev.commands.values():
            if not record["received"] and record["result"] is None:
                asyncio.get_running_loop().create_task(self.send(sid, record))

    async def queue(self, dev: Device, cid: str, name, args, expires_at) -> dict:
        """The command goes now if the device is online, else when it connects; a known
        id keeps its first record."""
        record = dev.commands.setdefault(cid, _record(cid, name, args, expires_at, time.time()))
        for sid in list(dev.sids):
            await self.send(sid, record)
        return record

    async def flood(self, dev: Device, count: int, name, args) -> dict:
        """``count`` commands with fresh ids sent at once, as a misbehaving server would;
        how many were sent, and how many of every flood so far have a result."""
        now = time.time()
        records = []
        for _ in range(count):
            cid = FLOOD_PREFIX + secrets.token_hex(8)
            dev.commands[cid] = _record(cid, name, args or {}, round(now + 300, 3), now)
            records.append(dev.commands[cid])
        for sid in list(dev.sids):
            for record in records:
                await self.send(sid, record)
        flood = [r for cid, r in dev.commands.items() if cid.startswith(FLOOD_PREFIX)]
        return {"sent": count, "results": sum(r["result"] is not None for r in flood),
                "received": sum(r["received"] for r in flood)}

    async def result(self, sid, data=None):
        """device:command-result; the ACK says it is stored."""
        dev = self.registry.device_of(sid)
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
