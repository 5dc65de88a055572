"""Remote operations, sans I/O: which command runs, at most once, and what is reported.

One way in, h11's: ``CommandCore.handle(event) -> [effect]``. The events are what
happens to it (``Recovered`` at the start, ``Received``, ``Finished``, ``ResultAcked``,
``Connected``), each carrying the time it happened; the effects are what the shell does,
in the order given, which is the rule: ``Persist`` (the ledger's new lines) comes before
every ``Run`` and ``Report`` it records. The core has no timer of its own (the rate and
the expiry are judged when a command arrives), so it has no deadline and takes no tick.

A command comes with an id, a name, arguments and an expiry. Each id runs at most once,
whatever happens around it: the record that it started is written durably *before* it
runs (a ``Persist`` with ``durable`` ahead of its ``Run``: the shell appends it to the
ledger, synced, then acts), so a reboot, a crash or a kill -9 in the middle never leads
to a second run, and the record of a command interrupted by the restart or reboot it
caused is turned into its result at the next start. Expired, duplicate, unknown, forbidden and malformed
commands get an error result and run nothing. A result is reported until the server
ACKs it.

A flood from the server costs bounded work, memory and disk:

- Admission: a token bucket (``BURST`` at once, ``RATE_PER_S`` after that, on the
  monotonic clock) and at most ``MAX_PENDING`` commands queued or running. What is over
  either is refused at once with a result the server sees (``rate-limited`` / ``busy``)
  and is neither recorded nor remembered: it did not run, and the same id may be sent
  again later.
- Memory: the ids of the last ``MAX_ENTRIES`` commands, plus a horizon for the ones
  forgotten. The reference server's ids are random (no order to keep a high-water mark
  of), so the horizon is on the server's own ``expires_at`` (its issue time plus the
  command's time to live): forgetting a command raises ``floor`` to its
  ``expires_at``, and an unknown id whose ``expires_at`` is at or below the floor is
  refused as possibly already run. A resend carries the same ``expires_at`` as the
  original, so a forgotten id can never pass; the rule compares the server's clock with
  itself, so a wrong device clock does not weaken it. A command newer than a forgotten
  one but with a shorter life can be refused too: safe, and the server can send it
  again with a longer one. Forgetting a command that had no ``expires_at`` leaves
  nothing to compare a resend with, so such commands are forgotten last, and once one
  was, commands without ``expires_at`` are refused (``closed``). With ``ids_ours`` (the
  ScreenTinker profile, whose protocol has no ids: the agent mints a random one per
  message, and nothing ever sends it again) forgetting needs no horizon.
"""
from __future__ import annotations

import json
import unicodedata
import re
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Callable, NamedTuple, Union

from ..base.vocabulary import MAX_COMMAND_ID
from ..config.revision import finite, revision_args
from ..update.rules import order_args

MAX_ID = MAX_COMMAND_ID
MAX_ENTRIES = 128        # ids remembered one by one; older ones are behind the horizon
MAX_PENDING = 8          # queued or running at once
BURST = 10               # commands admitted at once...
RATE_PER_S = 1 / 3.0     # ...and after that, one every 3 s (20 a minute)
MAX_OUTPUT = 4000        # bytes of a result's output as the ledger writes it (JSON)
MAX_ERROR = 1000
SUMMARY = 300            # what a confirmed result keeps (status shows 300 characters)

# name -> argument checker: returns the clean arguments, or raises ValueError(why)
ArgCheck = Callable[[dict], dict]


def no_args(args: dict) -> dict:
    if args:
        raise ValueError(f"takes no arguments, got {', '.join(sorted(args))[:80]}")
    return {}


def _int_arg(args: dict, name: str, default: int, low: int, high: int) -> int:
    value = args.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name}: an integer from {low} to {high}")
    return value


def logs_args(args: dict) -> dict:
    unknown = set(args) - {"since_s", "priority"}
    if unknown:
        raise ValueError(f"unknown argument {sorted(unknown)[0][:40]}")
    return {"since_s": _int_arg(args, "since_s", 3600, 1, 7 * 86400),
            "priority": _int_arg(args, "priority", 6, 0, 7)}


