import math

import pytest

from agent.link import inbox, protocol as P
from agent.link.profiles.edge_agent import EdgeAgentProfile


@pytest.mark.parametrize("args", [
    (), (None,), ("ok",), ([1],), ({},), ({"seq": "1"},), ({"seq": True},), ({"seq": 1.0},),
    ({"seq": 2},), ({"seq": 1}, {"extra": 1}), ({"seq": 10 ** 30},),
    ({"x": "y" * 5_000_000},),
])
def test_malformed_or_foreign_acks_do_not_count(args):
    ok, why = P.parse_heartbeat_ack(args, 1)
    assert not ok and why
    assert len(why) < 300  # a 5 MB payload must not become a 5 MB log line


def test_the_real_ack_counts():
    assert P.parse_heartbeat_ack(({"seq": 1, "server_ts": 1.5},), 1) == (True, "")


@pytest.mark.parametrize("args, expected", [
    (({"retry_after_s": 30},), 30.0), (({"retry_after_s": 0.5},), 0.5),
    (({"retry_after_s": "30"},), None), (({"retry_after_s": math.nan},), None),
    (({"retry_after_s": math.inf},), None), (({},), None), ((), None), (("x",), None),
    (({"retry_after_s": True},), None),
])
def test_throttle_parsing(args, expected):
    assert P.parse_throttle(args) == expected


def test_heartbeat_payload_shape():
    hb = P.heartbeat(5, 1_700_000_000.123456, 42.04)
    assert hb == {"seq": 5, "ts": 1_700_000_000.123, "uptime_s": 42.0}
    assert set(P.connect_auth("d", "t", "0.1")) == {"device_id", "token", "agent_version", "protocol"}


@pytest.mark.parametrize("payload, expected", [
    ({"window_s": 4}, 4.0),
    # a rebalance's drain (fleet_server/cluster_node.py) names its reason: a field the
    # agent does not know is ignored, the move is the same
    ({"window_s": 4, "reason": "rebalance"}, 4.0),
    ({"window_s": 4, "reason": {"nested": [1, 2]}, "later": True}, 4.0),
    ({"reason": "rebalance"}, None), ({"window_s": -1}, None), ({"window_s": "4"}, None),
])
def test_drain_parsing_takes_the_window_and_ignores_fields_it_does_not_know(payload, expected):
    assert P.parse_drain((payload,)) == expected
    posted = []
    EdgeAgentProfile(None).handlers(posted.append)[P.DRAIN](None, payload)
    assert posted == [inbox.Drain(expected) if expected is not None
                      else inbox.Malformed(P.DRAIN)]


@pytest.mark.parametrize("refusal, later", [
    ({"message": "busy", "data": {"retry_after_s": 2}}, 2.0),
    ({"message": "rebalancing", "data": {"retry_after_s": 0.5}}, 0.5),
    ({"message": "unauthorized"}, None),
    ("unauthorized", None),
    (None, None),
    # a refusal that names retry_after_s is for now whatever its value (a buggy server's
    # string must not unpair its fleet: each screen would wait for a person to pair it);
    # a value that is no number >= 0 holds the least (the throttle's 1 s, the backoff's)
    ({"message": "x", "data": {"retry_after_s": True}}, 0.0),
    ({"message": "x", "data": {"retry_after_s": float("nan")}}, 0.0),
    ({"message": "x", "data": {"retry_after_s": float("inf")}}, 0.0),
    ({"message": "x", "data": {"retry_after_s": -1}}, 0.0),
    ({"message": "x", "data": {"retry_after_s": "2"}}, 0.0),
    ({"message": "x", "data": {"retry_after_s": None}}, 0.0),
    ({"message": "x", "data": {"reason": "busy"}}, None),
    ({"message": "x", "data": [2]}, None),
    ({"message": "x", "retry_after_s": 2}, None),   # not python-socketio's shape
])
def test_a_connect_refused_for_now_says_how_long_anything_else_refuses_the_credentials(
        refusal, later):
    assert P.refused_for_now(refusal) == later
