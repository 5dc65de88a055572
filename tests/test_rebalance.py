"""The reference fleet server's rebalancing: its rule (fleet_server/rebalance.py), sans
I/O: how many devices a node asks to move from the live counts, and when it may judge,
with a fake clock; and its shell (fleet_server/cluster_node.py) on a stand-in Redis.
The real cluster: tests/test_rolling_deploy.py."""
import asyncio
import math
import random
import time

import pytest
import socketio

from agent.link.protocol import DRAIN
from fleet_server.__main__ import parse_args
from fleet_server.behaviour import Behaviour
from fleet_server.cluster_node import (DIAL_BACK_RETRY_S, KEY_PREFIX, KEY_TTL_S, MOVE_MARGIN_S,
                                       MAX_ASKS_PER_ROUND, NODES_KEY, PRUNE_AFTER_S,
                                       ClusterNode, RebalanceSettings,
                                       parse_count)
from fleet_server.commands import Commands
from fleet_server.devices import Registry
from fleet_server.rebalance import Rebalance, excess
from fleet_server.sessions import Sessions


@pytest.mark.parametrize("mine, others, moves", [
    (40, [0], 20),          # the rolling deploy's end: half of them
    (41, [0], 20),          # odd total: 21/20, never 20/21
    (0, [40], 0),           # the light node asks nothing
    (20, [20], 0),          # equal
    (21, [20], 0),          # odd total, already even
    (22, [18], 0),          # within the tolerance (10 % of the fair share)
    (23, [17], 3),          # past it: down to the share, not to the tolerance's edge
    (24, [16], 4),          # 60/40 is past it too
    (40, [], 0),            # one node: nowhere to go
    (3, [0], 1), (2, [0], 1), (1, [0], 0),   # a handful of screens
    (30, [0, 0], 20),       # three nodes: down to the share, the rest for the others
    (12, [12, 6], 2),       # two heavy nodes judging at once: 2 + 2, what the light lacks
    (12, [12, 9], 0),       # 12 of 33: within the tolerance of 11
    (10, [-5, 0], 6),       # a nonsense count is taken as none
])
def test_the_excess_is_what_brings_the_node_down_to_its_share(mine, others, moves):
    assert excess(mine, others) == moves


def test_nodes_judging_at_once_never_move_more_than_the_light_ones_lack():
    for a in range(60):
        for b in range(60):
            for c in range(20):
                counts = [a, b, c]
                share = math.ceil(sum(counts) / 3)
                moves = [excess(x, counts[:i] + counts[i + 1:]) for i, x in enumerate(counts)]
                assert sum(moves) <= sum(max(0, share - x) for x in counts), counts
                assert all(x - m >= min(x, share) for x, m in zip(counts, moves)), counts


def test_a_new_node_is_trusted_after_the_settle_and_a_move_quiets_the_window_and_settle():
    r = Rebalance(window_s=4.0, settle_s=3.0)
    assert r.judge(0.0, 40, {"b": 0}) == 0            # b just appeared: not in rotation yet
    assert r.judge(2.9, 40, {"b": 0}) == 0
    assert r.judge(3.0, 40, {"b": 0}) == 20           # trusted: the excess, once
    for t in (3.5, 5.0, 9.9):                         # the moves land: no second ask
        assert r.judge(t, 40, {"b": 0}) == 0
    assert r.judge(10.0, 30, {"b": 10}) == 10         # window + settle later: judged again
    assert r.judge(10.5, 20, {"b": 20}) == 0


def test_a_node_that_goes_and_comes_back_waits_its_settle_again():
    r = Rebalance(window_s=4.0, settle_s=3.0)
    assert r.judge(0.0, 40, {}) == 0                  # alone
    assert r.judge(1.0, 40, {"b1": 0}) == 0
    assert r.judge(2.0, 40, {}) == 0                  # its key expired: forgotten
    assert r.judge(3.0, 40, {"b2": 0}) == 0           # restarted: a new id, a new settle
    assert r.judge(5.9, 40, {"b2": 0}) == 0
    assert r.judge(6.0, 40, {"b2": 0}) == 20


def test_an_untrusted_node_counts_for_nothing_yet():
    r = Rebalance(window_s=4.0, settle_s=3.0)
    r.judge(0.0, 30, {"b": 0})
    assert r.judge(3.0, 30, {"b": 0, "c": 0}) == 15   # c just appeared: the share of two


# -- the shell (fleet_server/cluster_node.py), on a stand-in Redis and a fake clock -------

