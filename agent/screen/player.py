"""The player: the systemd unit that shows the content (``[screen] player_unit``, a kiosk
browser, ScreenTinker's player), read and restarted.

Read: ``systemctl show --property=...`` (PROPERTIES), bounded in time and bytes; only
the properties asked for are kept, each by its own narrow rule (a state is a short word
of lower-case letters and dashes, a count is digits), anything else is no reading.
systemctl prints ``Name=value`` lines (systemctl(1), ``show``), in its own
order; a unit it does not know reads ``LoadState=not-found``.

What changed is told once (PlayerWatch): ``player.crashed`` when the unit went failed (it
exited on its own with an error, was killed by a signal, timed out: systemd's
``Result=`` says which) or its ``NRestarts`` grew (systemd restarted it after a crash,
perhaps between two reads); ``player.stopped`` when it went inactive with
``Result=success`` (an operator's ``systemctl stop``, a player that exited cleanly: no
crash); ``player.restarted`` when it is active again after a crash, a stop, or the
agent's restart.

Restart: ``systemctl restart --no-ask-password UNIT`` (polkit lets the agent's user
restart that one unit, only while a grant says so: agent/programs/grants.py), then read
back: the unit active, entered after the restart was asked. The answer is (ok, words),
what the ``restart-player`` command and the recovery ladder both say.
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Callable

from .sources import Runner

PROPERTIES = ("LoadState", "ActiveState", "SubState", "NRestarts", "Result",
              "ExecMainStatus", "ActiveEnterTimestampMonotonic")
SHOW_TIMEOUT_S = 5.0       # systemctl show answers in milliseconds; a bus that hangs
RESTART_TIMEOUT_S = 100.0  # the stop (TimeoutStopSec's default 90 s) and the start
CONFIRM_S = 15.0           # after the restart, to read the unit active
CONFIRM_EVERY_S = 1.0
MAX_OUTPUT = 4096          # what is read of systemctl show (a few hundred bytes)
UP = ("active", "reloading")

_WORD = re.compile(r"[a-z][a-z0-9-]{0,31}")
_COUNT = re.compile(r"[0-9]{1,19}")
_WORDS = ("LoadState", "ActiveState", "SubState", "Result")


@dataclass(frozen=True)
class PlayerState:
    unit: str
    load: str | None = None
    active: str | None = None
    sub: str | None = None
    restarts: int | None = None
    result: str | None = None
    exit_status: int | None = None
    entered_us: int | None = None     # ActiveEnterTimestampMonotonic: 0 never active
    error: str = ""                   # why it could not be read; then nothing else is

    @property
    def known(self) -> bool:
        """Read, and a unit systemd has: a name it does not know (a typo) or a masked
        unit is the configuration's fault, never a player down for the ladder to mend
        with a reboot a day."""
        return not self.error and self.active is not None and self.load in (None, "loaded")

    @property
    def up(self) -> bool:
        return self.active in UP

    def said(self) -> str:
        """"active (running)", "failed (exit-code, status 1)", "unknown: why"."""
        if self.error:
            return f"unknown: {self.error}"
        if self.load not in (None, "loaded"):
            return f"{self.load} ({self.active or '?'})"
        detail = [self.sub or "?"]
        if self.active == "failed" or self.result not in (None, "success"):
            detail = [self.result or "?"] + (
                [f"status {self.exit_status}"] if self.exit_status else [])
        return f"{self.active or '?'} ({', '.join(detail)})"

    def fields(self) -> dict:
        return {"unit": self.unit, "state": self.active, "sub": self.sub,
                "result": self.result, "restarts": self.restarts,
                "exit_status": self.exit_status}


def parse_show(unit: str, raw: bytes) -> PlayerState:
    """``systemctl show``'s output as a PlayerState: the expected properties, each
    checked; a value that breaks its rule is not read (None)."""
    if len(raw) > MAX_OUTPUT:   # cut short, its last value could be a word cut short
        return PlayerState(unit, error=f"systemctl show said more than {MAX_OUTPUT} bytes")
    values: dict = {}
    for line in raw.decode("ascii", "replace").splitlines():
        name, eq, value = line.partition("=")
        if not eq or name not in PROPERTIES or name in values:
            continue
        rule = _WORD if name in _WORDS else _COUNT
        values[name] = value if rule.fullmatch(value) else None
    number = (lambda name: int(values[name]) if values.get(name) is not None else None)
    if not any(values.get(name) for name in ("LoadState", "ActiveState")):
        return PlayerState(unit, error="systemctl show said nothing of the unit's state")
    return PlayerState(unit, load=values.get("LoadState"), active=values.get("ActiveState"),
                       sub=values.get("SubState"), restarts=number("NRestarts"),
                       result=values.get("Result"), exit_status=number("ExecMainStatus"),
                       entered_us=number("ActiveEnterTimestampMonotonic"))


def stopped(before: PlayerState | None, now: PlayerState) -> bool:
    """A clean stop between two reads: up (or on its way down) before, inactive now with
    systemd's ``Result=success``. A stop that had to kill it (``timeout``), a kill, an
    exit with an error are failures, and the unit reads ``failed``, never this."""
    return (before is not None and before.active in UP + ("deactivating",)
            and now.active == "inactive" and now.result in (None, "success"))


class PlayerWatch:
    """What changed between two reads of the unit, as events (type, fields), once."""

    def __init__(self):
        self.last: PlayerState | None = None
        self.down = False           # a crash or a stop told, its restart not yet
        self.by_agent = False       # the agent restarted it: the next "up" is its
        self.crashes = 0            # crashes seen since the agent started

    def restarted_by_agent(self) -> None:
        self.by_agent = True

    def seen(self, state: PlayerState) -> list:
        if not state.known:
            return []    # no reading tells nothing: the last one stands
        before, self.last = self.last, state
        out = []
        grew = (before is not None and before.restarts is not None
                and state.restarts is not None and state.restarts > before.restarts)
        failed = state.active == "failed" and (before is None or before.active != "failed")
        if (grew or failed) and not self.down:
            self.crashes += 1
            self.down = True
            out.append(("player.crashed", state.fields()))
        elif stopped(before, state) and not self.down:
            self.down = True
            out.append(("player.stopped", state.fields()))
        if state.up and (self.down or self.by_agent):
            by = "the agent" if self.by_agent else "systemd"
            self.down = self.by_agent = False
            out.append(("player.restarted", {**state.fields(), "by": by}))
        return out


class Player:
    """One unit, read and restarted, from any thread (one at a time)."""

    def __init__(self, unit: str, *, show: Callable | None = None,
                 act: Callable | None = None, clock: Callable[[], float] = time.monotonic,
                 confirm_s: float = CONFIRM_S):
        """``show`` and ``act`` run a program, bounded (sources.Runner's way: (stdout or
        None, why it failed or "")); by default systemctl's reads within SHOW_TIMEOUT_S,
        its restart within RESTART_TIMEOUT_S."""
        self.unit = unit
        self.show = show or Runner(SHOW_TIMEOUT_S)
        self.act = act or Runner(RESTART_TIMEOUT_S)
        self.clock = clock
        self.confirm_s = confirm_s
        self.watch = PlayerWatch()
        self.bound_s = RESTART_TIMEOUT_S + SHOW_TIMEOUT_S + confirm_s \
            + (confirm_s / CONFIRM_EVERY_S + 1) * SHOW_TIMEOUT_S
        self._lock = threading.RLock()
        self._stop = threading.Event()

    def state(self) -> PlayerState:
        out, why = self.show(["systemctl", "show", "--property=" + ",".join(PROPERTIES),
                              "--", self.unit])
        if out is None or why:
            return PlayerState(self.unit, error=why or "systemctl show printed nothing")
        return parse_show(self.unit, out)

    def poll(self) -> tuple[PlayerState, list]:
        """The state now, and the events its change makes."""
        with self._lock:
            state = self.state()
            return state, self.watch.seen(state)

    def restart(self) -> tuple[bool, str]:
        """Restarts the unit and reads it back: (active again, in words)."""
        with self._lock:
            before = self.state()
            out, why = self.act(["systemctl", "restart", "--no-ask-password", "--",
                                 self.unit])
            if why:
                return False, f"{self.unit} not restarted: {why}"
            deadline = self.clock() + self.confirm_s
            while True:
                now = self.state()
                if now.up and (before.entered_us is None or now.entered_us is None
                               or now.entered_us != before.entered_us):
                    self.watch.restarted_by_agent()
                    return True, f"{self.unit} restarted: {now.said()}"
                if self.clock() >= deadline or self._stop.wait(CONFIRM_EVERY_S):
                    return False, (f"{self.unit} restarted but not active within "
                                   f"{self.confirm_s:g} s: {now.said()}")

    def stop(self) -> None:
        """From any thread, on the agent's way out: a program running now is killed."""
        self._stop.set()
        for runner in (self.show, self.act):
            if hasattr(runner, "stop"):
                runner.stop()
