"""This node among the cluster's, rebalancing (``fleet-server --redis URL --rebalance N``):
every second it publishes its live device count in the Redis the nodes already share (a
key per node with a short TTL, so a node that dies drops out; a draining node deletes
its own at once; the ids in one set, so a round never scans the Redis), reads the other nodes', and asks rebalance.py how many of its devices
to move. Those, picked at random, are told ``server:drain {"window_s": N, "reason":
"rebalance"}`` (docs/PROTOCOL.md): each moves make before break at a jittered moment of
the window, its new connection opened while the old one still counts here, so a
balancer that sends a new connection to the node with the fewest (haproxy's `balance
leastconn`) lands it on a lighter node. One that dials back here while its session here
is live is refused (a second session of one device is never held), and stays."""
from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from dataclasses import dataclass

import redis.asyncio as aioredis
import socketio
from redis.exceptions import RedisError

from agent.link.protocol import DRAIN

from fleet_server.devices import Registry
from fleet_server.rebalance import TOLERANCE, Rebalance

log = logging.getLogger("fleet_server")

KEY_PREFIX = "fleet-server:live-devices:"
# the ids of the nodes (a set): a round reads those keys, never a SCAN of the Redis, which
# may hold anything else (a million other keys: 1.6 s a round, past the key's TTL)
NODES_KEY = "fleet-server:nodes"
PUBLISH_EVERY_S = 1.0
KEY_TTL_S = 3               # three publications missed: the node is gone
REDIS_TIMEOUT_S = 2.0       # each exchange with Redis
MAX_NODES = 64              # nodes read per round
PRUNE_AFTER_S = 30.0        # a dead node's id leaves the set once gone this long
# moves asked per round, at most: each is an emit through the Redis adapter (20000 took
# 5.3 s, past the round's bound); the rest of the excess is judged again a window later
MAX_ASKS_PER_ROUND = 1000
MAX_COUNT = 10_000_000
WINDOW_MAX_S = 15 * 60.0    # the agent's own bound on a drain's window
MOVE_MARGIN_S = 2.0         # a device asked to move is refused here this long past the window
DIAL_BACK_RETRY_S = 5.0     # the retry_after_s such a refusal says, at most (dial_back_retry)


@dataclass(frozen=True)
class RebalanceSettings:
    window_s: float
    settle_s: float = 5.0
    tolerance: float = TOLERANCE


def parse_count(raw) -> int | None:
    """A node's published count, or None if it is not a plain count."""
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
    if not isinstance(text, str) or not text.isdigit() or len(text) > 8:
        return None
    count = int(text)
    return count if count <= MAX_COUNT else None


