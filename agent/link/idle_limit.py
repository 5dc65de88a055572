"""The site's idle limit, learnt from the connections it kills (sans I/O).

A box that silently stops forwarding a flow idle for 10 s reaps a link that heartbeats
every 15 s on every cycle: each time the agent notices (one ACK timeout), reconnects,
and is reaped again, forever. The heartbeat is the only traffic an idle link carries,
so the gap before each heartbeat is how long the flow sat idle: a heartbeat answered
after a gap says that gap is safe here, one lost after it says it may not be.

- Two losses after about the same gap (within ``SIMILAR``) are a pattern, not bad luck:
  the heartbeat goes to ``MARGIN`` times that gap, and so does TCP keepalive. Once
  learning, one more loss at the learnt interval halves it again.
- What was learnt is kept per network (the shell stores ``memory()``), so a restart
  does not pay for it twice.
- A site may stop reaping (a firewall replaced). After ``probe_after_s`` without a
  reap the interval steps up by ``STEP``; a reap at the new gap goes back to the last
  safe one and waits twice as long before the next step; reaching the configured
  interval forgets the pattern.
"""
from __future__ import annotations

from dataclasses import dataclass

SIMILAR = 0.25      # gaps within 25 % of each other are "about the same"
MARGIN = 0.5        # heartbeat at half the gap that killed the flow
STEP = 1.5          # each probe back towards the configured interval
MAX_PROBE_WAIT_S = 7 * 86400.0


@dataclass(frozen=True)
class IdlePolicy:
    enabled: bool = True
    probe_after_s: float = 1800.0
    floor_s: float = 2.0          # never heartbeat faster than this


class IdleLimit:
    def __init__(self, configured_s: float, policy: IdlePolicy = IdlePolicy(),
                 floor_s: float = 0.0):
        """``floor_s``: the liveness rules' own lower bound (the ACK timeout)."""
        self.configured_s = configured_s
        self.policy = policy
        self.floor_s = min(configured_s, max(policy.floor_s, floor_s))
        self.forget()

    def forget(self) -> None:
        self.interval_s = self.configured_s
        self._fatal: list[float] = []       # recent gaps that lost the connection
        self._safe_s: float | None = None   # the last learnt interval that survived
        self._probe_wait_s = self.policy.probe_after_s
        self._next_probe_at: float | None = None
        self.changed = False

    @property
    def learning(self) -> bool:
        return self.interval_s < self.configured_s

    # -- what the heartbeats saw ------------------------------------------------------
    def died(self, gap_s: float, now: float) -> bool:
        """A connection lost to an ACK timeout on the heartbeat sent after ``gap_s``
        of quiet. True if that is the site's idle reaping, by the pattern learnt."""
        if not self.policy.enabled or gap_s <= 0:
            return False
        if self.learning:
            if gap_s < 0.9 * self.interval_s:
                return False     # lost before the gap we keep: something else
            if self._safe_s is not None and self.interval_s > self._safe_s:
                # a probe that found the limit still there: back, and wait longer
                self._set(self._safe_s, now)
                self._probe_wait_s = min(MAX_PROBE_WAIT_S, 2 * self._probe_wait_s)
            else:
                self._set(max(self.floor_s, MARGIN * gap_s), now)
            self._next_probe_at = now + self._probe_wait_s
            return True
        similar = [g for g in self._fatal if abs(g - gap_s) <= SIMILAR * max(g, gap_s)]
        self._fatal = (self._fatal + [gap_s])[-4:]
        if not similar:
            return False
        self._set(max(self.floor_s, MARGIN * min(similar + [gap_s])), now)
        self._next_probe_at = now + self._probe_wait_s
        return True

    def tick(self, now: float) -> None:
        """Steps back towards the configured interval when a probe is due."""
        if not self.learning or self._next_probe_at is None or now < self._next_probe_at:
            return
        self._safe_s = self.interval_s
        stepped = STEP * self.interval_s
        if stepped >= self.configured_s:
            self.forget()
            self.changed = True
            return
        self._set(stepped, now)
        self._next_probe_at = now + self._probe_wait_s

    def _set(self, interval_s: float, now: float) -> None:
        interval_s = min(self.configured_s, interval_s)
        if interval_s != self.interval_s:
            self.interval_s = round(interval_s, 3)
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
        self.interval_s = interval
        safe = _number(memory.get("safe_s"))
        self._safe_s = safe if safe is not None and safe <= interval else None
        wait = _number(memory.get("probe_wait_s"))
        self._probe_wait_s = (min(MAX_PROBE_WAIT_S, max(self.policy.probe_after_s, wait))
                              if wait is not None else self.policy.probe_after_s)
        self._next_probe_at = now + self._probe_wait_s


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if value == value and abs(value) != float("inf") else None
