"""Half-open watchdog: decides, from ACKs and inbound traffic alone, that a link is dead.

A silently dropped TCP flow (no FIN, no RST) leaves the client library saying
"connected" for as long as its ping timeout allows (45-60 s with common server
settings). The agent does not wait for that: every heartbeat carries a sequence
number the server must ACK, and any inbound packet counts as proof of life.

Two independent verdicts:
- ``ack-timeout``: ``missed_acks`` consecutive heartbeats not ACKed within
  ``ack_timeout_s``. Armed only after the first ACK of a connection, so a server
  that never ACKs (an older peer) cannot make the agent flap.
- ``silence``: nothing at all received for ``silence_timeout``. Always armed. When
  not configured it is derived from the traffic the link must carry: heartbeat ACKs
  once armed, the server's Engine.IO pings otherwise.

"Proven live" (what the systemd watchdog pets are gated on) is a recent heartbeat ACK
where the server ACKs. Where it does not (ScreenTinker before 1.9), each heartbeat is
proven by the kernel instead: ``ack_timeout_s`` after it was sent, the shell reads
TCP_INFO and reports whether the peer's TCP acknowledged it (tcpinfo.py). Such a proof
counts like an ACK (a heartbeat the kernel says is undelivered is a missed ACK, so a
silent drop is caught at the heartbeat's deadline, not after the server's ping
interval), and the server's Engine.IO pings are the slower proof that the server
application, not only its host, is alive: an Engine.IO 4 server sends its next ping
only ``pingInterval`` after it received our pong to the previous one. Where the kernel
cannot tell either, a recent ping alone is the proof.
"""
from __future__ import annotations

from ..config.policies import LivenessPolicy

ACK_TIMEOUT = "ack-timeout"
SILENCE = "silence"

# Engine.IO's own default, used when a handshake did not say.
DEFAULT_SERVER_PING_INTERVAL_S = 25.0
MAX_PENDING = 64


def heal_window_s(policy: LivenessPolicy) -> float:
    """How long a healthy link may go unproven when one heartbeat's proof is lost and
    the link heals itself: the last proof two heartbeats back plus the ACK timeout. A
    systemd WatchdogSec shorter than this restarts the agent for what it heals alone."""
    return 2 * policy.heartbeat_interval_s + policy.ack_timeout_s


