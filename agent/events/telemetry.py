"""Telemetry with psutil, sent only when it changed enough or every few minutes."""
from __future__ import annotations

import logging
import os
import threading
import time

log = logging.getLogger("edge_agent.events")

# psutil is read this often to see whether anything moved: on a turn of the link loop
# that falls due (EventWatcher.turn), so an idle agent wakes no thread for it.
SAMPLE_EVERY_S = 60.0

# How much a figure must move to be worth a message before the periodic one.
THRESHOLDS = {"cpu_percent": 25.0, "mem_percent": 10.0, "disk_free_mb": 100.0,
              "soc_temp_c": 5.0, "agent_rss_mb": 20.0}


# hwmon chips whose first sensor is the SoC's (Raspberry Pi, other ARM boards, x86)
SOC_SENSORS = ("cpu_thermal", "soc_thermal", "coretemp")
RESCAN_S = 600.0   # how often a board without a known sensor looks for one again


class TelemetrySampler:
    """psutil figures, and the SoC temperature from its one hwmon file.

    An idle agent samples once a minute, on a wake-up of its own, so what does not
    change is looked up once: the boot time, the process handle, and which file holds
    the temperature (psutil.sensors_temperatures() reads every sensor of every chip,
    the larger part of a sample's CPU on a Pi)."""

    def __init__(self, state_dir: str, sysfs_root: str = "/sys"):
        import psutil  # ImportError here: telemetry is optional, the callers say so
        self._psutil = psutil
        self.state_dir = state_dir
        self._hwmon = os.path.join(sysfs_root, "class", "hwmon")
        self._boot_time = psutil.boot_time()
        self._process = psutil.Process()
        self._temperature_file: str | None = None
        self._scanned_at = -1e18

    def sample(self) -> dict:
        psutil = self._psutil
        memory = psutil.virtual_memory()
        out = {"cpu_percent": psutil.cpu_percent(interval=None),
               "mem_percent": memory.percent,
               "mem_total_mb": round(memory.total / 2 ** 20),
               "mem_available_mb": round(memory.available / 2 ** 20),
               "uptime_s": round(time.time() - self._boot_time),
               "agent_rss_mb": round(self._process.memory_info().rss / 2 ** 20, 1)}
        try:
            disk = psutil.disk_usage(self.state_dir)
            out["disk_free_mb"] = round(disk.free / 2 ** 20)
            out["disk_total_mb"] = round(disk.total / 2 ** 20)
        except OSError:
            pass
        temperature = self._soc_temperature()
        if temperature is not None:
            out["soc_temp_c"] = temperature
        return out

    def _soc_temperature(self) -> float | None:
        if self._temperature_file is None:
            now = time.monotonic()
            if now - self._scanned_at < RESCAN_S:
                return None
            self._scanned_at = now
            self._temperature_file = self._find_sensor()
            if self._temperature_file is None:
                return None
        try:
            with open(self._temperature_file) as f:
                return round(int(f.read()) / 1000, 1)   # millidegrees
        except (OSError, ValueError):
            self._temperature_file = None  # the chip went away: look again later
            return None

    def _find_sensor(self) -> str | None:
        found = {}
        try:
            chips = os.listdir(self._hwmon)
        except OSError:
            return None
        for chip in chips:
            try:
                with open(os.path.join(self._hwmon, chip, "name")) as f:
                    name = f.read().strip()
            except OSError:
                continue
            path = os.path.join(self._hwmon, chip, "temp1_input")
            if name in SOC_SENSORS and name not in found and os.path.exists(path):
                found[name] = path
        return next((found[n] for n in SOC_SENSORS if n in found), None)


class TelemetrySource:
    """At most one sample a minute, shared by the heartbeat (ScreenTinker carries
    telemetry in it) and the device.telemetry events; safe from any thread. Optional:
    without psutil, or with /proc hidden, it says so once and is empty from then on."""

    def __init__(self, state_dir: str, sysfs_root: str = "/sys",
                 clock=time.monotonic, every_s: float = SAMPLE_EVERY_S):
        self._args = (state_dir, sysfs_root)
        self._clock = clock
        self.every_s = every_s
        self._sampler: TelemetrySampler | None = None
        self._unavailable = False
        self._at = -1e18
        self._value: dict = {}
        self._lock = threading.Lock()

    def get(self) -> dict:
        with self._lock:
            now = self._clock()
            if now - self._at >= self.every_s and not self._unavailable:
                self._at = now
                try:
                    if self._sampler is None:
                        self._sampler = TelemetrySampler(*self._args)
                    self._value = self._sampler.sample()
                except Exception as e:  # telemetry must never cost a heartbeat
                    self._unavailable = True
                    self._value = {}
                    log.warning("telemetry unavailable (%s: %s); not sending it",
                                type(e).__name__, e)
            return dict(self._value)


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