def display_args(args: dict) -> dict:
    if set(args) != {"state"} or args["state"] not in ("on", "off"):
        raise ValueError('state: "on" or "off"')
    return {"state": args["state"]}


def level_args(args: dict) -> dict:
    """brightness and volume: ``level``, a fraction from 0 to 1 (ScreenTinker's slider
    sends percent / 100)."""
    level = finite(args.get("level"))
    if set(args) != {"level"} or level is None or not 0 <= level <= 1:
        raise ValueError("level: a number from 0 to 1")
    return {"level": level}


# the shell's one line: what 1.9's dashboard shows of it (cmd.slice(0, 500)) and more
MAX_SHELL_LINE = 1000
# what a shell's result keeps of its output (JSON-escaped, as the ledger writes it):
# what 1.9's dashboard shows (output.slice(0, 8000)); a few such results in the ledger
# stay far below its bound, and once confirmed each is cut to SUMMARY like any other
SHELL_OUTPUT = 8000
OUTPUT_LIMIT = {"shell": SHELL_OUTPUT}
# set-time's bounds: a clock set before this build existed, or past 2100, is a mistake
# (a millisecond value sent as seconds, a year typed wrong), never a correction
EARLIEST_TIME = 1735689600.0   # 2025-01-01T00:00:00Z
LATEST_TIME = 4102444800.0     # 2100-01-01T00:00:00Z
# an IANA zone's shape, the configuration's TIME_ZONE rule; the shell checks that
# tzdata lists it and its file is inside the zone database (commands/operator.py)
ZONE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_+-]*(?:/[A-Za-z0-9][A-Za-z0-9_+-]*){0,2}")
MAX_ZONE = 64


def shell_args(args: dict) -> dict:
    """One command line for ``sh -c``: text, one line, no control characters (what the
    journal and the dashboard show of it is what runs)."""
    cmd = args.get("cmd")
    if set(args) != {"cmd"} or not isinstance(cmd, str) or not cmd.strip():
        raise ValueError("cmd: one command line")
    if len(cmd) > MAX_SHELL_LINE:
        raise ValueError(f"cmd: at most {MAX_SHELL_LINE} characters")
    # controls (C0, DEL, C1) and invisible formatting (bidirectional overrides, zero
    # widths): what an operator reads of the line must be what runs; a tab is a space
    if any(c != "\t" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in cmd):
        raise ValueError("cmd: one line, without control or invisible characters")
    return {"cmd": cmd}


def set_time_args(args: dict) -> dict:
    """``time``: seconds since the epoch, or ISO 8601 with its offset (``Z``, ``+02:00``):
    a time without one would mean whatever zone the screen is in, which may be the very
    thing being corrected. ``force``: true to set a time far from the server's clock
    (commands/operator.py). Returns whole seconds since the epoch, and force if given."""
    when = args.get("time")
    if not {"time"} <= set(args) <= {"time", "force"}:
        raise ValueError("time: seconds since the epoch or ISO 8601 with an offset")
    force = args.get("force", False)
    if not isinstance(force, bool):
        raise ValueError("force: true or false")
    if isinstance(when, str) and len(when) <= 40:
        try:
            parsed = datetime.fromisoformat(when.strip().replace("z", "Z"))
        except ValueError:
            raise ValueError("time: not ISO 8601 (2026-12-05T19:40:00Z)") from None
        if parsed.tzinfo is None:
            raise ValueError("time: ISO 8601 needs its offset (Z or +hh:mm)")
        seconds: float | None = parsed.timestamp()
    else:
        seconds = finite(when)
    if seconds is None:
        raise ValueError("time: seconds since the epoch or ISO 8601 with an offset")
    if not EARLIEST_TIME <= seconds < LATEST_TIME:
        raise ValueError("time: out of bounds (2025 to 2100)")
    return {"time": int(seconds), **({"force": True} if force else {})}


