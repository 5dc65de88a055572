"""How long a connect may go unanswered before it is abandoned, learnt from this
link's own handshakes (sans I/O).

Behind a load balancer a node whose server hangs still completes TCP handshakes until
the balancer's health check fails it; a fixed ``connect_timeout_s`` (10 s) is then the
cost of every try. A link whose connects take 40 ms has no reason to wait 10 s for one:
the bound is a multiple of the slowest recent connect, never below what a slow cellular
link needs, never above the configured timeout. A connect that timed out at a learnt
bound doubles it for the next try (the network may have become slower: a handover to
cellular), until one succeeds.
"""
from __future__ import annotations

from collections import deque

# a 3G link: DNS, TCP, TLS (two round trips), upgrade, Engine.IO open, Socket.IO
# connect, at ~600 ms each
FLOOR_S = 4.0
MULTIPLE = 4.0
SAMPLES = 8


class ConnectBound:
    def __init__(self, ceiling_s: float, floor_s: float = FLOOR_S):
        self.ceiling_s = ceiling_s
        self.floor_s = min(floor_s, ceiling_s)
        self._recent: deque[float] = deque(maxlen=SAMPLES)
        self._escalation = 0    # timeouts in a row at a learnt bound

    def current(self) -> float:
        """The bound for the next connect."""
        if not self._recent:
            return self.ceiling_s
        learnt = max(self.floor_s, MULTIPLE * max(self._recent))
        return min(self.ceiling_s, learnt * 2 ** self._escalation)

    def succeeded(self, seconds: float) -> None:
        self._recent.append(max(0.0, seconds))
        self._escalation = 0

    def timed_out(self) -> None:
        if self.current() < self.ceiling_s:
            self._escalation += 1