class FakeRedis:
    """The four calls the node makes; a key's TTL runs on the test's clock."""

    def __init__(self, clock):
        self.clock, self.keys, self.sets = clock, {}, {}
        self.exchanges = 0   # round trips to Redis (a SCAN is one per page of `count`)

    def _alive(self, key):
        return key in self.keys and self.keys[key][1] > self.clock()

    async def set(self, key, value, ex):
        self.exchanges += 1
        self.keys[key.encode()] = (str(value).encode(), self.clock() + ex)

    async def scan_iter(self, match, count):
        for i, (key, (_, until)) in enumerate(list(self.keys.items())):
            if i % count == 0:
                self.exchanges += 1
            if until > self.clock() and key.startswith(match.rstrip("*").encode()):
                yield key

    async def mget(self, keys):
        self.exchanges += 1
        keys = [k.encode() if isinstance(k, str) else k for k in keys]
        return [self.keys[k][0] if self._alive(k) else None for k in keys]

    async def delete(self, key):
        self.exchanges += 1
        self.keys.pop(key.encode(), None)

    async def sadd(self, key, *members):
        self.exchanges += 1
        self.sets.setdefault(key, set()).update(m.encode() for m in members)

    async def srem(self, key, *members):
        self.exchanges += 1
        self.sets.get(key, set()).difference_update(m.encode() for m in members)

    async def srandmember(self, key, number):
        self.exchanges += 1
        return list(self.sets.get(key, set()))[:number]


class FakeSio:
    def __init__(self):
        self.emits = []

    async def emit(self, event, data, to):
        self.emits.append((event, data, to))


def _node(clock, redis, devices: int, prefix: str):
    registry = Registry(None, accept_any=True)
    for i in range(devices):
        registry.attach(f"{prefix}-sid-{i}", f"{prefix}-{i}")
    node = ClusterNode(FakeSio(), registry, "redis://unused", RebalanceSettings(4.0, 3.0),
                       rng=random.Random(7), client=redis, clock=clock)
    return node


def test_the_heavy_node_asks_its_excess_once_the_light_one_is_trusted_and_refuses_a_dial_back():
    now = [100.0]
    redis = FakeRedis(lambda: now[0])
    a, b = _node(lambda: now[0], redis, 40, "a"), _node(lambda: now[0], redis, 0, "b")

    def second():
        for node in (a, b):
            asyncio.run(node._round())
        now[0] += 1.0
    for _ in range(4):
        second()
    assert a.sio.emits == []                 # b seen at 100, trusted from 103
    second()
    assert len(a.sio.emits) == 20 and b.sio.emits == []
    assert {e for e, _, _ in a.sio.emits} == {DRAIN}
    assert all(d == {"window_s": 4.0, "reason": "rebalance"} for _, d, _ in a.sio.emits)
    assert len({to for _, _, to in a.sio.emits}) == 20   # twenty devices, each once
    asked = a.registry.by_sid[a.sio.emits[0][2]]
    kept = next(d for d in a.registry.devices if d not in a.moving)
    assert a.dials_back(asked, now[0]) and not a.dials_back(kept, now[0])
    assert not a.dials_back(asked, now[0] + 4.0 + 2.0)   # the window and its margin over
    for _ in range(6):
        second()
    assert len(a.sio.emits) == 20            # quiet for the window and the settle


def test_a_draining_node_leaves_at_once_and_a_dead_one_with_its_ttl():
    now = [0.0]
    redis = FakeRedis(lambda: now[0])
    a, b = _node(lambda: now[0], redis, 30, "a"), _node(lambda: now[0], redis, 10, "b")
    asyncio.run(a._round())
    asyncio.run(b._round())
    assert asyncio.run(a._others()) == {b.node_id: 10}
    asyncio.run(b.leave())
    assert asyncio.run(a._others()) == {}
    asyncio.run(b._round())                  # back, then dead without a word
    now[0] += KEY_TTL_S
    assert asyncio.run(a._others()) == {}


