"""Reference fleet server (python-socketio on aiohttp): builds the app from its parts and
maps every Socket.IO event and HTTP route to the part that answers it.

It implements the server side of docs/PROTOCOL.md and behaves the way the field
reports say a fleet server should: SO_KEEPALIVE on every accepted socket, and when
it marks a device offline it also closes that device's socket. The parts, each in its
module: devices (records, credentials, sockets), sessions (connections, heartbeats,
reports, events, the flap limiter, the reaper), commands, uploads, enrollment, the
operator and admin API (operator_api), and the ScreenTinker emulation (screentinker).
"""
from __future__ import annotations

import socketio
from aiohttp import web

from agent.link.protocol import COMMAND_RESULT, EVENT, HEARTBEAT, REPORT

from fleet_server import screentinker
from fleet_server.behaviour import Behaviour
from fleet_server.cluster_node import ClusterNode, RebalanceSettings
from fleet_server.commands import Commands
from fleet_server.devices import Registry
from fleet_server.enrollment import Enrollment
from fleet_server.operator_api import OperatorApi
from fleet_server.releases import Releases
from fleet_server.sessions import Sessions
from fleet_server.uploads import MAX_UPLOAD_BYTES, Uploads

MAX_PAYLOAD_BYTES = 64 * 1024


class FleetServer:
    def __init__(self, tokens: dict[str, str] | None = None, accept_any: bool = False,
                 ping_interval: float = 25, ping_timeout: float = 20,
                 behaviour: Behaviour | None = None, profile: str = "edge-agent",
                 redis_url: str | None = None, rebalance: RebalanceSettings | None = None):
        """``redis_url``: one node of a cluster, its Socket.IO emits shared with the
        other nodes through Redis (the Redis adapter, as a fleet of several nodes runs).
        ``rebalance`` (with ``redis_url``): the nodes share their live counts there, and
        a node above its fair share asks its excess to move (cluster_node.py)."""
        self.behaviour = behaviour or Behaviour()
        self.profile = profile
        self.registry = Registry(tokens, accept_any)
        # the ScreenTinker emulation keeps its devices in the same registry through these
        self.tokens, self.devices = self.registry.tokens, self.registry.devices
        self.by_sid, self.transports = self.registry.by_sid, self.registry.transports
        self.attach_device = self.registry.attach
        self.sio = socketio.AsyncServer(async_mode="aiohttp", ping_interval=ping_interval,
                                        ping_timeout=ping_timeout,
                                        max_http_buffer_size=MAX_PAYLOAD_BYTES,
                                        cors_allowed_origins=[],
                                        client_manager=(socketio.AsyncRedisManager(redis_url)
                                                        if redis_url else None))
        self.app = web.Application(client_max_size=MAX_UPLOAD_BYTES)
        self.sio.attach(self.app)
        self.commands = Commands(self.sio, self.behaviour, self.registry)
        self.sessions = Sessions(self.sio, self.behaviour, self.registry, self.commands)
        self.uploads = Uploads(self.behaviour, self.registry)
        self.enrollment = Enrollment(self.behaviour, self.registry)
        self.releases = Releases(self.behaviour)
        self.operator = OperatorApi(self)
        self._routes()
        self._events()
        self.app.on_startup.append(self.sessions.start_reaper)
        self.cluster_node: ClusterNode | None = None
        if rebalance is not None and redis_url:
            self.cluster_node = ClusterNode(self.sio, self.registry, redis_url, rebalance)
            self.sessions.cluster_node = self.cluster_node
            self.app.on_startup.append(self.cluster_node.start)
            self.app.on_cleanup.append(self.cluster_node.close)
        if profile == "screentinker":
            screentinker.attach(self)

    async def drain(self) -> None:
        """SIGTERM: out of the cluster's counts first (no node moves devices here any
        more, this one judges no more), then the sessions' drain."""
        if self.cluster_node is not None:
            await self.cluster_node.leave()
        await self.sessions.drain()

    def _events(self) -> None:
        """The default namespace (the ScreenTinker emulation answers on its own)."""
        on = self.sio.on
        on("connect", self.sessions.connect)
        on("disconnect", self.sessions.disconnect)
        on(HEARTBEAT, self.sessions.heartbeat)
        on(REPORT, self.sessions.report)
        on(EVENT, self.sessions.event)
        on(COMMAND_RESULT, self.commands.result)

    def _routes(self) -> None:
        r, op = self.app.router, self.operator
        r.add_get("/healthz", op.healthz)
        # the device's
        r.add_post("/api/v1/enroll", self.enrollment.enroll)
        r.add_get("/api/v1/enroll/{device_id}", self.enrollment.poll)
        r.add_post("/api/v1/devices/{device_id}/uploads", self.uploads.upload)
        r.add_post("/api/v1/devices/{device_id}/proof-of-play", self.uploads.proof_of_play)
        # the operator's
        r.add_post("/api/v1/pair", op.pair)
        r.add_post("/api/v1/commands", op.queue_command)
        r.add_get("/api/v1/devices/{device_id}/commands", op.device_commands)
        r.add_post("/api/v1/releases", self.releases.publish)
        r.add_get("/releases/{name}", self.releases.fetch)
        # the tests' (and the demo's)
        r.add_get("/admin/devices", op.devices)
        r.add_post("/admin/behaviour", op.set_behaviour)
        r.add_post("/admin/throttle", op.throttle)
        r.add_post("/admin/emit", op.emit)
        r.add_post("/admin/flood", op.flood)
        r.add_post("/admin/revoke", op.revoke)
        r.add_get("/admin/uploads/{device_id}", op.device_uploads)
        r.add_get("/admin/uploads/{device_id}/{upload_id}/content", op.log_bundle)
        r.add_get("/admin/limiter", op.limiter)
        r.add_get("/admin/releases", self.releases.view)
        r.add_get("/admin/screentinker", op.screentinker_tables)
        r.add_post("/admin/screentinker", op.screentinker_tables)
