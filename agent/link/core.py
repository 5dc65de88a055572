"""The link's state machine, sans I/O.

It owns every timing rule of the live link: when to connect, when to send a
heartbeat, when a connection is dead, how long to back off, when a link counts as
stable, how a server throttle and a network-up wake-up bend the schedule. The I/O
shell (runner.py) feeds it events with monotonic timestamps and executes the actions
it returns; nothing here sleeps, reads a clock or touches a socket.

Exactly one connection carries the link at a time by construction: ``Connect`` is only
ever returned from the WAITING state, and every way out of ONLINE goes through WAITING.
The one exception is a server's drain (``on_drain``): while ONLINE, a second connection
is opened beside the live one at a jittered moment (``OpenSecond``), proven by an ACKed
heartbeat (``ProveSecond``), and only then takes the link's place (``Switch``); until
then the live one carries everything, and a second that fails is dropped
(``DropSecond``) while the live one stays.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from enum import Enum

from ..base import reasons as J
from ..config.policies import IdlePolicy, LivenessPolicy
from ..base.backoff import Backoff, BackoffPolicy
from .idle_limit import IdleLimit
from .journal import ConnectionJournal
from .handover import DropSecond, Handover, Switch
from .liveness import LivenessWatchdog

THROTTLE_MIN_S = 1.0
THROTTLE_MAX_S = 15 * 60.0
RECONNECT_WINDOW_MAX_S = 15 * 60.0
# Losses the site's side causes and nobody else sees: the server is fine, so the device
# goes back at once whatever window the server set (a window is for a server's loss,
# which every device on it sees at the same instant).
SILENT_LOSSES = frozenset({J.ACK_TIMEOUT, J.SILENCE, J.IDLE_REAP})


class LinkState(str, Enum):
    WAITING = "waiting"        # no connection; next attempt scheduled
    CONNECTING = "connecting"  # the shell is opening a connection
    ONLINE = "online"          # connected; heartbeats flowing
    STOPPED = "stopped"


# -- actions the shell executes ------------------------------------------------
@dataclass(frozen=True)
class Connect:
    attempt: int


@dataclass(frozen=True)
class SendHeartbeat:
    seq: int


@dataclass(frozen=True)
class VerifyDelivery:
    """Ask the kernel whether heartbeat ``seq`` reached the server's TCP (a server
    that ACKs nothing); answer with on_delivery()."""
    seq: int


@dataclass(frozen=True)
class Abort:
    reason: str


@dataclass(frozen=True)
class SendReport:
    upto_n: int
    connections: list = field(hash=False)


@dataclass(frozen=True)
class LinkPolicy:
    liveness: LivenessPolicy = LivenessPolicy()
    backoff: BackoffPolicy = BackoffPolicy()
    stable_after_s: float = 60.0
    wake_min_interval_s: float = 5.0
    idle: IdlePolicy = IdlePolicy()


class LinkCore:
    def __init__(self, policy: LinkPolicy, rng: random.Random | None = None):
        self.policy = policy
        self.state = LinkState.WAITING
        self.since = 0.0
        self.watchdog = LivenessWatchdog(policy.liveness)
        self.backoff = Backoff(policy.backoff, rng)
        self.journal = ConnectionJournal()
        self.last_reason: str | None = None
        self.last_detail = ""          # the shell's words for it, for a person
        self.next_attempt_at = 0.0
        self.hold_until = 0.0          # a server throttle; nothing connects before it
        # the server's reconnect window (on_reconnect_window) and whether the retries
        # now follow a loss it applies to: until the next connection
        self.reconnect_window_s = 0.0
        self._spreading = False
        self.seq = 0
        self.connected_at: float | None = None
        self.stable = False
        self._next_heartbeat_at = math.inf
        self._last_wake = -math.inf
        self._report_sent_on: int | None = None  # connection number a report went out on
        self.paused = False            # no credentials: nothing to connect with
        # the heartbeat interval this site allows, learnt from the connections it reaps
        self.idle = IdleLimit(policy.liveness.heartbeat_interval_s, policy.idle,
                              ack_timeout_s=policy.liveness.ack_timeout_s)
        self._gaps: dict[int, float] = {}  # seq -> quiet seconds before it was sent
        self.handover: Handover | None = None   # the server drains (on_drain)
        self.drains = 0                         # switches made to a proven new connection

    # -- lifecycle --------------------------------------------------------------
    def start(self, now: float, resume_at: float | None = None, attempts: int = 0) -> None:
        """Begin; ``resume_at``/``attempts`` continue a schedule from before a restart."""
        self.since = now
        self.backoff.attempts = max(0, attempts)
        self.next_attempt_at = now if resume_at is None else max(now, resume_at)

    def stop(self, now: float) -> list:
        was_online = self.state == LinkState.ONLINE
        self.handover = None
        if was_online:
            self.journal.closed(now, J.SHUTDOWN)
        self._enter(LinkState.STOPPED, now)
        return [Abort(J.SHUTDOWN)] if was_online else []

    # -- time -------------------------------------------------------------------
    def attempt_at(self) -> float:
        return max(self.next_attempt_at, self.hold_until)

    def held(self, now: float) -> bool:
        """A server throttle is in force."""
        return now < self.hold_until

    @property
    def after_shared_loss(self) -> bool:
        """The retries follow a loss every device on the server saw at once (it went away),
        not one of this site's own: the server's reconnect window, if any, is in force."""
        return self._spreading

    def next_wakeup(self, acks: bool = True) -> float:
        """When poll() next has something to do; with acks=False, leaving out the ACK
        deadline (watchdog.ack_deadline()), which the shell may keep on a timer of its own."""
        if self.state == LinkState.WAITING:
            return math.inf if self.paused else self.attempt_at()
        if self.state == LinkState.ONLINE:
            t = min(self._next_heartbeat_at, self.watchdog.next_deadline(acks))
            if not self.stable and self.connected_at is not None:
                t = min(t, self.connected_at + self.policy.stable_after_s)
            if self.handover is not None:
                t = min(t, self.handover.next_deadline())
            return t
        return math.inf

    def pause(self, now: float, reason: str) -> list:
        """Stop connecting until resume(): the device has no usable credentials."""
        self.paused = True
        if self.state == LinkState.ONLINE:
            self._lose(now, reason)
            return [Abort(reason)]
        return []

    def resume(self, now: float) -> None:
        self.paused = False
        self.next_attempt_at = min(self.next_attempt_at, now)

    def poll(self, now: float) -> list:
        if self.state == LinkState.WAITING and not self.paused and now >= self.attempt_at():
            self._enter(LinkState.CONNECTING, now)
            return [Connect(attempt=self.backoff.attempts)]
        if self.state != LinkState.ONLINE:
            return []
        reason = self.watchdog.check(now)
        if reason is not None:
            reason = self._lose(now, reason)
            return [Abort(reason)]
        self.idle.tick(now)
        actions: list = [VerifyDelivery(seq) for seq in self.watchdog.deliveries_due(now)]
        if self.handover is not None:   # a server's drain (handover.py)
            due, going = self.handover.due(now)
            actions += due
            self.handover = self.handover if going else None
        if (not self.stable and self.connected_at is not None
                and now - self.connected_at >= self.policy.stable_after_s):
            # Only a link that stayed alive this long resets the schedule: a connect
            # that dies at once must keep backing off.
            self.stable = True
            self.backoff.reset()
        if now >= self._next_heartbeat_at:
            self.seq += 1
            self._gaps[self.seq] = now - self.watchdog.last_inbound
            while len(self._gaps) > 64:
                del self._gaps[min(self._gaps)]
            self.watchdog.on_heartbeat_sent(self.seq, now)
            interval = self.idle.interval_s
            self._next_heartbeat_at += interval
            if self._next_heartbeat_at <= now:  # we were late; don't burst to catch up
                self._next_heartbeat_at = now + interval
            actions.append(SendHeartbeat(self.seq))
        if self._report_sent_on != self.journal.total_connections and self.watchdog.proven:
            pending = self.journal.unreported()
            self._report_sent_on = self.journal.total_connections
            if pending:
                actions.append(SendReport(upto_n=pending[-1].n,
                                          connections=[r.to_dict() for r in pending]))
        return actions

    # -- events from the shell --------------------------------------------------
    def on_connected(self, now: float, wall: float, server_ping_interval_s: float | None = None,
                     local_addr: str = "", connect_s: float | None = None,
                     clock_skew_s: float | None = None) -> None:
        if self.state != LinkState.CONNECTING:
            return
        self._enter(LinkState.ONLINE, now)
        self.stable = False
        self._spreading = False
        self._opened(now, (wall, local_addr, connect_s, clock_skew_s), server_ping_interval_s)
        self._next_heartbeat_at = now

    def _opened(self, now: float, journaled: tuple, server_ping_interval_s: float | None):
        """A connection carries the link (journaled: wall, address, connect s, skew)."""
        self.connected_at = now
        self.handover = None
        self.watchdog.reset(now, server_ping_interval_s)
        self.journal.opened(now, *journaled)
        self._gaps.clear()
        self.idle.connected()

    # -- a server's drain: make before break ---------------------------------------------
    def on_drain(self, window_s: float, now: float) -> float | None:
        """The server is about to stop: a new connection within ``window_s`` (handover.py);
        the moment's delay, or None with nothing to move (not online, or moving)."""
        if self.state != LinkState.ONLINE or self.handover is not None:
            return None
        self.handover = Handover.within(window_s, now, self.policy.liveness.ack_timeout_s,
                                        self.backoff.moment)
        return self.handover.at - now

    def on_second_opened(self, now: float) -> list:
        """The second connection is open: prove it with a heartbeat of its own."""
        h = self.handover
        if self.state != LinkState.ONLINE or h is None or h.phase != Handover.OPENING:
            return [DropSecond(J.SHUTDOWN)]
        self.seq += 1
        return h.prove(self.seq, now, self.policy.liveness.ack_timeout_s)

    def on_second_failed(self, now: float, reason: str) -> list:
        """The second connection failed: the live one stays until the drain's end."""
        h, self.handover = self.handover, None
        return h.failed(reason) if h is not None else []

    def on_second_proven(self, seq: int, now: float) -> list:
        """An ACK on the second connection: its proof, if it is the one asked for."""
        h = self.handover
        if self.state != LinkState.ONLINE or h is None or not h.proven_by(seq):
            return []
        self.handover = None
        return [Switch(seq, h.sent_at)]

    def on_switched(self, now: float, wall: float, server_ping_interval_s: float | None = None,
                    local_addr: str = "", connect_s: float | None = None,
                    clock_skew_s: float | None = None, proof: tuple[int, float] | None = None
                    ) -> None:
        """The second connection carries the link: the old one is journaled as drained,
        and the new one starts proven by its heartbeat (``proof``: seq, sent at)."""
        if self.state != LinkState.ONLINE:
            return
        self.journal.closed(now, J.DRAINED)
        self.drains += 1
        self._opened(now, (wall, local_addr, connect_s, clock_skew_s), server_ping_interval_s)
        if proof is not None:
            self.watchdog.on_heartbeat_sent(proof[0], proof[1])
            self.watchdog.on_ack(proof[0], now)
            if self.journal.current is not None and self.watchdog.last_rtt_s is not None:
                self.journal.current.add_rtt(self.watchdog.last_rtt_s)
        self._next_heartbeat_at = now + self.idle.interval_s

    def on_connect_failed(self, now: float, reason: str, detail: str = "") -> None:
        if self.state != LinkState.CONNECTING:
            return
        self.journal.attempt_failed(now, reason)
        self._schedule_retry(now, reason, detail)

    def on_closed(self, now: float, reason: str, detail: str = "") -> None:
        """The transport ended by itself (server disconnect, socket error)."""
        if self.state == LinkState.ONLINE:
            self._lose(now, reason, detail)

    def on_inbound(self, now: float) -> None:
        if self.state == LinkState.ONLINE:
            self.watchdog.on_inbound(now)

    def on_server_ping(self, now: float) -> None:
        if self.state == LinkState.ONLINE:
            self.watchdog.on_server_ping(now)

    def on_ack(self, seq: int, now: float) -> float | None:
        if self.state != LinkState.ONLINE:
            return None
        rtt = self.watchdog.on_ack(seq, now)
        if seq in self._gaps:
            self.idle.survived(self._gaps[seq], now)
        for answered in [s for s in self._gaps if s <= seq]:
            del self._gaps[answered]
        if rtt is not None and self.journal.current is not None:
            self.journal.current.add_rtt(rtt)
        return rtt

    def on_delivery(self, seq: int, delivered: bool | None, now: float,
                    rtt_s: float | None = None) -> list:
        """The kernel's answer to VerifyDelivery; an undelivered heartbeat ends the link
        at once, as a missed ACK would."""
        if self.state != LinkState.ONLINE:
            return []
        self.watchdog.on_delivery(seq, delivered, now, rtt_s)
        reason = self.watchdog.check(now)
        if reason is None:
            return []
        reason = self._lose(now, reason)
        return [Abort(reason)]

    def on_report_acked(self, upto_n: int) -> None:
        self.journal.mark_reported(upto_n)

    def on_throttle(self, retry_after_s: float, now: float) -> float:
        """The server asked us to hold off; returns the hold applied, clamped."""
        hold = min(THROTTLE_MAX_S, max(THROTTLE_MIN_S, retry_after_s))
        self.hold_until = max(self.hold_until, now + hold)
        return hold

    def on_reconnect_window(self, window_s: float) -> float:
        """The server's window to spread reconnects over after it is lost (0: none);
        returns the window applied, clamped. Kept until another connection says otherwise."""
        self.reconnect_window_s = min(RECONNECT_WINDOW_MAX_S, max(0.0, window_s))
        return self.reconnect_window_s

    def on_network_up(self, now: float) -> bool:
        """The network came back: try now instead of waiting out the backoff; rate-limited
        so a flapping cable cannot become a connect storm, never ahead of a throttle."""
        if self.state != LinkState.WAITING or self.next_attempt_at <= now:
            return False
        if now - self._last_wake < self.policy.wake_min_interval_s:
            return False
        self._last_wake = now
        self.next_attempt_at = now
        return True

    # -- status -----------------------------------------------------------------
    def snapshot(self, now: float) -> dict:
        return link_status(self, now)

    # -- internals --------------------------------------------------------------
    def _enter(self, state: LinkState, now: float) -> None:
        if state != self.state:
            self.state = state
            self.since = now

    def _lose(self, now: float, reason: str, detail: str = "") -> str:
        """Ends the connection; returns the reason it is journaled with."""
        if reason == J.ACK_TIMEOUT and self._gaps:
            gap = self._gaps[min(self._gaps)]   # the oldest heartbeat left unanswered
            if self.idle.died(gap, now):
                reason = J.IDLE_REAP
                detail = (f"lost after {gap:.1f}s idle, again: the site reaps idle flows; "
                          f"heartbeat now every {self.idle.interval_s:g}s")
        self.journal.closed(now, reason)
        self.handover = None
        self.connected_at = None
        self._next_heartbeat_at = math.inf
        self._spreading = reason not in SILENT_LOSSES
        self._schedule_retry(now, reason, detail)
        return reason

    def _schedule_retry(self, now: float, reason: str, detail: str = "") -> None:
        self.last_reason = reason
        self.last_detail = detail
        spread = self.reconnect_window_s if self._spreading else 0.0
        self.next_attempt_at = now + self.backoff.next_delay(spread)
        self._enter(LinkState.WAITING, now)


