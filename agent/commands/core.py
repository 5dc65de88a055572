"""Remote operations, sans I/O: which command runs, at most once, and what is reported.

A command comes with an id, a name, arguments and an expiry. Each id runs at most once,
whatever happens around it: the record that it started is written durably *before* it
runs (the shell persists ``entries`` whenever ``dirty``, then acts), so a reboot, a
crash or a kill -9 in the middle never leads to a second run, and the record of a
command interrupted by the restart or reboot it caused is turned into its result at the
next start. Expired, duplicate, unknown, forbidden and malformed commands get an error
result and run nothing. A result is reported until the server ACKs it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

MAX_ID = 64
MAX_ENTRIES = 256
KEEP_S = 7 * 86400.0
MAX_OUTPUT = 4000

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


COMMANDS: dict[str, ArgCheck] = {
    "diagnostics": no_args, "logs": logs_args, "screenshot": no_args,
    "display": display_args, "restart-agent": no_args, "reboot": no_args,
}
# What a restart of the agent or of the device in the middle means for each command.
SURVIVES = {"restart-agent": "the agent restarted", "reboot": "the device rebooted"}


@dataclass(frozen=True)
class Run:
    id: str
    name: str
    args: dict


@dataclass(frozen=True)
class Report:
    result: dict


@dataclass
class Entry:
    id: str
    name: str
    state: str                 # running | done
    received_at: float         # wall, for reports and pruning
    boot_id: str = ""
    pid: int = 0
    result: dict | None = None
    acked: bool = False

    def to_dict(self) -> dict:
        return {k: v for k, v in vars(self).items()}

    @staticmethod
    def from_dict(d: dict) -> "Entry | None":
        try:
            e = Entry(str(d["id"]), str(d["name"]), str(d["state"]), float(d["received_at"]),
                      str(d.get("boot_id", "")), int(d.get("pid", 0)),
                      d.get("result") if isinstance(d.get("result"), dict) else None,
                      bool(d.get("acked", False)))
        except (KeyError, TypeError, ValueError):
            return None
        return e if e.state in ("running", "done") and e.id else None


@dataclass
class CommandCore:
    allow: frozenset
    entries: dict = field(default_factory=dict)   # id -> Entry
    dirty: bool = False

    # -- start-up ---------------------------------------------------------------
    def recover(self, boot_id: str, pid: int, now: float) -> list:
        """Commands found running at start were interrupted: never run again; their
        result says what became of them."""
        actions = []
        for e in list(self.entries.values()):
            if e.state != "running":
                continue
            if e.name == "reboot" and e.boot_id and e.boot_id != boot_id:
                ok, detail = True, SURVIVES["reboot"]
            elif e.name == "restart-agent" and e.pid != pid:
                ok, detail = True, SURVIVES["restart-agent"]
            else:
                ok, detail = False, "interrupted by a restart of the agent; not run again"
            actions += self._finish(e, ok, detail if ok else None, detail if not ok else None,
                                    None, now)
        self._prune(now)
        return actions

    # -- inputs -----------------------------------------------------------------
    def receive(self, raw, now: float, boot_id: str = "", pid: int = 0) -> list:
        """A command from the server (any shape). Returns what to do."""
        if not isinstance(raw, dict):
            return []  # no id to answer to: the receipt ACK is all the server gets
        cid = raw.get("id")
        if not isinstance(cid, str) or not 0 < len(cid) <= MAX_ID:
            return []
        name = raw.get("name")
        known = self.entries.get(cid)
        if known is not None:
            # a duplicate (a resend after a lost receipt ACK): never a second run; the
            # result goes again if there is one
            return [Report(known.result)] if known.result is not None else []
        entry = Entry(cid, str(name)[:40] if isinstance(name, str) else "?", "running", now,
                      boot_id, pid)
        self._prune(now)
        self.entries[cid] = entry
        self.dirty = True
        why = self._refusal(raw, now)
        if why is not None:
            return self._finish(entry, False, None, why, None, now)
        return [Run(cid, name, COMMANDS[name](raw.get("args") or {}))]

    def finished(self, cid: str, ok: bool, output: str | None, error: str | None,
                 started: float | None, now: float, extra: dict | None = None) -> list:
        entry = self.entries.get(cid)
        if entry is None or entry.state != "running":
            return []
        return self._finish(entry, ok, output, error, started, now, extra)

    def result_acked(self, cid: str) -> None:
        entry = self.entries.get(cid)
        if entry is not None and entry.state == "done" and not entry.acked:
            entry.acked = True
            self.dirty = True

    def unacked(self) -> list:
        """Results the server has not confirmed: sent again on every new connection."""
        return [Report(e.result) for e in sorted(self.entries.values(), key=lambda e: e.received_at)
                if e.state == "done" and not e.acked and e.result is not None]

    def running(self) -> list[str]:
        return [e.id for e in self.entries.values() if e.state == "running"]

    # -- internals ----------------------------------------------------------------
    def _refusal(self, raw: dict, now: float) -> str | None:
        name = raw.get("name")
        if not isinstance(name, str) or name not in COMMANDS:
            return f"unknown command {str(name)[:40]!r}"
        expires = raw.get("expires_at")
        if expires is not None:
            if isinstance(expires, bool) or not isinstance(expires, (int, float)) \
                    or not math.isfinite(expires):
                return "malformed: expires_at must be a time in seconds"
            if now > expires:
                return f"expired {now - expires:.0f}s before it arrived"
        args = raw.get("args", {})
        if args is not None and not isinstance(args, dict):
            return "malformed: args must be an object"
        try:
            COMMANDS[name](args or {})
        except ValueError as e:
            return f"bad argument: {e}"
        if name not in self.allow:
            return (f"{name!r} is not allowed on this screen ([commands] allow in "
                    f"agent.toml: {', '.join(sorted(self.allow)) or 'nothing'})")
        return None

    def _finish(self, entry: Entry, ok: bool, output, error, started, now: float,
                extra: dict | None = None) -> list:
        result = {"id": entry.id, "name": entry.name, "ok": bool(ok),
                  "received_at": round(entry.received_at, 3),
                  "finished_at": round(now, 3)}
        if started is not None:
            result["started_at"] = round(started, 3)
        if output:
            result["output"] = str(output)[:MAX_OUTPUT]
        if error:
            result["error"] = str(error)[:MAX_OUTPUT]
        if extra:
            result.update(extra)
        entry.state, entry.result, entry.acked = "done", result, False
        self.dirty = True
        return [Report(result)]

    def _prune(self, now: float) -> None:
        done = sorted((e for e in self.entries.values() if e.state == "done"),
                      key=lambda e: e.received_at)
        for e in done:
            too_many = len(self.entries) > MAX_ENTRIES
            if (e.acked and now - e.received_at > KEEP_S) or too_many:
                del self.entries[e.id]
                self.dirty = True