def test_a_count_that_is_not_one_leaves_that_node_out(caplog):
    redis = FakeRedis(lambda: 0.0)
    a = _node(lambda: 0.0, redis, 3, "a")
    for name, value in (("x", "lots"), ("y", "-4"), ("z", "\x1b[31m99")):
        redis.keys[(KEY_PREFIX + name).encode()] = (value.encode(), 10.0)
        asyncio.run(redis.sadd(NODES_KEY, name))
    asyncio.run(redis.sadd(NODES_KEY, "w"))
    asyncio.run(redis.set(KEY_PREFIX + "w", 5, 10))
    assert asyncio.run(a._others()) == {"w": 5}
    assert asyncio.run(a._others()) == {"w": 5}
    said = [r.getMessage() for r in caplog.records if "not a device count" in r.getMessage()]
    assert len(said) == 3 and not any("\x1b" in line for line in said)   # once each
    assert parse_count(b"12") == 12 and parse_count(b"123456789") is None
    assert parse_count(None) is None and parse_count(b"") is None


@pytest.mark.parametrize("argv, says", [
    (["--rebalance", "4"], "--rebalance: needs --redis"),
    (["--redis", "redis://x", "--rebalance", "2000"], "--rebalance: a window of 0 to 900"),
    (["--redis", "redis://x", "--rebalance", "nan"], "--rebalance: a window"),
    (["--redis", "redis://x", "--rebalance", "4", "--profile", "screentinker"],
     "the edge-agent profile only"),
    (["--redis", "redis://x", "--rebalance", "4", "--rebalance-tolerance", "3"],
     "--rebalance-tolerance: 0 to 1"),
])
def test_a_bad_rebalance_option_is_one_line_naming_it(argv, says, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert says in err, err


def test_rebalancing_is_off_unless_asked():
    args, _ = parse_args(["--redis", "redis://x"])
    assert args.rebalance == 0


def test_a_device_asked_to_move_that_dials_back_is_refused_and_its_live_session_kept():
    """Accepted, its new connection would close the live one (one session per device):
    round robin sent 15 of 20 moves back in a trial without this, 15 links lost."""
    now = [0.0]
    node = _node(lambda: now[0], FakeRedis(lambda: now[0]), 2, "a")
    registry, sio = node.registry, node.sio
    sessions = Sessions(sio, Behaviour(), registry, Commands(sio, Behaviour(), registry))
    sessions.cluster_node = node
    node.moving["a-0"] = time.monotonic() + 10
    with pytest.raises(socketio.exceptions.ConnectionRefusedError):
        asyncio.run(sessions.connect("a-sid-new", {}, {"device_id": "a-0", "token": "t"}))
    assert registry.devices["a-0"].sids == {"a-sid-0"}
    asyncio.run(sessions.connect("a-sid-new", {}, {"device_id": "a-1", "token": "t"}))
    assert registry.devices["a-1"].sids == {"a-sid-new"}   # not asked: as ever


def test_a_dial_back_is_told_to_wait_seconds_not_the_rest_of_the_move():
    """The only device that heeds the refusal's retry_after_s is one whose link is down
    from its side (a move's own dial-back is dropped, whatever it says) while this node
    still holds its session: a half-open one, reaped within the heartbeat timeout. Told
    the rest of the move (up to the 900 s window and its margin), it stayed off that
    long after the stale session was gone; a few seconds is enough to be asked again."""
    now = [0.0]
    node = _node(lambda: now[0], FakeRedis(lambda: now[0]), 1, "a")
    registry, sio = node.registry, node.sio
    sessions = Sessions(sio, Behaviour(), registry, Commands(sio, Behaviour(), registry))
    sessions.cluster_node = node
    node.moving["a-0"] = time.monotonic() + 900 + MOVE_MARGIN_S
    with pytest.raises(socketio.exceptions.ConnectionRefusedError) as refused:
        asyncio.run(sessions.connect("a-sid-new", {}, {"device_id": "a-0", "token": "t"}))
    later = refused.value.error_args["data"]["retry_after_s"]
    assert 1.0 <= later <= DIAL_BACK_RETRY_S <= 10.0, later


def test_a_round_is_a_few_exchanges_with_redis_however_many_keys_it_holds():
    """The Redis the nodes share may hold anything else: a SCAN of its whole keyspace
    each second took 1.6 s a round with a million other keys (measured on redis-server),
    so a count was published every 2.6 s against its 3 s TTL; two million and the round
    outran its bound, and no node was ever judged. A round reads the nodes, not the keys."""
    now = [0.0]
    redis = FakeRedis(lambda: now[0])
    for i in range(100_000):
        redis.keys[f"other:{i}".encode()] = (b"x", math.inf)
    a, b = _node(lambda: now[0], redis, 30, "a"), _node(lambda: now[0], redis, 10, "b")
    asyncio.run(b._round())
    redis.exchanges = 0
    asyncio.run(a._round())
    assert redis.exchanges <= 5, redis.exchanges
    assert asyncio.run(a._others()) == {b.node_id: 10}
    now[0] += KEY_TTL_S                      # b dead without a word: its key expired
    asyncio.run(a._round())
    assert asyncio.run(a._others()) == {}


def test_a_node_that_keeps_dying_after_taking_moves_is_sent_fewer_and_fewer():
    """A node in a crash loop (up 8 s, past the settle; down 2 s; a new id each start)
    took a third of the screens each time it was trusted, and lost them when it died:
    7200 moves and as many links lost in an hour for 60 screens. A node that dies (its
    key expired) while moves land is a failed move: the quiet after it doubles (to
    15 min)."""
    ra, rb = Rebalance(4.0, 5.0), Rebalance(4.0, 5.0)
    a, b, c, cid, moved, alive = 30, 30, 0, 0, 0, True
    for second in range(3600):
        t = float(second)
        if alive and t % 10 >= 8:                  # it dies; its screens come back to a, b
            alive, a, b, c = False, a + c // 2, b + c - c // 2, 0
        elif not alive and t % 10 < 8:
            alive, cid = True, cid + 1
        with_c = {f"c{cid}": c} if alive else {}
        died = {f"c{n}" for n in range(cid + 1)} - set(with_c)   # their keys expired
        ma = ra.judge(t, a, {"b": b, **with_c}, died)
        mb = rb.judge(t, b, {"a": a, **with_c}, died)
        if alive:                                  # leastconn: the moves land on c
            a, b, c, moved = a - ma, b - mb, c + ma + mb, moved + ma + mb
    assert moved <= 400, moved
    # a node that drains (its key deleted, not expired) is no failed move, even while
    # the moves land: a rolling deploy restarts the next node right after
    r = Rebalance(4.0, 5.0)
    r.judge(0.0, 40, {"b": 0, "c": 0})
    assert r.judge(5.0, 40, {"b": 0, "c": 0}) == 26
    r.judge(6.0, 14, {"b": 13})              # c drains
    assert r.judge(14.0, 14, {"b": 26}) == 0 and r.judge(19.0, 14, {"b": 26, "c2": 0}) == 0
    assert r.failed == 0


def test_a_round_asks_a_bounded_number_of_moves_the_rest_at_the_next_judgment():
    """Each ask is an emit through the Redis adapter (20000 took 5.3 s on redis-server):
    a node with thousands to move outran the round's 4 s bound, was cut mid-ask, logged
    "Redis did not answer" and, not publishing meanwhile, left the others' view. A round
    asks at most MAX_ASKS_PER_ROUND; the next judgment, a window and a settle later,
    asks what is left of the excess then."""
    now = [100.0]
    redis = FakeRedis(lambda: now[0])
    a, b = _node(lambda: now[0], redis, 6000, "a"), _node(lambda: now[0], redis, 0, "b")
    for _ in range(5):
        for node in (a, b):
            asyncio.run(node._round())
        now[0] += 1.0
    assert len(a.sio.emits) == MAX_ASKS_PER_ROUND <= 2000
    for _ in range(9):                       # the window and the settle: quiet
        for node in (a, b):
            asyncio.run(node._round())
        now[0] += 1.0
    assert len(a.sio.emits) == 2 * MAX_ASKS_PER_ROUND


def test_the_shell_tells_a_node_that_died_from_one_that_drained_and_prunes_the_dead():
    now = [100.0]
    redis = FakeRedis(lambda: now[0])
    a = _node(lambda: now[0], redis, 40, "a")
    b, c = _node(lambda: now[0], redis, 0, "b"), _node(lambda: now[0], redis, 0, "c")

    def second(*nodes):
        for node in nodes:
            asyncio.run(node._round())
        now[0] += 1.0
    for _ in range(5):
        second(a, b, c)
    assert a.rule.quiet_until > now[0]           # a asked its moves
    asyncio.run(c.leave())                       # c drains: it left
    second(a, b)
    b_dies = now[0]                              # b dies: its key expires
    for _ in range(KEY_TTL_S + 1):
        second(a)
    assert a.rule.failed == 1
    assert b.node_id.encode() in redis.sets[NODES_KEY]   # the others see it died too
    while now[0] < b_dies + KEY_TTL_S + PRUNE_AFTER_S + 2:
        second(a)
    assert redis.sets[NODES_KEY] == {a.node_id.encode()}