def set_timezone_args(args: dict) -> dict:
    zone = args.get("zone")
    if set(args) != {"zone"} or not isinstance(zone, str) or len(zone) > MAX_ZONE \
            or not ZONE_NAME.fullmatch(zone):
        raise ValueError("zone: an IANA time zone such as Europe/Berlin")
    return {"zone": zone}


COMMANDS: dict[str, ArgCheck] = {
    "diagnostics": no_args, "logs": logs_args, "screenshot": no_args,
    "display": display_args, "restart-agent": no_args, "reboot": no_args,
    "update": order_args, "configure": revision_args,
    "restart-player": no_args, "brightness": level_args, "volume": level_args,
    "poweroff": no_args,
    "shell": shell_args, "set-time": set_time_args, "set-timezone": set_timezone_args,
}
# What a restart of the agent or of the device in the middle means for each command.
SURVIVES = {"restart-agent": "the agent restarted", "reboot": "the device rebooted",
            "poweroff": "the device powered off (started again since)"}


@dataclass
class Outcome:
    """What running a command gave: its result as the ledger keeps it and the server hears
    it. ``extra`` carries what a result adds (an upload's id)."""
    ok: bool
    output: str | None = None
    error: str | None = None
    extra: dict = field(default_factory=dict)


# the result of a command that restarts what runs it, before the restart settles it
LATER = Outcome(True, "the result comes after the restart it causes")


@dataclass(frozen=True)
class Run:
    id: str
    name: str
    args: dict


# a Report's why for a duplicate's stored result: said again, not a new result
RESEND = "a resend"


@dataclass(frozen=True)
class Report:
    result: dict
    # False: an answer that changes nothing here (a refusal not remembered, the stored
    # result for a resend): sent once, unconfirmed, no status refresh; ``why`` says which
    kept: bool = True
    why: str = ""


@dataclass(frozen=True)
class Persist:
    """The ledger's new lines: ``changes`` [(id, the entry as it is now, or None once
    forgotten)], in order, and the horizon after them. ``durable``: synced before the
    shell does anything that follows it (a ``Run`` it records, a result it keeps). The
    entries are copies: what the core changes later is not in them."""
    changes: tuple
    durable: bool
    horizon: dict


# -- events: what happens to the core, each with the time it happened ------------------

class Recovered(NamedTuple):
    """The agent started (``boot``, ``pid``: this start's, ``now``: wall time): what the
    ledger says was running was interrupted. ``updates``: for each running ``update``,
    its outcome as (ok, text), or None while the root side still has it."""
    boot: str
    pid: int
    now: float
    updates: dict | None = None


class Received(NamedTuple):
    """A command from the server, in any shape. ``now``: wall time (for reports);
    ``mono``: the monotonic clock (for the rate); ``server_now``: the server's clock as
    the link measured it (base/server_clock.py), None before a measure: ``expires_at``
    is the server's time, judged by the server's clock, so a device clock years off
    refuses nothing; this device's only before any measure. ``boot``, ``pid``: this
    start's, kept with the entry for ``Recovered``."""
    raw: object
    now: float
    mono: float
    server_now: float | None = None
    boot: str = ""
    pid: int = 0


class Finished(NamedTuple):
    """A command the shell ran gave its outcome (``started``, ``now``: wall times)."""
    id: str
    ok: bool
    output: str | None
    error: str | None
    started: float | None
    now: float
    extra: dict | None = None


class ResultAcked(NamedTuple):
    """The server confirmed a result: it need not be sent again."""
    id: str


class Connected(NamedTuple):
    """A new connection: every result the server has not confirmed goes again."""


Event = Union[Recovered, Received, Finished, ResultAcked, Connected]
Effect = Union[Persist, Run, Report]


