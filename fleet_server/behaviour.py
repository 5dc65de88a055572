"""The switches that make the reference server misbehave the way a struggling or old
server would: set from the command line, changed by tests through POST /admin/behaviour."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Behaviour:
    ack_mode: str = "ok"         # ok | none (an old server) | wrong-seq | garbage
    ack_delay_s: float = 0.0     # answer them this late
    connect_delay_s: float = 0.0 # accept the namespace CONNECT this late
    heartbeat_timeout_s: float = 45.0
    code_ttl_s: float = 600.0    # pairing codes expire
    flap_limit: int = 20         # connects per identity per window before the limiter acts
    flap_window_s: float = 60.0
    throttle_s: float = 30.0     # known devices: a soft server:throttle
    quarantine_s: float = 1800.0 # unknown identities: refused outright
    pair_limit: int = 5          # pairing attempts per operator per minute
    upload_mode: str = "ok"      # ok | 500 | 429 | 413 | hang
    retry_after_s: float = 120.0 # with 429
    result_ack: str = "ok"       # ok | none: confirmations of command results lost
    reconnect_window_s: float = 0.0  # told to every device at connect when set
    drain_window_s: float = 0.0  # on SIGTERM: server:drain with this window (0: none)
    refuse_for_now_s: float = 0.0  # refuse every connect, for now: retry_after_s this
    release_cut_bytes: int = 0  # the next package download stops after this many bytes
