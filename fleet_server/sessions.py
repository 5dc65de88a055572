"""Device connections on the default namespace: the Socket.IO CONNECT (credentials, the
flap limiter, TCP keepalive), heartbeats and their ACKs, reports and events, and the
reaper that marks a silent device offline and closes its socket, so "offline" and
"connected" never disagree."""
from __future__ import annotations

import asyncio
import logging
import socket
import time

import socketio

from agent.link.protocol import DRAIN, RECONNECT_WINDOW, THROTTLE

from fleet_server.behaviour import Behaviour
from fleet_server.cluster_node import ClusterNode
from fleet_server.commands import Commands
from fleet_server.devices import Registry

log = logging.getLogger("fleet_server")

# a drain keeps serving this long past its window: a device that moved at the window's
# last moment still proves its new connection before the old one is cut
DRAIN_MARGIN_S = 2.0


class FlapLimiter:
    """Connects per identity: a paired device that flaps is asked, softly, to slow down
    (it is never quarantined); an unknown identity that flaps is refused for a while."""

    def __init__(self, behaviour: Behaviour):
        self.behaviour = behaviour
        self.connects: dict[str, list] = {}      # identity -> recent connect times
        self.quarantined: dict[str, float] = {}  # identity -> until (monotonic)
        self.throttled: dict[str, int] = {}      # identity -> soft throttles sent

    def flapping(self, identity: str, now: float) -> bool:
        """Counts this connect; True once the identity connects too often."""
        recent = [t for t in self.connects.get(identity, []) if now - t < self.behaviour.flap_window_s]
        recent.append(now)
        self.connects[identity] = recent[-1000:]
        return len(recent) > self.behaviour.flap_limit

    def view(self, now: float) -> dict:
        return {"throttled": self.throttled,
                "quarantined": [i for i, t in self.quarantined.items() if t > now]}


class Sessions:
    def __init__(self, sio: socketio.AsyncServer, behaviour: Behaviour, registry: Registry,
                 commands: Commands):
        self.sio = sio
        self.behaviour = behaviour
        self.registry = registry
        self.commands = commands
        self.limiter = FlapLimiter(behaviour)
        self.draining = False
        self.cluster_node: ClusterNode | None = None   # with --rebalance (server.py)

    async def connect(self, sid, environ, auth=None):
        claimed = auth.get("device_id") if isinstance(auth, dict) else None
        identity = claimed if isinstance(claimed, str) and claimed else "anonymous"
        now = time.monotonic()
        if self.limiter.quarantined.get(identity, 0) > now:
            raise socketio.exceptions.ConnectionRefusedError("quarantined")
        flapping = self.limiter.flapping(identity, now)
        try:
            device_id = self._authenticate(auth)
        except socketio.exceptions.ConnectionRefusedError:
            if flapping:  # an unknown identity that flaps is shut out for a while
                self.limiter.quarantined[identity] = now + self.behaviour.quarantine_s
                log.info("quarantining identity %s: flapping with bad credentials", identity)
            raise
        if self.cluster_node is not None and self.cluster_node.dials_back(device_id, now):
            log.info("device %s asked to move dialed this node again; refused, its session "
                     "here stays", device_id)
            # for now, not the credentials: the device keeps its token and waits
            raise socketio.exceptions.ConnectionRefusedError(
                "rebalancing: another node",
                {"retry_after_s": self.cluster_node.dial_back_retry(device_id, now)})
        if self.behaviour.refuse_for_now_s:
            raise socketio.exceptions.ConnectionRefusedError(
                "busy", {"retry_after_s": self.behaviour.refuse_for_now_s})
        if self.behaviour.connect_delay_s:
            await asyncio.sleep(self.behaviour.connect_delay_s)
        self._keep_alive(sid, environ)
        dev = self.registry.attach(sid, device_id)
        self.commands.resend_unreceived(sid, dev)
        if self.behaviour.reconnect_window_s:
            asyncio.get_running_loop().create_task(self.sio.emit(
                RECONNECT_WINDOW, {"window_s": self.behaviour.reconnect_window_s}, to=sid))
        if flapping:
            self.limiter.throttled[device_id] = self.limiter.throttled.get(device_id, 0) + 1
            asyncio.get_running_loop().create_task(self.sio.emit(
                THROTTLE, {"retry_after_s": self.behaviour.throttle_s}, to=sid))

    async def drain(self) -> None:
        """SIGTERM, make before break (docs/PROTOCOL.md, "Drain"): no new connection
        comes here any more (serving.py closed the listener), every device is told
        server:drain, and this node serves on until each has moved or the window and
        its margin are over; then it stops, and what is left is cut as before."""
        window = self.behaviour.drain_window_s
        if not window:
            return
        self.draining = True
        sids = list(self.registry.by_sid)
        log.info("draining: %d connections told to move within %gs", len(sids), window)
        for sid in sids:
            await self.sio.emit(DRAIN, {"window_s": window}, to=sid)
        until = time.monotonic() + window + DRAIN_MARGIN_S
        while self.registry.by_sid and time.monotonic() < until:
            await asyncio.sleep(0.05)
        log.info("drained: %d connections left", len(self.registry.by_sid))

    def _authenticate(self, auth) -> str:
        if not isinstance(auth, dict):
            raise socketio.exceptions.ConnectionRefusedError("unauthorized")
        device_id, token = auth.get("device_id"), auth.get("token")
        if not isinstance(device_id, str) or not isinstance(token, str) or not device_id:
            raise socketio.exceptions.ConnectionRefusedError("unauthorized")
        if not self.registry.admits(device_id, token):
            self.registry.device(device_id).refused += 1
            raise socketio.exceptions.ConnectionRefusedError("unauthorized")
        return device_id

    def _keep_alive(self, sid: str, environ: dict) -> None:
        request = environ.get("aiohttp.request")
        transport = request.transport if request is not None else None
        if transport is None:
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # The server must notice dead peers by itself too.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 30)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 10)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
        self.registry.transports[sid] = transport

    async def disconnect(self, sid, *args):
        self.registry.detach(sid)

    async def heartbeat(self, sid, data=None):
        """device:heartbeat; the ACK (the return value) is what Behaviour.ack_mode says."""
        dev = self.registry.device_of(sid)
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

    async def report(self, sid, data=None):
        dev = self.registry.device_of(sid)
        if dev is None or not isinstance(data, dict) or not isinstance(
                data.get("connections"), list):
            return {"ok": False, "error": "bad report"}
        dev.reports.extend(c for c in data["connections"][:100] if isinstance(c, dict))
        return {"ok": True}

    async def event(self, sid, data=None):
        dev = self.registry.device_of(sid)
        if dev is None or not isinstance(data, dict) or not isinstance(data.get("type"), str):
            return {"ok": False, "error": "bad event"}
        # a resend (its ACK lost with a connection, a drain's switch) is stored once:
        # the id is increasing within one agent process, its ts tells processes apart
        key = (data.get("id"), data.get("ts"))
        if key in dev._event_keys:
            dev.event_repeats += 1
            return {"ok": True}
        if len(dev._event_keys) < 100_000:
            dev._event_keys.add(key)
        dev.events.append(data)
        return {"ok": True}

    async def start_reaper(self, _app) -> None:
        self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for dev in self.registry.devices.values():
                if (dev.online and dev.last_heartbeat is not None
                        and now - dev.last_heartbeat > self.behaviour.heartbeat_timeout_s):
                    dev.online = False
                    log.info("device %s offline: no heartbeat for %.0fs; closing its socket",
                             dev.device_id, now - dev.last_heartbeat)
                    for sid in list(dev.sids):
                        self.registry.close(sid)
