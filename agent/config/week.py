"""Working hours, sans I/O: a weekly schedule with dated exceptions, and what it wants
at a given local time.

    week = ["mon-fri 08:00-18:00", "sat 10:00-12:30,13:00-16:00"]   # days not listed: off
    exceptions = ["2026-12-25 off", "2026-12-24 08:00-12:00"]

Spans are separated by commas or spaces (an environment override splits its list at
commas: EDGE_AGENT_HOURS_WEEK="mon-fri 08:00-12:00 13:00-18:00,sat 10:00-14:00").

A span ends at most at 24:00 and never before it starts; a night across midnight is two
spans ("fri 20:00-24:00", "sat 00:00-02:00"). Local time is the caller's business (a
naive datetime in the schedule's zone), so a DST change or a clock set by NTP is only a
different answer on the next question.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
MAX_ENTRIES = 64
_SPAN = re.compile(r"([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]|24):([0-5]\d)")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")

Spans = tuple[tuple[int, int], ...]   # minutes from midnight, [start, end)


class ScheduleError(ValueError):
    """One line naming the entry and what is wrong with it."""


def _spans(text: str, where: str) -> Spans:
    if text == "off":
        return ()
    spans = []
    for part in re.split(r"[,\s]+", text):
        m = _SPAN.fullmatch(part.strip())
        if not m:
            raise ScheduleError(f"{where}: {part.strip()[:20]!r} is not HH:MM-HH:MM or off")
        start, end = int(m[1]) * 60 + int(m[2]), int(m[3]) * 60 + int(m[4])
        if end > 24 * 60 or end <= start:
            raise ScheduleError(f"{where}: {part.strip()} ends before it starts (a night "
                                f"across midnight is two spans)")
        spans.append((start, end))
    return tuple(sorted(spans))


def _days(text: str, where: str) -> list[int]:
    days: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        if first not in DAYS or (last and last not in DAYS):
            raise ScheduleError(f"{where}: {part[:20]!r} is not a day (mon..sun) or a range "
                                f"of them (mon-fri)")
        a, b = DAYS.index(first), DAYS.index(last or first)
        if b < a:
            raise ScheduleError(f"{where}: {part} runs backwards")
        days.extend(range(a, b + 1))
    return days


@dataclass(frozen=True)
class Schedule:
    """The working hours: each weekday's spans and the dates that differ."""
    week: tuple[Spans, ...]            # Monday first
    exceptions: dict[date, Spans]

    @staticmethod
    def parse(week: list[str], exceptions: list[str]) -> "Schedule":
        if len(week) > MAX_ENTRIES or len(exceptions) > MAX_ENTRIES:
            raise ScheduleError(f"hours: at most {MAX_ENTRIES} entries each")
        days: list[Spans] = [()] * 7
        seen: set[int] = set()
        for i, entry in enumerate(week):
            where = f"hours.week[{i}]"
            day_text, _, spans_text = entry.strip().partition(" ")
            spans = _spans(spans_text.strip(), where)
            for d in _days(day_text, where):
                if d in seen:
                    raise ScheduleError(f"{where}: {DAYS[d]} is given twice")
                seen.add(d)
                days[d] = spans
        dated: dict[date, Spans] = {}
        for i, entry in enumerate(exceptions):
            where = f"hours.exceptions[{i}]"
            day_text, _, spans_text = entry.strip().partition(" ")
            if not _DATE.fullmatch(day_text):
                raise ScheduleError(f"{where}: {day_text[:20]!r} is not a date (YYYY-MM-DD)")
            try:
                day = date.fromisoformat(day_text)
            except ValueError:
                raise ScheduleError(f"{where}: {day_text} is not a date") from None
            if day in dated:
                raise ScheduleError(f"{where}: {day_text} is given twice")
            dated[day] = _spans(spans_text.strip(), where)
        return Schedule(tuple(days), dated)

    def spans_on(self, day: date) -> Spans:
        return self.exceptions.get(day, self.week[day.weekday()])

    def wanted(self, local: datetime) -> bool:
        """Whether the display should be on at this local time."""
        minute = local.hour * 60 + local.minute
        return any(start <= minute < end for start, end in self.spans_on(local.date()))

    def next_change(self, local: datetime) -> datetime | None:
        """The next local minute at which wanted() changes, within eight days; None if it
        never does (always on, or always off)."""
        now = self.wanted(local)
        base = local.replace(second=0, microsecond=0)
        for day_offset in range(9):
            day = (base + timedelta(days=day_offset)).date()
            edges = sorted({m for span in self.spans_on(day) for m in span} | {0})
            for minute in edges:
                at = datetime.combine(day, datetime.min.time()) + timedelta(minutes=minute)
                if at > local and self.wanted(at) != now:
                    return at
        return None