def link_status(core: LinkCore, now: float) -> dict:
    """What `edge-agent status` says of the link."""
    wd = core.watchdog
    online = core.state == LinkState.ONLINE
    cur = core.journal.current
    return {
        "state": "unpaired" if core.paused and core.state == LinkState.WAITING else core.state.value,
        "since_s": round(now - core.since, 1),
        "reason": core.last_reason,
        "detail": core.last_detail or None,
        "attempts": core.backoff.attempts,
        "next_attempt_in_s": (round(max(0.0, core.attempt_at() - now), 1)
                              if core.state == LinkState.WAITING else None),
        "rtt_ms": round(wd.last_rtt_s * 1000, 1) if online and wd.last_rtt_s is not None else None,
        "last_ack_age_s": (round(now - wd.last_ack_at, 1)
                           if online and wd.last_ack_at is not None else None),
        "proven_live": online and wd.proven_live(now),
        "proof": wd.proof if online else None,
        # while the file says online and proven, the last proof is at most this old
        "proof_within_s": (round(wd.proof_within_s(core.idle.interval_s), 1)
                           if online and wd.proof else None),
        "connection": cur.n if cur else None,
        "local_addr": cur.local_addr if cur else None,
        "connect_ms": cur.connect_ms if cur else None,
        "clock_skew_s": cur.clock_skew_s if cur else None,
        "connections_total": core.journal.total_connections,
        "losses_last_hour": core.journal.losses_since(now - 3600),
        # below the configured interval while the site reaps idle flows
        "heartbeat_interval_s": core.idle.interval_s,
        "reconnect_window_s": core.reconnect_window_s or None,
    }
