"""A fleet node that hangs behind the load balancer (issue #36), on a real cluster: two
reference fleet servers behind haproxy (devtools/cluster.py), one frozen with SIGSTOP.
Its kernel still completes TCP handshakes, so an agent whose new connection lands on
it has no answer: before, it waited the connect bound's 4 s floor; now a second dial
after a second reaches the node that answers.

12 agents that race and 12 that never do (the behaviour before), side by side on the
same cluster in the same trial (devtools/bench/hung_node.py). The balancer takes the
frozen node out 1.8 s after the freeze (its health check's verdict, given through its
admin socket at a known moment): the agents that reconnect before then land on it
half the time, and every second dial comes after it.
"""
import pytest

from agent.link.connect_bound import RACE_FLOOR_S
from devtools.bench import hung_node as H

pytestmark = pytest.mark.netns

HB, ACK, BASE = 1.2, 1.0, 0.2
TAKE_OUT_S = 1.8
# the heartbeat deadline, the first backoff step, the race's second, and a margin for
# two cores shared with other runs
BOUND_S = HB + ACK + BASE + RACE_FLOOR_S + 0.5


def test_a_hung_node_costs_the_heartbeat_deadline_and_about_a_second_not_the_connect_floor(
        netns, tmp_path):
    shown = None
    for n in range(4):   # until both kinds had an agent land on the frozen node
        t = H.trial(tmp_path / f"trial-{n}", agents=12, hb=HB, ack=ACK, backoff_base_s=BASE,
                    take_out_after_s=TAKE_OUT_S)
        assert not t.error, t.error
        race, before = t.back_s["race"], t.back_s["no-race"]
        assert race and before and None not in race.values(), t
        assert max(race.values()) <= BOUND_S, (
            f"with the race, an agent was back {max(race.values())} s after the freeze "
            f"(bound {BOUND_S:.1f} s): {t}")
        if t.landed["race"] and t.landed["no-race"]:
            shown = t
            break
    assert shown is not None, "in 4 trials, never did agents of both kinds land on the frozen node"
    worst_before = max(v for v in shown.back_s["no-race"].values() if v is not None)
    # an agent of the old kind that landed on the frozen node waited the 4 s floor
    assert worst_before > BOUND_S, shown
    assert worst_before >= ACK + 4.0, shown
