"""The reference fleet server's rebalancing rule (fleet_server/rebalance.py), sans I/O:
how many devices a node asks to move from the live counts, and when it may judge, with
a fake clock."""
import math

import pytest

from fleet_server.rebalance import Rebalance, excess


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
