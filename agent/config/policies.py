"""The values the cores run by, one frozen record each, as the configuration gives them
(model.py holds them in their sections; schema.py takes its defaults from here). Plain
data imported by the sans-I/O cores: nothing here reaches the world."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LivenessPolicy:
    """When the link is live: the heartbeat's interval, its ACK's timeout, misses allowed."""
    heartbeat_interval_s: float = 15.0
    ack_timeout_s: float = 5.0
    missed_acks: int = 1
    silence_timeout_s: float | None = None


@dataclass(frozen=True)
class IdlePolicy:
    """The site's idle limit: whether it is probed, after how long, and the fastest heartbeat."""
    enabled: bool = True
    probe_after_s: float = 1800.0
    min_interval_s: float = 2.0     # never heartbeat faster than this


@dataclass(frozen=True)
class KeepalivePolicy:
    """TCP's keepalive and user timeout on the link's socket."""
    idle_s: int = 15
    interval_s: int = 5
    count: int = 3
    user_timeout_s: float = 20.0


@dataclass(frozen=True)
class UploadPolicy:
    """How a failed upload is tried again: its backoff and jitter."""
    base_s: float = 30.0
    cap_s: float = 1800.0
    jitter: float = 0.2          # +-20 %: items that failed together spread out
    max_items: int = 10_000
    max_bytes: int = 256 * 1024 * 1024
    max_age_days: float = 14.0
    dedupe_window_s: float = 3600.0
    batch_max: int = 200         # proof-of-play records per request
    batch_bytes: int = 8 << 20   # payload bytes one round holds in memory, whatever the queue holds
    max_item_bytes: int = 16 << 20  # one item; the unit's MemoryMax must hold a round
