"""Power and heat as the Pi firmware tells them, without vcgencmd: sans I/O.

The firmware's throttled word (``get_throttled``: the raspberrypi firmware driver's file in
sysfs on newer kernels) has four flags now (bits 0-3) and the same four since boot
(bits 16-19). The raspberrypi-hwmon driver asks the firmware every 2 s and clears the
sticky bits each time, so "since boot" is kept here too: every flag seen, by either, since
the agent started. The hwmon driver's ``in0_lcrit_alarm`` says under-voltage now where
there is no word; the events part's latch (events/model.py) goes on telling
``power.undervoltage`` from it, and this sits beside it.
"""
from __future__ import annotations

UNDER_VOLTAGE, FREQ_CAPPED, THROTTLED, SOFT_TEMP = (
    "under-voltage", "frequency-capped", "throttled", "soft-temperature-limit")
FLAGS = (UNDER_VOLTAGE, FREQ_CAPPED, THROTTLED, SOFT_TEMP)   # bits 0..3, and 16..19
SINCE_SHIFT = 16
EVENT = "device.power"
MAX_WORD = 0xFFFFFFFF


def parse_word(text: str) -> int | None:
    """``get_throttled``'s hex word ("50005", "0x50005"); None for anything else."""
    text = text.strip().lower()
    text = text[2:] if text.startswith("0x") else text
    if not 0 < len(text) <= 8 or any(c not in "0123456789abcdef" for c in text):
        return None
    return int(text, 16)


def flags_of(word: int, shift: int = 0) -> frozenset:
    return frozenset(name for bit, name in enumerate(FLAGS) if word >> (bit + shift) & 1)


class PowerFlags:
    """The flags now and since boot, and news on a change of either."""

    def __init__(self):
        self.now: frozenset | None = None
        self.since: frozenset = frozenset()
        self.source: str | None = None   # "firmware", "hwmon", or None: neither is there

    def feed(self, word: int | None, hwmon_alarm: str | None) -> dict | None:
        """The firmware's word (None: not exposed) and the hwmon alarm ("1", "0" or None);
        the event's details when what is said changed. The first reading is news only
        when a flag is up."""
        if word is not None:
            now, since, source = flags_of(word), flags_of(word, SINCE_SHIFT), "firmware"
        elif hwmon_alarm is not None:
            now = frozenset({UNDER_VOLTAGE}) if hwmon_alarm.strip() == "1" else frozenset()
            since, source = frozenset(), "hwmon"
        else:
            now, since, source = frozenset(), frozenset(), None
        was_now, was_since = self.now, self.since
        self.now, self.since, self.source = now, was_since | since | now, source
        if was_now is None:
            return self._details(None) if self.now or self.since else None
        if now == was_now and self.since == was_since:
            return None
        return self._details(was_now)

    def _details(self, was: frozenset | None) -> dict:
        return {"now": _ordered(self.now), "since_boot": _ordered(self.since),
                "was": None if was is None else _ordered(was), "source": self.source}

    def snapshot(self) -> dict | None:
        if self.now is None:
            return None
        return {"now": _ordered(self.now), "since_boot": _ordered(self.since),
                "source": self.source}


def _ordered(flags: frozenset) -> list[str]:
    return [f for f in FLAGS if f in flags]
