"""The site's idle limit, learnt from the connections it kills (sans I/O).

A box that silently stops forwarding a flow idle for 10 s reaps a link that heartbeats
every 15 s on every cycle: each time the agent notices (one ACK timeout), reconnects,
and is reaped again, forever. The heartbeat is the only traffic an idle link carries,
so the gap before each heartbeat is how long the flow sat idle: a heartbeat answered
after a gap says that gap is safe here, one lost after it says it may not be.

- Two losses after about the same gap (within ``SIMILAR``), with no heartbeat answered
  after such a gap in between and within ``probe_after_s`` of each other, are a
  pattern, not bad luck: the heartbeat goes to ``MARGIN`` times that gap, and so does
  TCP keepalive. Once learning, one more loss at the learnt interval halves it again,
  unless a heartbeat after the same gap was answered on that connection.
- What was learnt is kept per network (the shell stores ``memory()``), so a restart
  does not pay for it twice.
- A site may stop reaping (a firewall replaced). After ``probe_after_s`` without a
  reap the interval steps up by ``STEP``, the configured interval being one more step;
  a reap at the new gap goes back to the last safe one and waits twice as long before
  the next step. The pattern is forgotten only once the configured interval has
  survived a whole wait.
"""
from __future__ import annotations

import math
from ..config.policies import IdlePolicy

SIMILAR = 0.25      # gaps within 25 % of each other are "about the same"
MARGIN = 0.5        # heartbeat at half the gap that killed the flow
STEP = 1.5          # each probe back towards the configured interval
MAX_PROBE_WAIT_S = 7 * 86400.0


class IdleLimit:
    def __init__(self, configured_s: float, policy: IdlePolicy = IdlePolicy(),
                 ack_timeout_s: float = 0.0):
        """Never below the ACK timeout: a heartbeat must be answered before the next."""
        self.configured_s = configured_s
        self.policy = policy
        self.floor_s = min(configured_s, max(policy.min_interval_s, ack_timeout_s))
        self.forget()

    def forget(self) -> None:
        self.interval_s = self.configured_s
        self.learning = False                 # a pattern is held (maybe probing upwards)
        self._fatal: list[tuple[float, float]] = []   # (gap, when) of recent losses
        self._safe_s: float | None = None     # the last interval that survived a wait
        self._probe_wait_s = self.policy.probe_after_s
        self._next_probe_at = math.inf
        self._answered_here = 0.0             # longest answered gap on this connection
        self.changed = False

    # -- what the heartbeats saw ------------------------------------------------------
    def connected(self) -> None:
        self._answered_here = 0.0

    def survived(self, gap_s: float, now: float) -> None:
        """A heartbeat sent after ``gap_s`` of quiet was answered."""
        self._answered_here = max(self._answered_here, gap_s)
        # a gap that lived says losses at or below it were something else
        self._fatal = [(g, t) for g, t in self._fatal if g > gap_s * (1 + SIMILAR)]

    def died(self, gap_s: float, now: float) -> bool:
        """A connection lost to an ACK timeout on the heartbeat sent after ``gap_s``
        of quiet. True if that is the site's idle reaping, by the pattern learnt."""
        if not self.policy.enabled or gap_s <= 0:
            return False
        if gap_s <= self._answered_here * (1 + SIMILAR):
            return False     # the same quiet was answered on this connection
        if self.learning:
            if gap_s < 0.9 * self.interval_s:
                return False     # lost before the gap we keep: something else
            if self._safe_s is not None and self.interval_s > self._safe_s:
                # a probe that found the limit still there: back, and wait longer
                self._set(self._safe_s)
                self._probe_wait_s = min(MAX_PROBE_WAIT_S, 2 * self._probe_wait_s)
            else:
                self._set(MARGIN * gap_s)
            self._next_probe_at = now + self._probe_wait_s
            return True
        recent = [(g, t) for g, t in self._fatal if now - t <= self.policy.probe_after_s]
        similar = [g for g, _ in recent if abs(g - gap_s) <= SIMILAR * max(g, gap_s)]
        self._fatal = (recent + [(gap_s, now)])[-4:]
        if not similar:
            return False
        self.learning = True
        self._set(MARGIN * min(similar + [gap_s]))
        self._next_probe_at = now + self._probe_wait_s
        return True

    def tick(self, now: float) -> None:
        """Steps back towards the configured interval when a probe is due."""
        if not self.learning or now < self._next_probe_at:
            return
        if self.interval_s >= self.configured_s:   # the configured interval held a wait
            self.forget()
            self.changed = True
            return
        self._safe_s = self.interval_s
        self._set(STEP * self.interval_s)
        self._next_probe_at = now + self._probe_wait_s

    def _set(self, interval_s: float) -> None:
        interval_s = round(min(self.configured_s, max(self.floor_s, interval_s)), 3)
        if interval_s != self.interval_s:
            self.interval_s = interval_s
            self.changed = True

    # -- kept across restarts, per network -------------------------------------------------
    def memory(self) -> dict | None:
        """What to keep for this network: None when there is nothing learnt."""
        if not self.learning:
            return None
        return {"interval_s": self.interval_s, "safe_s": self._safe_s,
                "probe_wait_s": self._probe_wait_s}

    def recall(self, memory: dict | None, now: float) -> None:
        """A network's memory, as memory() gave it (from a file: every field checked)."""
        self.forget()
        if not isinstance(memory, dict):
            return
        interval = _number(memory.get("interval_s"))
        if interval is None or not self.floor_s <= interval < self.configured_s:
            return
        self.learning = True
        self.interval_s = interval
        safe = _number(memory.get("safe_s"))
        self._safe_s = safe if safe is not None and self.floor_s <= safe <= interval else None
        wait = _number(memory.get("probe_wait_s"))
        self._probe_wait_s = (min(MAX_PROBE_WAIT_S, max(self.policy.probe_after_s, wait))
                              if wait is not None else self.policy.probe_after_s)
        self._next_probe_at = now + self._probe_wait_s


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None
