"""Rebalancing a cluster's screens, sans I/O: how many of this node's live devices to ask
to move (``excess``), and when this node may judge at all (``Rebalance``: a node seen
for too short a time is not trusted to take devices yet, and after asking, the node
waits out the move's window and a settle before it judges again). Time is a number the
caller passes in; the Redis and the emits are cluster_node.py's."""
from __future__ import annotations

import math
from typing import Collection, Iterable

TOLERANCE = 0.1   # above the fair share by more than this fraction of it: move the excess
FAILED_QUIET_MAX_S = 15 * 60.0   # the quiet after failed moves doubles up to this
FAILED_FORGET_S = 3600.0         # failed moves this long ago are forgotten


def excess(mine: int, others: Iterable[int], tolerance: float = TOLERANCE) -> int:
    """How many of ``mine`` to move, given the live counts of the other trusted nodes: 0
    while this node holds at most its fair share (the total over the nodes) widened by
    ``tolerance``; above it, what brings it down to the fair share rounded up, never
    more, so no node is pushed below its own share and two heavy nodes judging at once
    still move no more than the light ones lack."""
    counts = [max(0, int(c)) for c in others]
    mine = max(0, int(mine))
    if not counts or mine == 0:
        return 0
    fair = (mine + sum(counts)) / (len(counts) + 1)
    share = math.ceil(fair)
    if mine <= max(share, fair * (1 + max(0.0, tolerance))):
        return 0
    return mine - share


class Rebalance:
    """When to judge, and the judgment. ``judge`` takes this node's live count and the
    other nodes' (id -> count: those whose key is alive) and says how many to move now.
    A node is trusted ``settle_s`` after it was first seen (a node just started is not
    yet in the balancer's rotation: a move asked now would dial this node again); after
    a move is asked, nothing more for ``window_s + settle_s`` (the moves land, the counts
    are published again), so the counts never swing and no storm is asked; a node that
    dies meanwhile doubles that quiet (``_moves_failed``)."""

    def __init__(self, window_s: float, settle_s: float, tolerance: float = TOLERANCE):
        self.window_s = window_s
        self.settle_s = settle_s
        self.tolerance = tolerance
        self.first_seen: dict[str, float] = {}
        self.quiet_until = -math.inf
        self.failed = 0                  # moves failed in a row: a node died under them
        self._failed_at = -math.inf

    def judge(self, now: float, mine: int, nodes: dict[str, int],
              died: Collection[str] = ()) -> int:
        """``died``: nodes whose key expired (a drained node deletes its own: it left)."""
        for node in [n for n in self.first_seen if n not in nodes]:
            del self.first_seen[node]   # gone (a restart is a new id)
            if node in died and now < self.quiet_until + self.settle_s:
                self._moves_failed(now)
        for node in nodes:
            self.first_seen.setdefault(node, now)
        if now < self.quiet_until:
            return 0
        trusted = [c for n, c in nodes.items() if now - self.first_seen[n] >= self.settle_s]
        moves = excess(mine, trusted, self.tolerance)
        if moves:
            self.quiet_until = now + self.window_s + self.settle_s
        return moves

    def _moves_failed(self, now: float) -> None:
        """A node died while this node's moves were landing (a node in a crash loop
        takes them and dies with them): the next ask waits twice as long as the last."""
        if now - self._failed_at > FAILED_FORGET_S:
            self.failed = 0
        self.failed += 1
        self._failed_at = now
        doubled = (self.window_s + self.settle_s) * 2 ** min(self.failed, 32)
        self.quiet_until = max(self.quiet_until, now + min(FAILED_QUIET_MAX_S, doubled))
