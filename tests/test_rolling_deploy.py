"""A rolling deploy of the cluster (#54): 40 screens behind haproxy, two reference
fleet servers with the Redis adapter (devtools/cluster.py), node A SIGTERMed with a 4 s
drain window and restarted, then node B (devtools/bench/rolling_deploy.py). Each screen
of a draining node opens its new connection at a jittered moment within the window,
proves it, and only then closes the old one: no link lost, no heartbeat gap past
hb + ack, never two sessions of a screen on a node, the moves spread over the window.
Once node B is back the nodes rebalance (fleet-server --rebalance, haproxy leastconn):
node A, holding all 40, asks its excess to move the same way, and they land on B."""
import pytest

from devtools.bench import rolling_deploy as R

pytestmark = pytest.mark.netns

HB, ACK, WINDOW = 2.0, 1.0, 4.0
SETTLE = 4.0   # B trusted this long after it is seen back; then the moves, within WINDOW


def test_a_rolling_deploy_at_40_screens_loses_no_link_and_misses_no_heartbeat(tmp_path):
    d = R.trial(tmp_path / "deploy", agents=40, hb=HB, ack=ACK, window_s=WINDOW,
                rebalance_s=WINDOW, settle_s=SETTLE)
    assert not d.error, d.error
    moved = [s for per_node in d.moved_s.values() for s in per_node.values()]
    known = [s for s in moved if s is not None] or [0.0]
    gaps = [g for g in d.widest_gap_s.values() if g is not None] or [0.0]
    print(f"\nmoved {len(known)} of {len(moved)} screens: {min(known):.2f}-{max(known):.2f} s "
          f"after SIGTERM; nodes stopped after {d.stopped_s} s; widest heartbeat gap "
          f"{max(gaps):.2f} s; losses {d.losses}, failed moves {d.failed_moves}; "
          f"at the end {d.split}, within 60/40 {d.balanced_s} s after B was back, its "
          f"moves arriving {d.rebalanced_s[:1]}-{d.rebalanced_s[-1:]} s after")
    assert None not in moved, d.moved_s
    assert len(d.moved_s[1]) == 40, d.moved_s   # node B held every screen when it drained
    assert d.losses == 0 and d.failed_moves == 0, d
    assert not d.two_sessions, d.two_sessions
    assert max(d.widest_gap_s.values()) <= HB + ACK, d.widest_gap_s
    # spread over the window, not in one burst: a quarter of the window apart at least
    assert max(moved) <= WINDOW and max(moved) - min(moved) >= WINDOW / 4, moved
    assert all(s <= WINDOW + 2.0 + 1.0 for s in d.stopped_s), d.stopped_s
    # and the fleet ends spread over both nodes, within 60/40, in a bounded time: B
    # seen and trusted (a publication, the settle), then the moves within the window
    assert sum(d.split) == 40 and max(d.split) <= 24, d.split
    assert d.balanced_s is not None and d.balanced_s <= SETTLE + 1.0 + WINDOW + 2.0, d
    assert len(d.rebalanced_s) <= 21, d.rebalanced_s   # never more than the excess (+1 rounding)
