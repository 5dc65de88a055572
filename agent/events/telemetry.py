"""Telemetry with psutil, sent only when it changed enough or every few minutes."""
from __future__ import annotations

import time

# How much a figure must move to be worth a message before the periodic one.
THRESHOLDS = {"cpu_percent": 25.0, "mem_percent": 10.0, "disk_free_mb": 100.0,
              "soc_temp_c": 5.0, "agent_rss_mb": 20.0}


def sample(state_dir: str) -> dict:
    import psutil
    memory = psutil.virtual_memory()
    out = {"cpu_percent": psutil.cpu_percent(interval=None),
           "mem_percent": memory.percent,
           "mem_total_mb": round(memory.total / 2 ** 20),
           "mem_available_mb": round(memory.available / 2 ** 20),
           "uptime_s": round(time.time() - psutil.boot_time()),
           "agent_rss_mb": round(psutil.Process().memory_info().rss / 2 ** 20, 1)}
    try:
        disk = psutil.disk_usage(state_dir)
        out["disk_free_mb"] = round(disk.free / 2 ** 20)
        out["disk_total_mb"] = round(disk.total / 2 ** 20)
    except OSError:
        pass
    try:
        temps = psutil.sensors_temperatures() if hasattr(psutil, "sensors_temperatures") else {}
    except Exception:
        temps = {}
    for name in ("cpu_thermal", "soc_thermal", "coretemp"):
        if temps.get(name):
            out["soc_temp_c"] = round(temps[name][0].current, 1)
            break
    return out


class TelemetryGate:
    """Pure: decides whether a new sample is worth sending."""

    def __init__(self, every_s: float = 300.0, min_gap_s: float = 60.0):
        self.every_s = every_s
        self.min_gap_s = min_gap_s  # a noisy figure must not turn into a stream
        self.last: dict | None = None
        self.last_at = -1e18

    def should_send(self, values: dict, now: float) -> bool:
        if self.last is None or now - self.last_at >= self.every_s:
            return True
        if now - self.last_at < self.min_gap_s:
            return False
        return any(abs(values.get(k, 0) - self.last.get(k, 0)) >= t
                   for k, t in THRESHOLDS.items() if k in values)

    def sent(self, values: dict, now: float) -> None:
        self.last, self.last_at = dict(values), now
