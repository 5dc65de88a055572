"""The system's own (hardware) watchdog, as systemd runs it: the Pi's limit, the drop-in
that asks systemd for it, and what is said of it (doctor, status). Pure: root's start
step (programs/system_watchdog.py) writes the text this gives, the doctor and the device
part read what this judges.

systemd's PID 1 opens /dev/watchdog0 and pets it every half ``RuntimeWatchdogSec``: a
kernel or PID 1 that stops answering resets the board, which no service's watchdog can
do. The Pi's watchdog is the BCM2835's (Linux drivers/watchdog/bcm2835_wdt.c): a
20-bit count of 65536 ticks a second, ``max_timeout = WDOG_TICKS_TO_SECS(PM_WDOG_TIME_SET)``
= 0xfffff >> 16 = 15 s; the kernel refuses a longer timeout (watchdog_dev.c: EINVAL), so
15 s is the bound.
"""
from __future__ import annotations

from dataclasses import dataclass

PI_MAX_S = 15          # bcm2835_wdt.c: 0xfffff ticks >> 16 (65536 ticks a second)
# below this, a PID 1 held a few seconds by a slow card's write (it pets every half
# period) resets a healthy screen
MIN_S = 5
# in /etc, not /run: PID 1 reads it when it starts, so the watchdog covers the boot
# itself (a kernel or PID 1 hung before the agent's start); written only when the
# setting changes, never per start. Sorted after a two-digit drop-in of the operator's:
# while configured, this one's value is the one in force
DROPIN_DIR = "/etc/systemd/system.conf.d"
DROPIN_NAME = "edge-agent-watchdog.conf"
DROPIN = f"{DROPIN_DIR}/{DROPIN_NAME}"
DEVICE = "watchdog0"   # systemd's default WatchdogDevice=/dev/watchdog0
USEC_INFINITY = (1 << 64) - 1   # systemd's "default": the device's own timeout
MAX_DROPIN = 4096


def dropin_text(seconds: int | None, source: str = "/etc/edge-agent/agent.toml") -> str | None:
    """The drop-in for a watchdog of ``seconds`` (None: no drop-in at all)."""
    if seconds is None:
        return None
    return ("# Written by edge-agent.service's start step (agent/programs/system_watchdog.py):\n"
            f"# [device] hardware_watchdog = true in {source}. Removed at the start after\n"
            "# it is turned off: change that file, not this one.\n"
            "[Manager]\n"
            f"RuntimeWatchdogSec={int(seconds)}s\n")


def parse_busctl(out: str) -> float | None:
    """``busctl get-property ... RuntimeWatchdogUSec``'s answer (``t 15000000``) in
    seconds; ``inf`` for systemd's "default"; None for anything else."""
    words = out.split()
    if len(words) != 2 or words[0] != "t" or not words[1].isdigit() or len(words[1]) > 20:
        return None
    usec = int(words[1])
    return float("inf") if usec >= USEC_INFINITY else usec / 1e6


@dataclass(frozen=True)
class Device:
    """What sysfs says of /dev/watchdog0 (/sys/class/watchdog/watchdog0); each None where
    the kernel does not say it (no CONFIG_WATCHDOG_SYSFS)."""
    identity: str | None = None
    timeout_s: int | None = None
    max_timeout_s: int | None = None
    active: bool | None = None      # its ``state``: a timer someone started

    def words(self) -> str:
        facts = [f"timeout {self.timeout_s} s" if self.timeout_s is not None else "",
                 {True: "running", False: "stopped", None: ""}[self.active]]
        facts = [f for f in facts if f]
        return f"{self.identity or DEVICE}" + (f" ({', '.join(facts)})" if facts else "")


ARMED, CONFIGURED, OFF, NOT_ARMED, OTHERS, UNKNOWN, NO_DEVICE = (
    "armed", "configured", "off", "not-armed", "armed-by-others", "unknown", "no-device")


def _span(seconds: float) -> str:
    return "the device's own timeout" if seconds == float("inf") else f"{seconds:g} s"


def judge(configured_s: int | None, systemd_s: float | None, device: Device | None,
          dropin: bool | None = None, asked: bool = True) -> tuple[str, str]:
    """(a word, one line) for the system's watchdog: ``configured_s`` what [device] asks
    (None: off), ``systemd_s`` systemd's RuntimeWatchdogUSec in seconds (0: off; None:
    not known: ``asked`` False where nobody asked systemd), ``device`` sysfs' watchdog0
    (None: no such device here), ``dropin`` whether the drop-in is there (None: not
    looked at). The device's own word (a timer running at the configured timeout) is
    what armed means; systemd's says what it was told."""
    here = f"/dev/{DEVICE}: {device.words()}" if device is not None else \
        "no watchdog device here"
    if configured_s is None:
        if systemd_s:
            return OTHERS, (f"not configured here ([device] hardware_watchdog); systemd "
                            f"pets it at {_span(systemd_s)} by another setting; {here}")
        if device is not None and device.active:
            return OTHERS, (f"not configured here ([device] hardware_watchdog); {here}: "
                            "another program runs it")
        return OFF, f"off ([device] hardware_watchdog); {here}"
    if dropin is False:
        return NOT_ARMED, (f"configured ({configured_s} s), but {DROPIN} is not there: the "
                           f"agent's start step writes it; {here}")
    if systemd_s is not None and systemd_s != configured_s:
        return NOT_ARMED, (f"configured ({configured_s} s), but systemd's RuntimeWatchdogSec "
                           f"is {_span(systemd_s) if systemd_s else 'off'}; {here}")
    told = (f"systemd's RuntimeWatchdogSec is {configured_s} s" if systemd_s is not None
            else "systemd was not asked" if not asked else "systemd did not say its setting")
    if device is None:
        return NO_DEVICE, f"configured, no watchdog device here ({told})"
    if device.max_timeout_s is not None and configured_s > device.max_timeout_s:
        return NOT_ARMED, (f"configured ({configured_s} s), over what this device takes "
                           f"({device.max_timeout_s} s); {here}")
    if device.active is False:
        return NOT_ARMED, (f"configured ({configured_s} s), but the device's timer is "
                           f"stopped ({told}); {here}")
    if device.active is None and systemd_s is None:
        return UNKNOWN, f"configured ({configured_s} s), {told}; {here}"
    if device.timeout_s is not None and device.timeout_s != configured_s:
        return CONFIGURED, (f"armed at {device.timeout_s} s where {configured_s} s is "
                            f"configured (the device's nearest); {here}")
    return ARMED, (f"armed: systemd pets {here} every {configured_s / 2:g} s; the board "
                   f"resets {configured_s} s after the last")
