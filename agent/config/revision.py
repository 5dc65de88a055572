"""The fleet's layer of the configuration, sans I/O: what a revision may look like, and
when a setting expires (the overlay file holding it: overlay.py).

A setting may carry an expiry (debug logging for an hour). Its deadline is on the
monotonic clock of the boot it was set in: a Pi has no RTC, so wall time may be wrong
by years until NTP answers, while CLOCK_MONOTONIC counts the same across the agent's
restarts within one boot. A reboot ends every setting with an expiry: how long the
device was off is unknowable without a synchronised clock, and a temporary setting
that outlives its hour is the worse mistake.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

MAX_REVISION = 2 ** 53          # what a JSON number holds exactly
MAX_SETTINGS = 64
MAX_EXPIRY_S = 30 * 86400.0
MAX_LIST = 64                   # items of a list value (commands.allow, hours.week)
MAX_TEXT = 2048
KEY = re.compile(r"[a-z][a-z0-9_]{0,31}(?:\.[a-z][a-z0-9_]{0,31}){1,3}")


def finite(value) -> float | None:
    """A number from outside (a JSON document, a server's message) as a finite float, or
    None: a bool, a string, inf, nan, or an integer too large for a float (400 digits
    raise OverflowError in float() and in math.isfinite()). The one test of "a finite
    number" for what a server or a file on the card says."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and abs(value) > 2 ** 63:
        return None
    return float(value) if math.isfinite(value) else None


def revision_args(args: dict) -> dict:
    """The configure command's arguments: ``{"revision": n, "settings": {"log.level":
    "debug", "link.heartbeat_interval_s": {"value": 10, "expires_in_s": 3600}}}``.
    Shape only; what a key may hold is config's rule, checked when it is applied. No
    revision: the next after the last this screen saw (a protocol without revisions)."""
    unknown = set(args) - {"revision", "settings"}
    if unknown:
        raise ValueError(f"unknown argument {sorted(unknown)[0][:40]!r}")
    revision = args.get("revision")
    if revision is not None and (isinstance(revision, bool) or not isinstance(revision, int)
                                 or not 1 <= revision <= MAX_REVISION):
        raise ValueError(f"revision: an integer from 1 to {MAX_REVISION}")
    settings = args.get("settings")
    if not isinstance(settings, dict) or len(settings) > MAX_SETTINGS:
        raise ValueError(f"settings: an object of at most {MAX_SETTINGS} keys")
    values, expires = {}, {}
    for key, given in settings.items():
        if not isinstance(key, str) or not KEY.fullmatch(key):
            raise ValueError(f"settings: {str(key)[:40]!r} is not a key such as log.level")
        if isinstance(given, dict):
            if set(given) - {"value", "expires_in_s"} or "value" not in given:
                raise ValueError(f"settings.{key}: a value, or {{value, expires_in_s}}")
            expiry = given.get("expires_in_s")
            if expiry is not None:
                if finite(expiry) is None or not 0 < expiry <= MAX_EXPIRY_S:
                    raise ValueError(f"settings.{key}.expires_in_s: seconds, at most "
                                     f"{MAX_EXPIRY_S:g}")
                expires[key] = float(expiry)
            given = given["value"]
        values[key] = _plain(key, given)
    return {"revision": revision, "values": values, "expires_in_s": expires}


def stored_values(values) -> dict:
    """A revision's values as the overlay file holds them, checked as when they arrived
    (the file may have been damaged since): ValueError otherwise."""
    if not isinstance(values, dict) or len(values) > MAX_SETTINGS:
        raise ValueError("values: not an object of settings")
    for key, value in values.items():
        if not isinstance(key, str) or not KEY.fullmatch(key):
            raise ValueError("values: not a setting's key")
        _plain(key, value)
    return values


def _plain(key: str, value):
    # an integer past what a JSON number holds exactly is no setting (and overflows a float)
    if isinstance(value, bool) or (isinstance(value, int) and abs(value) <= MAX_REVISION) \
            or (isinstance(value, float) and math.isfinite(value)):
        return value
    if isinstance(value, str) and len(value) <= MAX_TEXT:
        return value
    if isinstance(value, list) and len(value) <= MAX_LIST \
            and all(isinstance(x, str) and len(x) <= 64 for x in value):
        return list(value)
    raise ValueError(f"settings.{key}: a number, true/false, a string or a list of strings")


@dataclass(frozen=True)
class Expiry:
    """A setting's end: a monotonic deadline within one boot."""
    boot: str       # the kernel's boot_id when it was set
    at: float       # CLOCK_MONOTONIC deadline within that boot

    def passed(self, boot: str, now: float) -> bool:
        return boot != self.boot or now >= self.at


def expiries(expires_in_s: dict, boot: str, now: float) -> dict[str, Expiry]:
    return {key: Expiry(boot, now + seconds) for key, seconds in expires_in_s.items()}


def live(values: dict, until: dict[str, Expiry], boot: str, now: float) -> tuple[dict, list]:
    """(the values still in force, the keys whose time is over)."""
    over = sorted(k for k, e in until.items() if k in values and e.passed(boot, now))
    return {k: v for k, v in values.items() if k not in over}, over


def next_expiry(values: dict, until: dict[str, Expiry], boot: str, now: float) -> float | None:
    """The monotonic time the next setting in force expires, None if none will."""
    ahead = [e.at for k, e in until.items() if k in values and not e.passed(boot, now)]
    return min(ahead, default=None)