class ClusterNode:
    def __init__(self, sio: socketio.AsyncServer, registry: Registry, redis_url: str,
                 settings: RebalanceSettings, rng: random.Random | None = None,
                 client=None, clock=time.monotonic):
        """``client``, ``clock``: a stand-in Redis and clock (the tests')."""
        self.sio = sio
        self.registry = registry
        self.settings = settings
        self.node_id = uuid.uuid4().hex[:12]   # a restarted node is a new one
        self.key = KEY_PREFIX + self.node_id
        self.rule = Rebalance(settings.window_s, settings.settle_s, settings.tolerance)
        self.rng = rng or random.Random()
        self.moving: dict[str, float] = {}     # device -> until (monotonic)
        self.clock = clock
        self.redis = client or aioredis.from_url(redis_url, socket_timeout=REDIS_TIMEOUT_S,
                                                 socket_connect_timeout=REDIS_TIMEOUT_S)
        self._task: asyncio.Task | None = None
        self._failing = False
        self._bad_keys: set[str] = set()
        self._gone_since: dict[str, float] = {}   # dead nodes' ids, until pruned
        self.died: set[str] = set()               # of the last _others(): keys expired

    async def start(self, _app) -> None:
        log.info("rebalance: node %s shares its live count; window %gs, settle %gs, "
                 "tolerance %g", self.node_id, self.settings.window_s,
                 self.settings.settle_s, self.settings.tolerance)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def leave(self) -> None:
        """A draining node: no more judging, and its count leaves the cluster now."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        try:
            await asyncio.wait_for(self.redis.delete(self.key), REDIS_TIMEOUT_S)
            await asyncio.wait_for(self.redis.srem(NODES_KEY, self.node_id), REDIS_TIMEOUT_S)
        except (RedisError, OSError, asyncio.TimeoutError) as e:
            log.warning("rebalance: could not take node %s's count out (%s); it expires "
                        "within %ds", self.node_id, _one_line(e), KEY_TTL_S)

    async def close(self, _app) -> None:
        await self.leave()
        closing = getattr(self.redis, "aclose", None) or self.redis.close   # redis < 5: close
        await closing()

    def dials_back(self, device_id: str, now: float) -> bool:
        """A device asked to move that dialed this node again while its session here is
        live: to accept it would close that session (one session per device)."""
        dev = self.registry.devices.get(device_id)
        return self.moving.get(device_id, 0.0) > now and dev is not None and bool(dev.sids)

    def dial_back_retry(self, device_id: str, now: float) -> float:
        """The retry_after_s of a dial-back's refusal: a move's own dial-back is dropped
        whatever it says, so only a device whose link is down from its side heeds it,
        while this node still holds its session (a half-open one, until it is reaped):
        seconds, not the rest of the move, or it stays off long after that."""
        return max(1.0, round(min(DIAL_BACK_RETRY_S, self.moving[device_id] - now), 1))

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._round(), REDIS_TIMEOUT_S * 2)
                if self._failing:
                    log.info("rebalance: Redis answers again")
                self._failing = False
            except (RedisError, OSError, asyncio.TimeoutError) as e:
                if not self._failing:
                    log.warning("rebalance: Redis did not answer (%s); not judging until "
                                "it does", _one_line(e))
                self._failing = True
            await asyncio.sleep(PUBLISH_EVERY_S)

    async def _round(self) -> None:
        live = [d for d, dev in self.registry.devices.items() if dev.sids]
        await self.redis.set(self.key, len(live), ex=KEY_TTL_S)
        await self.redis.sadd(NODES_KEY, self.node_id)
        nodes = await self._others()
        now = self.clock()
        moves = self.rule.judge(now, len(live), nodes, self.died)
        if moves:
            await self._ask(moves, live, nodes, now)

    async def _others(self) -> dict[str, int]:
        members = await self.redis.srandmember(NODES_KEY, MAX_NODES + 1)
        keys = []
        for member in members or ():
            name = member.decode("ascii", "replace") if isinstance(member, bytes) else str(member)
            if name != self.node_id:
                keys.append((KEY_PREFIX + name, name))
        keys = keys[:MAX_NODES]
        values = await self.redis.mget([k for k, _ in keys]) if keys else []
        nodes, now = {}, self.clock()
        # a key expired while its id is still in the set: that node died (one that
        # drains takes both out); the id stays a while, so every node sees it died
        self.died = {name for (_, name), raw in zip(keys, values) if raw is None}
        self._gone_since = {n: self._gone_since.get(n, now) for n in self.died}
        gone = [n for n, since in self._gone_since.items() if now - since >= PRUNE_AFTER_S]
        for (_, name), raw in zip(keys, values):
            count = parse_count(raw)
            if count is not None:
                nodes[name] = count
            elif raw is not None and name not in self._bad_keys and len(self._bad_keys) < MAX_NODES:
                self._bad_keys.add(name)
                log.warning("rebalance: %s%s is not a device count (%r); that node is left "
                            "out", KEY_PREFIX, name.encode("ascii", "replace").decode(),
                            raw[:40] if isinstance(raw, bytes) else raw)
        if gone:
            await self.redis.srem(NODES_KEY, *gone)
        return nodes

    async def _ask(self, moves: int, live: list[str], nodes: dict[str, int],
                   now: float) -> None:
        window = self.settings.window_s
        self.moving = {d: until for d, until in self.moving.items() if until > now}
        candidates = sorted(d for d in live if d not in self.moving)
        chosen = self.rng.sample(candidates, min(moves, len(candidates), MAX_ASKS_PER_ROUND))
        log.info("rebalance: %d devices here, %s on the other nodes; asking %d to move "
                 "within %gs%s", len(live), sorted(nodes.values())[:MAX_NODES], len(chosen),
                 window, f" ({moves} over the share: the rest later)" if moves > len(chosen)
                 else "")
        for device_id in chosen:
            self.moving[device_id] = now + window + MOVE_MARGIN_S
            for sid in list(self.registry.devices[device_id].sids):
                await self.sio.emit(DRAIN, {"window_s": window, "reason": "rebalance"},
                                    to=sid)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:200] or type(error).__name__
