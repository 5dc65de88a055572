"""Connection journal: when and why each connection ended, how long it lived, its RTT.

Kept in memory (it changes every few seconds; the SD card is not for that) and
reported to the server after each reconnect. It is the evidence that tells an
edge conntrack flush from a server artifact.
"""
from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field

@dataclass
class ConnectionRecord:
    n: int                      # connection number since start
    opened_at: float            # wall time, for the report only
    opened_mono: float
    local_addr: str = ""
    connect_ms: float | None = None      # from dialing to the server's CONNECT answer
    clock_skew_s: float | None = None    # the server's clock minus this device's, at open
    ended_reason: str | None = None
    lived_s: float | None = None
    heartbeats_acked: int = 0
    rtt_ms_last: float | None = None
    rtt_ms_min: float | None = None
    rtt_ms_max: float | None = None
    # why each attempt failed between this connection's end and the next one: the
    # report after reconnecting says what the device went through while it was away
    failed_after: dict[str, int] = field(default_factory=dict)
    _rtt_sum: float = field(default=0.0, repr=False)

    def add_rtt(self, rtt_s: float) -> None:
        ms = round(rtt_s * 1000.0, 1)
        self.heartbeats_acked += 1
        self._rtt_sum += ms
        self.rtt_ms_last = ms
        self.rtt_ms_min = ms if self.rtt_ms_min is None else min(self.rtt_ms_min, ms)
        self.rtt_ms_max = ms if self.rtt_ms_max is None else max(self.rtt_ms_max, ms)

    @property
    def rtt_ms_sum(self) -> float:
        """Of every acked heartbeat's round trip: the metrics' histogram takes what it
        has not read yet from it."""
        return self._rtt_sum

    @property
    def rtt_ms_avg(self) -> float | None:
        if not self.heartbeats_acked:
            return None
        return round(self._rtt_sum / self.heartbeats_acked, 1)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("_rtt_sum")
        d.pop("opened_mono")
        d["rtt_ms_avg"] = self.rtt_ms_avg
        return d


class ConnectionJournal:
    def __init__(self, capacity: int = 64):
        self.records: deque[ConnectionRecord] = deque(maxlen=capacity)
        self.failures: deque[tuple[float, str]] = deque(maxlen=capacity)  # (mono, reason)
        self._reported_upto = 0  # highest connection number the server has ACKed
        self.total_connections = 0

    @property
    def current(self) -> ConnectionRecord | None:
        if self.records and self.records[-1].ended_reason is None:
            return self.records[-1]
        return None

    def opened(self, mono: float, wall: float, local_addr: str = "",
               connect_s: float | None = None,
               clock_skew_s: float | None = None) -> ConnectionRecord:
        self.total_connections += 1
        rec = ConnectionRecord(n=self.total_connections, opened_at=round(wall, 3),
                               opened_mono=mono, local_addr=local_addr,
                               connect_ms=None if connect_s is None else round(connect_s * 1000, 1),
                               clock_skew_s=clock_skew_s)
        self.records.append(rec)
        return rec

    def closed(self, mono: float, reason: str) -> ConnectionRecord | None:
        rec = self.current
        if rec is None:
            return None
        rec.ended_reason = reason
        rec.lived_s = round(mono - rec.opened_mono, 3)
        self.failures.append((mono, reason))
        return rec

    def attempt_failed(self, mono: float, reason: str) -> None:
        self.failures.append((mono, reason))
        if self.records and self.records[-1].ended_reason is not None:
            after = self.records[-1].failed_after
            after[reason] = after.get(reason, 0) + 1

    def unreported(self) -> list[ConnectionRecord]:
        """Ended connections the server has not ACKed yet, oldest first."""
        return [r for r in self.records
                if r.ended_reason is not None and r.n > self._reported_upto]

    def mark_reported(self, upto_n: int) -> None:
        self._reported_upto = max(self._reported_upto, upto_n)

    def losses_since(self, mono: float) -> list[str]:
        return [reason for t, reason in self.failures if t >= mono]
