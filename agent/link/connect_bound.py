"""How long a connect may go unanswered before it is abandoned, and when one that has
no answer yet is raced by a second dial, learnt from this link's own handshakes (sans
I/O).

Behind a load balancer a node whose server hangs still completes TCP handshakes until
the balancer's health check fails it; a fixed ``connect_timeout_s`` (10 s) is then the
cost of every try. A link whose connects take 40 ms has no reason to wait 10 s for one:
the bound is a multiple of the slowest recent connect, never below what a slow cellular
link needs, never above the configured timeout. A connect that timed out at a learnt
bound doubles it for the next try (the network may have become slower: a handover to
cellular), until one succeeds.

Even the bound's floor (4 s) is long for a device whose new connection landed on the
hung node again. So a connect with no answer after ``RACE_MULTIPLE`` times the learnt
handshake (at least ``RACE_FLOOR_S``) is raced by a second dial, which the balancer may
send to a healthy node, and while none has answered by a further one each such
interval (``RACE_AT_ONCE`` at once, ``RACE_DIALS`` in all): a balancer's round robin
sends the second dial to the hung node too about half the time, and one more interval
is cheaper than the bound.
The first to answer wins. Each dial is also one more connection for the server, so
none is made while the server is struggling for everyone, as far as this device can
tell: held off by a throttle, retrying after a loss every device saw at once (the
server went away: a reconnect window, when the server sets one, is in force then),
answered 429/503, or handshakes slow (one slower than the race's threshold, or a race
in which no dial answered) until one is quick again. A storm gets no extra load.
"""
from __future__ import annotations

from collections import deque

# a 3G link: DNS, TCP, TLS (two round trips), upgrade, Engine.IO open, Socket.IO
# connect, at ~600 ms each
FLOOR_S = 4.0
MULTIPLE = 4.0
SAMPLES = 8
# a connect unanswered this long (times the slowest recent handshake, at least the
# floor) is raced by a second dial, and by one more each such interval while none has
# answered: at most RACE_AT_ONCE at once (the oldest unanswered one is given up for the
# next), RACE_DIALS in all. Behind round robin over two nodes, one of them hung, each
# dial lands there about one time in two: four, one in 16, and a balancer's health
# check has failed it by the fourth (every 0.5 s, out after 2).
RACE_FLOOR_S = 0.5
RACE_MULTIPLE = 3.0
RACE_AT_ONCE = 3
RACE_DIALS = 4


class ConnectBound:
    def __init__(self, ceiling_s: float, floor_s: float = FLOOR_S):
        self.ceiling_s = ceiling_s
        self.floor_s = min(floor_s, ceiling_s)
        self._recent: deque[float] = deque(maxlen=SAMPLES)
        self._escalation = 0    # timeouts in a row at a learnt bound
        # the server answered slowly or busy, or a race found no answer on either dial:
        # no race until a handshake is quick again
        self.struggling = False

    def current(self) -> float:
        """The bound for the next connect."""
        if not self._recent:
            return self.ceiling_s
        learnt = max(self.floor_s, MULTIPLE * max(self._recent))
        return min(self.ceiling_s, learnt * 2 ** self._escalation)

    def race_after(self, *, held: bool = False, shared_loss: bool = False) -> float | None:
        """Seconds after which the next connect, still unanswered, is raced by a second
        dial (and the interval between further ones); None: no race. ``held``: a server throttle is in force; ``shared_loss``:
        the retries follow a loss every device on the server saw."""
        threshold = self._threshold()
        if threshold is None or held or shared_loss or self.struggling:
            return None
        return threshold if threshold < self.current() else None

    def succeeded(self, seconds: float) -> None:
        """A connect answered in ``seconds`` (the winning dial's own time)."""
        seconds = max(0.0, seconds)
        threshold = self._threshold()
        self.struggling = threshold is not None and seconds > threshold
        self._recent.append(seconds)
        self._escalation = 0

    def timed_out(self, raced: bool = False) -> None:
        """A connect the bound ended; ``raced``: the race's other dials had no answer
        either."""
        if raced:
            self.struggling = True
        if self.current() < self.ceiling_s:
            self._escalation += 1

    def busy(self) -> None:
        """The server answered the connect that it is overloaded (429, 503)."""
        self.struggling = True

    def _threshold(self) -> float | None:
        if not self._recent:
            return None   # nothing learnt: no measure of what "no answer yet" means
        return max(RACE_FLOOR_S, RACE_MULTIPLE * max(self._recent))