@dataclass
class Entry:
    id: str
    name: str
    state: str                 # running | done
    received_at: float         # wall, for reports
    boot_id: str = ""
    pid: int = 0
    result: dict | None = None
    acked: bool = False
    expires_at: float | None = None   # the server's, for the horizon when forgotten
    admitted: bool = True      # given to run (a refusal's resend is refused again anyway)

    def to_dict(self) -> dict:
        return {k: v for k, v in vars(self).items()}

    @staticmethod
    def from_dict(d: dict) -> "Entry | None":
        try:
            expires = d.get("expires_at")
            e = Entry(str(d["id"]), str(d["name"]), str(d["state"]), float(d["received_at"]),
                      str(d.get("boot_id", "")), int(d.get("pid", 0)),
                      d.get("result") if isinstance(d.get("result"), dict) else None,
                      bool(d.get("acked", False)),
                      float(expires) if expires is not None else None,
                      bool(d.get("admitted", True)))
        # ArithmeticError: a number no float holds (400 digits) on a damaged card
        except (KeyError, TypeError, ValueError, AttributeError, ArithmeticError):
            return None
        return e if e.state in ("running", "done") and e.id else None


@dataclass
class TokenBucket:
    """``burst`` at once, then ``rate_per_s``; on a monotonic clock."""
    burst: float = BURST
    rate_per_s: float = RATE_PER_S
    tokens: float = BURST
    at: float | None = None

    def take(self, mono: float) -> bool:
        if self.at is not None:
            # a clock that went back (a fake one, a bug) refills nothing
            self.tokens = min(self.burst, self.tokens + max(0.0, mono - self.at) * self.rate_per_s)
        self.at = mono
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def wait_s(self) -> float:
        return max(0.0, (1.0 - self.tokens) / self.rate_per_s)


