"""The thread that watches the player and mends the screen: the shell around ladder.py.

Every POLL_S it reads the player's unit (player.py) and tells what changed
(``player.crashed``, ``player.restarted``), hands the ladder what it saw, and the
pictures' verdicts that the picture check gave ``on_picture`` since, and runs the rungs
the ladder asks for through the callables it was given: the player's restart, the
display's wake (a turn on by the display's owner, power.py, read back), the reboot
(logind asked, as the reboot command asks it), the last only once reboots.py has
counted it on the card. The ladder's reports are published as
events. With ``[screen] recovery`` off the player is still read and reported, and
nothing is done.

A rung runs on this thread and is bounded by its own callable (the restart by
player.py's bound, the wake by the display's turn, the reboot by the command's
timeout); the thread is a Loop on the watchdog gate, allowed a poll and a rung between
two turns. Nothing is written to the card but the reboot count, just before a reboot.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable

from ..config.model import Screen as ScreenSection
from ..events.model import Event
from ..runtime.loop import Loop
from ..runtime.watchdog_gate import WatchdogGate
from .ladder import (REBOOT, RESTART_PLAYER, VERDICTS, WAKE_DISPLAY, DisplayMeant, Ladder,
                     PictureSeen, PlayerSeen, Policy, Report, Rung, RungDone, Tick)
from .player import SHOW_TIMEOUT_S, Player, PlayerState
from .reboots import RebootBook

log = logging.getLogger("edge_agent.screen")

POLL_S = 10.0            # the player's unit read, the ladder's clock looked at
MAX_PICTURES = 8         # verdicts held between two turns (one a minute is the default)
RUNG_BOUND_S = 180.0     # a wake or a reboot's call, at most, unless the builder says more

Outcome = Callable[[], "tuple[bool, str]"]


class Mender:
    def __init__(self, ladder: Ladder, publish: Callable[[Event], None], *,
                 player: Player | None = None, book: RebootBook | None = None,
                 wake: Outcome | None = None, reboot: Outcome | None = None,
                 meant_dark: Callable[[], bool] | None = None,
                 gate: WatchdogGate | None = None, poll_s: float = POLL_S,
                 rung_bound_s: float = RUNG_BOUND_S,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        """``wake()`` and ``reboot()`` act and answer (done, in words); a reboot that
        was done ends the process soon after. ``book`` counts the reboots (None: none
        is ever done). ``meant_dark()``: the display is meant off now (the working
        hours' ``expected_off``, a display command's off): nothing is done meanwhile,
        even on a screen whose picture is not checked."""
        self.ladder, self.publish = ladder, publish
        self.meant_dark = meant_dark
        self._dark_told: bool | None = None
        self.player, self.book = player, book
        self._unloaded_told: str | None = None   # a load state said once
        self._why = ""                           # the rung being run: why
        self.wake_fn, self.reboot_fn = wake, reboot
        self.poll_s = poll_s
        self.clock, self.wall = clock, wall
        self.player_state: PlayerState | None = None
        self.player_read_at: float | None = None
        self.picture: tuple[str, float] | None = None
        self._pictures: collections.deque = collections.deque(maxlen=MAX_PICTURES)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._poke = threading.Event()
        # between two turns: a read of the unit held up by a restart the command runs,
        # then one rung (a turn follows each)
        restart_s = player.bound_s if player else 0.0
        silence = poll_s + restart_s + SHOW_TIMEOUT_S + max(restart_s, rung_bound_s) + 30.0
        self.loop = Loop("mender", self._run, gate=gate, max_silence_s=silence,
                         pause=self._stop.wait, stopping=self._stop.is_set)

    # -- from other threads ----------------------------------------------------------
    def on_picture(self, verdict: str) -> None:
        """The picture check's verdict, each time it judges: black, frozen, ok, or dark
        (the display is meant off). Anything else (a capture that failed) tells nothing
        and is not kept."""
        if verdict not in VERDICTS:
            return
        with self._lock:
            self._pictures.append((verdict, self.clock()))
        self._poke.set()

    def restart_player(self) -> tuple[bool, str]:
        """The ladder's restart of the player (the command's goes through controls.py)."""
        if self.player is None:
            return False, "no player unit is set ([screen] player_unit)"
        return self.player.restart()

    def snapshot(self) -> dict:
        now = self.clock()
        with self._lock:
            recovery = self.ladder.snapshot(now)
            state, read_at, picture = self.player_state, self.player_read_at, self.picture
        recovery["reboots_left"] = self.book.left() if self.book is not None else 0
        player = None
        if self.player is not None:
            player = {"unit": self.player.unit,
                      "state": state.said() if state else None,
                      "active": state.up if state and state.known else None,
                      "restarts": state.restarts if state else None,
                      "crashes_seen": self.player.watch.crashes,
                      "read_s_ago": round(now - read_at, 1) if read_at is not None else None}
        return {"player": player,
                "picture": ({"verdict": picture[0], "s_ago": round(now - picture[1], 1)}
                            if picture else None),
                "recovery": recovery}

    def start(self, cold_start: bool = False) -> None:
        """``cold_start``: this is the boot's first start of the agent: a reboot the
        ladder asked for in the boot before is told now (its event, in memory, went down
        with that boot)."""
        last = self.book.last_before_this_boot() if cold_start and self.book else None
        if last is not None:
            self.publish(Event("screen.rebooted", self.wall(), {
                "why": last.why, "at": round(last.wall, 3), "clock_synced": last.synced,
                "reboots_left": self.book.left()}))
        self.loop.start()

    def stop(self) -> None:
        self._stop.set()
        self._poke.set()
        if self.player is not None:
            self.player.stop()

    def join(self, timeout: float | None = None) -> None:
        self.loop.join(timeout)

    # -- the mender's thread ---------------------------------------------------------
    def _run(self) -> None:
        def turn() -> float:
            self.step()
            return self.poll_s
        # the poke cleared before each step: a verdict given during it is not lost
        self.loop.every(turn, stop=self._stop, wake=self._poke)

    def step(self) -> None:
        """One turn: the pictures given since, the player read, the rungs asked for."""
        with self._lock:
            pictures = list(self._pictures)
            self._pictures.clear()
        effects: list = []
        if self.meant_dark is not None:
            dark = bool(self.meant_dark())
            if dark != self._dark_told:
                self._dark_told = dark
                effects += self._handle(DisplayMeant(dark, self.clock()))
        for verdict, at in pictures:
            with self._lock:
                self.picture = (verdict, at)
            effects += self._handle(PictureSeen(verdict, at))
        if self.player is not None:
            state, changes = self.player.poll()
            for kind, fields in changes:
                (log.warning if kind == "player.crashed" else log.info)(
                    "screen: %s: %s", kind, state.said())
                self.publish(Event(kind, self.wall(), fields))
            with self._lock:
                self.player_state, self.player_read_at = state, self.clock()
            if state.known:
                effects += self._handle(PlayerSeen(state.up, self.clock(), state.said()))
            elif state.load not in (None, "loaded") and state.load != self._unloaded_told:
                log.error("screen: [screen] player_unit %s is %s: not watched nor mended "
                          "until the configuration names a unit systemd has", state.unit,
                          state.load)
            self._unloaded_told = state.load if not state.known else None
        effects += self._handle(Tick(self.clock()))
        self._apply(effects)

    def _handle(self, event) -> list:
        with self._lock:
            return self.ladder.handle(event)

    def _apply(self, effects: list) -> None:
        while effects and not self._stop.is_set():
            effect, effects = effects[0], effects[1:]
            if isinstance(effect, Report):
                (log.warning if effect.event_type != "screen.recovered" else log.info)(
                    "screen: %s: %s", effect.event_type, effect.fields)
                self.publish(Event(effect.event_type, self.wall(), dict(effect.fields)))
            elif isinstance(effect, Rung):
                log.warning("screen: recovery: %s (%s)", effect.rung, effect.why)
                self._why = effect.why
                ok, said = self._run_rung(effect.rung)
                self.loop.turn()
                effects = effects + self._handle(RungDone(effect.rung, ok, said,
                                                          self.clock()))

    def _run_rung(self, rung: str) -> tuple[bool, str]:
        try:
            if rung == RESTART_PLAYER:
                return self.restart_player()
            if rung == WAKE_DISPLAY:
                return self.wake_fn() if self.wake_fn else (False, "nothing wakes the display")
            if rung == REBOOT:
                if self.book is None or self.reboot_fn is None:
                    return False, "not rebooted: no reboot is allowed here"
                counted, said = self.book.take(self._why)
                if not counted:
                    return False, said
                ok, done = self.reboot_fn()
                return ok, f"{said}: {done}"
        except Exception as e:   # a rung's bug is its failure, said; the ladder goes on
            log.error("screen: recovery: %s failed", rung, exc_info=True)
            return False, f"{rung} failed: {type(e).__name__}"
        return False, f"unknown rung {rung}"


def from_config(section: ScreenSection, commands_allow, state_dir: str, *,
                publish: Callable[[Event], None], wake: Outcome | None = None,
                reboot: Outcome | None = None, meant_dark: Callable[[], bool] | None = None,
                gate: WatchdogGate | None = None,
                rung_bound_s: float = RUNG_BOUND_S, clock_trusted: bool = False) -> Mender:
    """The mender as ``[screen]`` and ``[commands] allow`` set it: the player read
    where a unit is set, the ladder on where ``recovery`` is, and reboots only where
    the allow list has reboot (and its budget read from ``state_dir``)."""
    may_reboot = (section.recovery and "reboot" in commands_allow
                  and section.reboots_per_day > 0 and reboot is not None)
    policy = Policy(enabled=section.recovery, player=bool(section.player_unit),
                    restarts_per_hour=section.player_restarts_per_hour, reboot=may_reboot,
                    wait_s=section.recovery_wait_s, wake=wake is not None)
    player = Player(section.player_unit) if section.player_unit else None
    book = (RebootBook(state_dir, section.reboots_per_day,
                       **({"synced": lambda: True} if clock_trusted else {}))
            if may_reboot else None)
    return Mender(Ladder(policy), publish, player=player, book=book, wake=wake,
                  reboot=reboot, meant_dark=meant_dark, gate=gate, rung_bound_s=rung_bound_s)