class LivenessWatchdog:
    def __init__(self, policy: LivenessPolicy):
        self.policy = policy
        self._server_ping_interval_s = DEFAULT_SERVER_PING_INTERVAL_S
        self.reset(0.0)

    def reset(self, now: float, server_ping_interval_s: float | None = None) -> None:
        """A fresh connection starts with a clean slate."""
        if server_ping_interval_s and server_ping_interval_s > 0:
            self._server_ping_interval_s = server_ping_interval_s
        self.last_inbound = now
        self.armed = False
        self.last_ack_at: float | None = None
        self.last_rtt_s: float | None = None
        self.acked = 0
        self.pings = 0
        self.last_ping_at: float | None = None
        self.consecutive_misses = 0
        self._pending: dict[int, float] = {}  # seq -> sent_at
        # a server that ACKs nothing: heartbeats waiting for the kernel's word
        self.opened_at = now
        self.delivered_at: float | None = None
        self.kernel_armed = False
        self._unverified: dict[int, float] = {}  # seq -> sent_at

    # -- inputs -----------------------------------------------------------------
    def on_inbound(self, now: float) -> None:
        if now > self.last_inbound:
            self.last_inbound = now

    def on_server_ping(self, now: float) -> None:
        self.on_inbound(now)
        self.pings += 1
        if self.last_ping_at is None or now > self.last_ping_at:
            self.last_ping_at = now

    @property
    def proven(self) -> bool:
        """This connection has carried a round trip the server originated or answered."""
        return self.acked > 0 or self.pings > 0

    def on_heartbeat_sent(self, seq: int, now: float) -> None:
        self._pending[seq] = now
        # A server that never ACKs must not grow this without bound.
        while len(self._pending) > MAX_PENDING:
            del self._pending[min(self._pending)]
        if not self.armed:
            self._unverified[seq] = now
            while len(self._unverified) > MAX_PENDING:
                del self._unverified[min(self._unverified)]

    def deliveries_due(self, now: float) -> list[int]:
        """Heartbeats whose delivery the kernel should be asked about now: those sent
        ``ack_timeout_s`` ago on a connection whose server has ACKed nothing."""
        due = [s for s, sent in self._unverified.items()
               if now >= sent + self.policy.ack_timeout_s]
        for seq in due:
            del self._unverified[seq]
        return sorted(due)

    def on_delivery(self, seq: int, delivered: bool | None, now: float,
                    rtt_s: float | None = None) -> None:
        """The kernel's word on heartbeat ``seq``: True, the peer's TCP acknowledged it;
        False, it did not within the ACK timeout; None, the kernel cannot tell. A
        False counts as a missed ACK once a True has shown this socket can say."""
        if delivered is None or self.armed:
            return
        if delivered:
            self.kernel_armed = True
            self.consecutive_misses = 0
            if self.delivered_at is None or now > self.delivered_at:
                self.delivered_at = now
            if rtt_s is not None:
                self.last_rtt_s = rtt_s
        elif self.kernel_armed:
            self.consecutive_misses += 1

    def on_ack(self, seq: int, now: float) -> float | None:
        """Records the ACK of ``seq``; returns its RTT, or None for an unknown seq."""
        sent_at = self._pending.pop(seq, None)
        self.on_inbound(now)
        if sent_at is None:
            return None
        # Older unACKed seqs are superseded: the link carried a later round trip.
        for older in [s for s in self._pending if s < seq]:
            del self._pending[older]
        self.armed = True
        self._unverified.clear()   # the server ACKs: that proof is the better one
        self.acked += 1
        self.consecutive_misses = 0
        self.last_ack_at = now
        self.last_rtt_s = max(0.0, now - sent_at)
        return self.last_rtt_s

    # -- verdicts ---------------------------------------------------------------
    def silence_timeout(self) -> float:
        p = self.policy
        if p.silence_timeout_s is not None:
            return p.silence_timeout_s
        expected_gap = max(p.heartbeat_interval_s, self._server_ping_interval_s)
        if self.armed:
            expected_gap = max(expected_gap, p.heartbeat_interval_s * p.missed_acks)
        return expected_gap + p.ack_timeout_s

    def check(self, now: float) -> str | None:
        """Returns the reason the link is dead, or None while it is alive."""
        if self.armed:
            expired = [s for s, sent in self._pending.items()
                       if now >= sent + self.policy.ack_timeout_s]
            for seq in expired:
                del self._pending[seq]
                self.consecutive_misses += 1
        if (self.armed or self.kernel_armed) and self.consecutive_misses >= self.policy.missed_acks:
            return ACK_TIMEOUT
        if now >= self.last_inbound + self.silence_timeout():
            return SILENCE
        return None

    def next_deadline(self, acks: bool = True) -> float:
        """The earliest time ``check`` could change its answer; with acks=False, leaving
        out the ACK deadline (the shell keeps that one on a timer of its own)."""
        deadline = self.last_inbound + self.silence_timeout()
        if self._unverified:
            deadline = min(deadline, min(self._unverified.values()) + self.policy.ack_timeout_s)
        ack = self.ack_deadline() if acks else None
        return min(deadline, ack[1]) if ack else deadline

    def ack_deadline(self) -> tuple[int, float] | None:
        """(seq, time) of the first armed ACK deadline, if one is pending."""
        if not (self.armed and self._pending):
            return None
        seq = min(self._pending, key=self._pending.__getitem__)
        return seq, self._pending[seq] + self.policy.ack_timeout_s

    def proven_live(self, now: float) -> bool:
        """An ACK within two heartbeat intervals plus the ACK timeout (on a proven
        connection the link thread takes an ACK in with the next heartbeat's turn: the
        one before must still count until then; a missing one is caught at its deadline
        by check()). From a server that does not ACK: a heartbeat the kernel saw
        delivered within the same window, and the application heard from (the
        handshake, then its pings) within two ping intervals plus the ACK timeout;
        where the kernel cannot tell, a ping within one ping interval plus the ACK
        timeout."""
        p = self.policy
        if self.armed:
            return self.last_ack_at is not None and now - self.last_ack_at <= heal_window_s(p)
        if self.kernel_armed:
            heard = max(self.opened_at, self.last_ping_at or self.opened_at)
            return (self.delivered_at is not None and now - self.delivered_at <= heal_window_s(p)
                    and now - heard <= 2 * self._server_ping_interval_s + p.ack_timeout_s)
        return (self.last_ping_at is not None
                and now - self.last_ping_at <= self._server_ping_interval_s + p.ack_timeout_s)

    def proof_within_s(self, interval_s: float) -> float:
        """How recent the last proof is for as long as this connection stays online and
        proven live (heartbeats every ``interval_s``): an older one would have ended it
        (``check``) or its proof (``proven_live``), and the status file is rewritten on
        either. What `edge-agent status` says without a write per heartbeat."""
        p = self.policy
        if self.armed or self.kernel_armed:
            return min(p.missed_acks * interval_s + p.ack_timeout_s, heal_window_s(p))
        return self._server_ping_interval_s + p.ack_timeout_s

    @property
    def proof(self) -> str | None:
        """What proves this connection, for the status: the server's ACKs, the kernel's
        with the server's pings, or the pings alone."""
        if self.armed:
            return "heartbeat-ack"
        if self.kernel_armed:
            return "tcp-ack+ping"
        return "ping" if self.pings else None

    @property
    def server_ping_interval_s(self) -> float:
        return self._server_ping_interval_s