@dataclass
class CommandCore:
    allow: frozenset
    entries: dict = field(default_factory=dict)   # id -> Entry, oldest first
    floor: float | None = None    # an unknown id with expires_at at or below: refused
    closed: bool = False          # a command without expires_at was forgotten
    ids_ours: bool = False        # every id was minted by this agent, never sent again
    bucket: TokenBucket = field(default_factory=TokenBucket)
    # what the event being handled changed, for its Persist: id -> the entry as it is
    # now, or None once forgotten (in order); and whether it must be durable first
    _changes: dict = field(default_factory=dict, init=False, repr=False)
    _durable: bool = field(default=False, init=False, repr=False)

    def handle(self, event: Event) -> list[Effect]:
        """What ``event`` changes, and what the shell does about it, in order: the
        ``Persist`` of what changed first, then what it records (a ``Run``, a
        ``Report``): nothing is done or said that the ledger does not hold."""
        self._changes, self._durable = {}, False
        if isinstance(event, Received):
            effects = self._received(event)
        elif isinstance(event, Finished):
            effects = self._finished(event)
        elif isinstance(event, ResultAcked):
            effects = self._result_acked(event.id)
        elif isinstance(event, Recovered):
            effects = self._recovered(event)
        elif isinstance(event, Connected):
            effects = self._unacked()
        else:
            raise TypeError(f"not a command core event: {type(event).__name__}")
        # at the start always: the shell's ledger may have a rewrite due (an older
        # format, a torn tail) with nothing changed
        if self._changes or isinstance(event, Recovered):
            changes = tuple((cid, _copy(e)) for cid, e in self._changes.items())
            effects.insert(0, Persist(changes, self._durable, self.horizon()))
        self._changes, self._durable = {}, False
        return effects

    # -- what the shell may read ------------------------------------------------------
    def running(self, name: str) -> list[str]:
        return [e.id for e in self.entries.values() if e.state == "running" and e.name == name]

    def horizon(self) -> dict:
        return {"floor": self.floor, "closed": self.closed}

    # -- events -----------------------------------------------------------------------
    def _recovered(self, ev: Recovered) -> list[Effect]:
        """Commands found running at start were interrupted: never run again; their
        result says what became of them. A running ``update`` the root side still has
        stays running, and is finished when that side is done."""
        effects: list[Effect] = []
        updates = ev.updates or {}
        for e in list(self.entries.values()):
            if e.state != "running":
                continue
            if e.name == "update" and e.id in updates:
                if updates[e.id] is None:
                    continue
                ok, detail = updates[e.id]
            elif e.name in ("reboot", "poweroff") and e.boot_id and e.boot_id != ev.boot:
                ok, detail = True, SURVIVES[e.name]
            elif e.name == "restart-agent" and e.pid != ev.pid:
                ok, detail = True, SURVIVES["restart-agent"]
            else:
                ok, detail = False, "interrupted by a restart of the agent; not run again"
            effects += self._finish(e, ok, detail if ok else None, detail if not ok else None,
                                    None, ev.now)
        self._bound()
        return effects

    def _received(self, ev: Received) -> list[Effect]:
        raw, now = ev.raw, ev.now
        if not isinstance(raw, dict):
            return []  # no id to answer to: the receipt ACK is all the server gets
        cid = raw.get("id")
        if not isinstance(cid, str) or not 0 < len(cid) <= MAX_ID:
            return []
        name = raw.get("name")
        name = str(name)[:40] if isinstance(name, str) else "?"
        known = self.entries.get(cid)
        if known is not None:
            # a duplicate (a resend after a lost receipt ACK): never a second run; the
            # result goes again if there is one (and on every connection until confirmed)
            return [Report(known.result, False, RESEND)] if known.result is not None else []
        expires = finite(raw.get("expires_at"))   # malformed ones are refused below
        if expires is not None and self.floor is not None and expires <= self.floor:
            return [self._refused(cid, name, now, "too old", (
                "too old: issued before commands this screen no longer remembers one by "
                "one, so it may have run already; not run (send it again with a new id)"))]
        if raw.get("expires_at") is None and self.closed and not self.ids_ours:
            return [self._refused(cid, name, now, "no expires_at", (
                "no expires_at: this screen has forgotten a command without one and cannot "
                "tell a resend from a new command; not run (send it with expires_at)"))]
        if not self.bucket.take(ev.mono):
            return [self._refused(cid, name, now, "rate-limited", (
                f"rate-limited: more than {BURST} commands at once or one every "
                f"{1 / RATE_PER_S:.0f}s; not run, send it again in "
                f"{self.bucket.wait_s():.0f}s"))]
        why = self._refusal(raw, now if ev.server_now is None else ev.server_now)
        if why is None and sum(e.state == "running" for e in self.entries.values()) >= MAX_PENDING:
            return [self._refused(cid, name, now, "busy", (
                f"busy: {MAX_PENDING} commands queued or running; not run, send it again "
                "later"))]
        # as the server said it (an integer stays one in the ledger's line)
        entry = Entry(cid, name, "running", now, ev.boot, ev.pid,
                      expires_at=raw["expires_at"] if expires is not None else None,
                      admitted=why is None)
        self.entries[cid] = entry
        self._changed(entry)
        if why is not None:
            effects = self._finish(entry, False, None, why, None, now)
            self._bound()
            return effects
        self._durable = True  # the record goes to disk before the command runs
        self._bound()
        return [Run(cid, raw["name"], COMMANDS[raw["name"]](raw.get("args") or {}))]

    def _finished(self, ev: Finished) -> list[Effect]:
        entry = self.entries.get(ev.id)
        if entry is None or entry.state != "running":
            return []
        return self._finish(entry, ev.ok, ev.output, ev.error, ev.started, ev.now, ev.extra)

    def _result_acked(self, cid: str) -> list[Effect]:
        entry = self.entries.get(cid)
        if entry is not None and entry.state == "done" and not entry.acked \
                and entry.result is not None:
            entry.acked = True
            # the server has the whole result: a resend's answer and the status need
            # only its gist, and the ledger stays small
            for key in ("output", "error"):
                if isinstance(entry.result.get(key), str):
                    entry.result[key] = _clip(entry.result[key], SUMMARY)
            self._changed(entry)
        return []

    def _unacked(self) -> list[Effect]:
        """Results the server has not confirmed: sent again on every new connection."""
        return [Report(e.result) for e in sorted(self.entries.values(), key=lambda e: e.received_at)
                if e.state == "done" and not e.acked and e.result is not None]

    # -- internals ----------------------------------------------------------------
    def _changed(self, entry: Entry | None, cid: str | None = None) -> None:
        key = entry.id if entry is not None else cid
        self._changes.pop(key, None)   # keep the order of the latest change
        self._changes[key] = entry

    def _refusal(self, raw: dict, now: float) -> str | None:
        name = raw.get("name")
        if not isinstance(name, str) or name not in COMMANDS:
            return f"unknown command {str(name)[:40]!r}"
        if raw.get("expires_at") is not None:
            expires = finite(raw["expires_at"])
            if expires is None:
                return "malformed: expires_at must be a time in seconds"
            if now > expires:   # the server's clock where the link measured it
                return f"expired {now - expires:.0f}s before it arrived"
        args = raw.get("args", {})
        if args is not None and not isinstance(args, dict):
            return "malformed: args must be an object"
        try:
            COMMANDS[name](args or {})
        except ValueError as e:
            return f"bad argument: {str(e)[:200]}"
        if name not in self.allow:
            return (f"{name!r} is not allowed on this screen ([commands] allow in "
                    f"agent.toml: {', '.join(sorted(self.allow)) or 'nothing'})")
        return None

    @staticmethod
    def _result(cid: str, name: str, ok: bool, output, error, received: float,
                started: float | None, now: float, extra: dict | None = None) -> dict:
        result = {"id": cid, "name": name, "ok": bool(ok), "received_at": round(received, 3),
                  "finished_at": round(now, 3)}
        if started is not None:
            result["started_at"] = round(started, 3)
        if output:
            result["output"] = _clip(str(output), OUTPUT_LIMIT.get(name, MAX_OUTPUT))
        if error:
            result["error"] = _clip(str(error), MAX_ERROR)
        if extra:
            result.update(extra)
        return result

    def _refused(self, cid: str, name: str, now: float, kind: str, why: str) -> Report:
        """A refusal that is not remembered: it ran nothing, and this id may come again."""
        return Report(self._result(cid, name, False, None, why, now, None, now), False, kind)

    def _finish(self, entry: Entry, ok: bool, output, error, started, now: float,
                extra: dict | None = None) -> list[Effect]:
        result = self._result(entry.id, entry.name, ok, output, error, entry.received_at,
                              started, now, extra)
        entry.state, entry.result, entry.acked = "done", result, False
        self._changed(entry)
        if entry.admitted:
            # what it did, lost to a power cut, could never be reported; a refusal can
            # (its resend is refused again)
            self._durable = True
        return [Report(result)]

    def _bound(self) -> None:
        """At most MAX_ENTRIES ids. A command that was given to run raises the horizon
        as it goes; a refusal does not need to (its resend is refused again: the same
        name, arguments and expiry). Forgotten first: what leaves the horizon open
        (with an expiry, or a refusal), what the server has confirmed, refusals, the
        oldest."""
        excess = len(self.entries) - MAX_ENTRIES
        if excess <= 0:
            return
        done = sorted((e for e in self.entries.values() if e.state == "done"),
                      key=lambda e: (e.admitted and e.expires_at is None and not self.ids_ours,
                                     not e.acked, e.admitted, e.received_at))
        for e in done[:excess]:
            del self.entries[e.id]
            if e.admitted and not self.ids_ours:
                if e.expires_at is None:
                    self.closed = True
                else:
                    self.floor = e.expires_at if self.floor is None else max(self.floor,
                                                                            e.expires_at)
            self._changed(None, e.id)


def _copy(entry: Entry | None) -> Entry | None:
    """An entry as it is now, for a Persist: its result is changed in place later."""
    if entry is None:
        return None
    return replace(entry, result=dict(entry.result) if entry.result is not None else None)


def _clip(text: str, limit: int) -> str:
    """At most ``limit`` bytes once written to the ledger as JSON (escapes counted)."""
    text = text[:limit]
    while len(json.dumps(text)) > limit + 2:
        text = text[:len(text) * 3 // 4]
    return text
