"""What the reference server knows of each device: its record, and the registry of
credentials and live sockets. Identity, never the source address, keys everything: a
whole site behind one SNAT address is normal."""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

log = logging.getLogger("fleet_server")


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
    event_repeats: int = 0                               # events received again, stored once
    _event_keys: set = field(default_factory=set)

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
            "event_repeats": self.event_repeats,
        }


class Registry:
    """Tokens, device records, and which socket is whose (both profiles)."""

    def __init__(self, tokens: dict[str, str] | None, accept_any: bool):
        self.tokens = dict(tokens or {})
        self.accept_any = accept_any
        self.devices: dict[str, Device] = {}
        self.by_sid: dict[str, str] = {}
        self.transports: dict[str, asyncio.BaseTransport] = {}

    def admits(self, device_id: str, token: str | None) -> bool:
        return self.accept_any or (token is not None and self.tokens.get(device_id) == token)

    def device(self, device_id: str) -> Device:
        """The record of ``device_id``, made the first time anything names it."""
        return self.devices.setdefault(device_id, Device(device_id))

    def device_of(self, sid: str) -> Device | None:
        device_id = self.by_sid.get(sid)
        return self.devices.get(device_id) if device_id else None

    def attach(self, sid: str, device_id: str) -> Device:
        """A device's connection is accepted: it becomes the device's only one."""
        dev = self.device(device_id)
        for old in list(dev.sids):
            if old == sid:
                continue
            # A device has one link; an older one still open here is a half-open ghost.
            dev.ghosts_closed += 1
            log.info("device %s reconnected; closing its stale socket %s", device_id, old)
            self.close(old)
        dev.sids.add(sid)
        dev.max_concurrent = max(dev.max_concurrent, len(dev.sids))
        dev.connects += 1
        dev.connect_times.append(round(time.time(), 3))
        dev.online = True
        dev.last_heartbeat = time.monotonic()
        self.by_sid[sid] = device_id
        log.info("device %s connected (sid %s, connect #%d)", device_id, sid, dev.connects)
        return dev

    def detach(self, sid: str) -> None:
        """The socket is gone; its device is offline once it has none left."""
        device_id = self.by_sid.pop(sid, None)
        self.transports.pop(sid, None)
        if device_id is None:
            return
        dev = self.devices[device_id]
        dev.sids.discard(sid)
        if not dev.sids:
            dev.online = False
        log.info("device %s disconnected (sid %s)", device_id, sid)

    def close(self, sid: str) -> None:
        """Close now, without a handshake a dead peer would never answer."""
        transport = self.transports.pop(sid, None)
        if transport is not None:
            transport.abort()
        device_id = self.by_sid.pop(sid, None)
        if device_id is not None:
            self.devices[device_id].sids.discard(sid)
