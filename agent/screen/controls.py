"""The screen's buttons: brightness, volume and the player's restart, each done and
answered with the state read back, never a bare "ok"; and what this screen has the
means for, so that a server is offered exactly the buttons that work here.

The commands part runs them (the ``ScreenControls`` port in commands/actions.py, bound
by the daemon) on its commands thread. Power-off is not here: it is logind's, the same
shape as a reboot, and actions.py does both; ``means()`` only says whether logind is
there to ask.

A level is confirmed when the level read back, through the same means it was set
through, is within half a step of that means' scale of the level asked, and the
rounding of a whole percent (a backlight of 7 steps cannot show 40%: 3/7 is as near as
it comes). Anything else is a failed
command (``ok`` false) that says what was read: a level that did not take is not
done, unlike a display turned off whose sources cannot all tell (screen/core.py).

What the screen has is probed on first use and again every ``probe_every_s`` (an hour:
a sound server started late, a monitor plugged in), or sooner after a means failed;
a probe reads, it never sets.
"""
from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

from ..config.model import Screen as ScreenSection
from .brightness import Backlight, Ddc
from .sources import READ_TIMEOUT_S, Runner
from .volume import Amixer, Pactl, Wpctl, environment

log = logging.getLogger("edge_agent.screen")

PROBE_EVERY_S = 3600.0
MAX_WORDS = 300          # what a result keeps of a means' or the player's words
LEVELS = ("brightness", "volume")
PLAYER_BOUND_S = 60.0    # a player without a bound of its own: a kiosk browser's restart


@dataclass(frozen=True)
class Answer:
    """What a control did, read back: the commands part's Outcome, field for field
    (commands/actions.py turns it into one; the commands part imports the screen's
    cores, so the screen does not import it back)."""
    ok: bool
    output: str | None = None
    error: str | None = None
    extra: dict = field(default_factory=dict)


class Means(Protocol):
    """A way to set a level and read it back (brightness.py, volume.py)."""
    via: str
    resolution: float

    def probe(self) -> str: ...

    def set(self, level: float) -> str: ...

    def read(self) -> tuple[float | None, str]: ...


class Player(Protocol):
    """What restart-player asks of the player (screen/player.py): restarted, and how
    it stands after, in words."""

    def restart(self) -> tuple[bool, str]: ...


def booted_with_systemd() -> bool:
    """logind is there to ask for a power-off: sd_booted()'s test, and systemctl."""
    return os.path.isdir("/run/systemd/system") and shutil.which("systemctl") is not None


def percent(level: float) -> str:
    return f"{level * 100:.0f}%"


def answer(name: str, level: float, means: Means, set_why: str,
           read: float | None, said: str) -> Answer:
    """The result of one set and its read back (no I/O)."""
    extra = {"level": level, "via": means.via}
    asked = f"{name} {percent(level)}"
    if set_why:
        return Answer(False, error=f"{asked}: not set through {means.via}: "
                                    f"{set_why}"[:MAX_WORDS],
                       extra={**extra, "confirmed": False})
    if read is None:
        return Answer(False, error=f"{asked}: set through {means.via}, but not read "
                                    f"back: {said}"[:MAX_WORDS],
                       extra={**extra, "confirmed": False})
    extra.update(read=round(read, 4), said=said[:MAX_WORDS])
    # half a step of the means' scale, and the rounding of a level shown in whole percent
    tolerance = max(0.01, means.resolution / 2) + 0.005 + 1e-9
    if abs(read - level) > tolerance:
        return Answer(False, error=f"{asked}: read back {percent(read)} ({said}): the "
                                    f"level did not take"[:MAX_WORDS],
                       extra={**extra, "confirmed": False})
    return Answer(True, f"{asked}: read back {percent(read)} ({said})"[:MAX_WORDS],
                   extra={**extra, "confirmed": True})


class Controls:
    def __init__(self, brightness: list, volume: list, player: Player | None = None, *,
                 runner: Runner | None = None, clock: Callable[[], float] = time.monotonic,
                 probe_every_s: float = PROBE_EVERY_S,
                 logind: Callable[[], bool] = booted_with_systemd):
        """``brightness``, ``volume``: the means to try, in order; ``player``: None
        where no player unit is configured; ``runner``: the programs' runner, stopped
        with the agent."""
        self.candidates = {"brightness": list(brightness), "volume": list(volume)}
        self.player = player
        self.runner = runner
        self.clock = clock
        self.probe_every_s = probe_every_s
        self.logind = logind
        self.on_change: Callable[[], None] | None = None   # after a probe that found new means
        self._lock = threading.Lock()          # the cache below
        self._probing = threading.Lock()       # one probe at a time
        self._chosen: dict[str, Means | None] = {}
        self._why_not: dict[str, str] = {}
        self._probed_at: float | None = None
        timeout_s = runner.timeout_s if runner is not None else READ_TIMEOUT_S
        # a probe of every candidate of both levels, then a set and a read (DDC/CI: a
        # read before its set, for the monitor's scale)
        runs = sum(len(c) for c in self.candidates.values()) + 3
        self.bound_s = max(runs * timeout_s, getattr(player, "bound_s", PLAYER_BOUND_S)
                           if player is not None else 0.0)

    # -- what this screen has ----------------------------------------------------
    def means(self) -> frozenset:
        """As ``known()``, probed first when stale: it runs each candidate program, each
        bounded, on the caller's thread (the daemon probes on a worker instead)."""
        if self.stale():
            self.probe()
        return self.known()

    def known(self) -> frozenset:
        """The means as last probed, never probing on the caller's thread (the link's,
        at a registration): before the first probe, only what needs none."""
        with self._lock:
            have = {name for name in LEVELS if self._chosen.get(name) is not None}
        if self.player is not None:
            have.add("restart-player")
        if self.logind():
            have.add("poweroff")
        return frozenset(have)

    def stale(self) -> bool:
        """Probed longer ago than ``probe_every_s`` (a sound server started late, a
        monitor plugged in): time to look again, off the caller's thread."""
        with self._lock:
            return self._probed_at is None or self.clock() - self._probed_at >= self.probe_every_s

    def why_not(self) -> dict[str, str]:
        """For each command this screen has no means for, why (for status)."""
        with self._lock:
            out = {name: self._why_not[name] for name in LEVELS if name in self._why_not}
        if self.player is None:
            out["restart-player"] = "no player unit ([screen] player_unit)"
        if not self.logind():
            out["poweroff"] = "not booted with systemd: no logind to ask"
        return out

    def via(self) -> dict[str, str]:
        """For each level, the means it goes through (for status)."""
        with self._lock:
            return {name: m.via for name, m in self._chosen.items() if m is not None}

    def probe(self) -> None:
        """Finds, for each level, the first candidate that reads (never sets)."""
        with self._probing:
            chosen, whys = {}, {}
            for name, candidates in self.candidates.items():
                chosen[name], tried = None, []
                for means in candidates:
                    why = means.probe()
                    if not why:
                        chosen[name] = means
                        break
                    tried.append(f"{means.via}: {why}")
                if chosen[name] is None:
                    whys[name] = "; ".join(tried)[:MAX_WORDS] if tried \
                        else f"[screen] {name}_via is none"
            with self._lock:
                changed = chosen != self._chosen
                if changed:
                    log.info("screen controls: %s", ", ".join(
                        f"{name} through {m.via}" if m else f"no {name} ({whys[name]})"
                        for name, m in chosen.items()))
                self._chosen, self._why_not = chosen, whys
                self._probed_at = self.clock()
            if changed and self.on_change is not None:
                self.on_change()   # the server is told again what this screen can do

    def _means_for(self, name: str) -> Means | None:
        with self._lock:
            stale = self._probed_at is None or self._chosen.get(name) is None \
                or self.clock() - self._probed_at >= self.probe_every_s
        if stale:   # a means found since (a sound server started after the agent)
            self.probe()
        with self._lock:
            return self._chosen.get(name)

    def _failed(self) -> None:
        """A means that failed is looked for again at the next use."""
        with self._lock:
            self._probed_at = None

    # -- the commands ------------------------------------------------------------
    def act(self, name: str, args: dict) -> Answer:
        if name == "restart-player":
            return self._restart_player()
        if name not in LEVELS:
            raise ValueError(f"not a screen control: {name}")
        means = self._means_for(name)
        if means is None:
            with self._lock:
                why = self._why_not.get(name, "")
            return Answer(False, error=f"{name}: this screen has no means: {why}"[:MAX_WORDS])
        level = args["level"]
        set_why = means.set(level)
        read, said = (None, "") if set_why else means.read()
        outcome = answer(name, level, means, set_why, read, said)
        if set_why or read is None:
            self._failed()
        (log.info if outcome.ok else log.warning)(
            "%s", outcome.output if outcome.ok else outcome.error)
        return outcome

    def _restart_player(self) -> Answer:
        if self.player is None:
            return Answer(False, error="restart-player: this screen has no player unit "
                                        "([screen] player_unit in agent.toml)")
        ok, words = self.player.restart()
        words = str(words)[:MAX_WORDS]
        extra = {"via": "player", "confirmed": bool(ok)}
        if ok:
            return Answer(True, f"player restarted: {words}", extra=extra)
        return Answer(False, error=f"player not restarted: {words}", extra=extra)

    def stop(self) -> None:
        """From any thread, on the agent's way out: a program running now is killed,
        and none is started again."""
        if self.runner is not None:
            self.runner.stop()


def from_config(section: ScreenSection, *, sysfs_root: str, environ: dict,
                player: Player | None = None, dev_root: str = "/dev") -> Controls:
    """``player``: screen/player.py's, None where ``[screen] player_unit`` is unset."""
    runner = Runner()
    env = environment(environ)
    path = env.get("PATH")
    brightness = {"backlight": [Backlight(sysfs_root)],
                  "ddcutil": [Ddc(runner, path, dev_root)], "none": []}
    brightness["auto"] = brightness["backlight"] + brightness["ddcutil"]
    volume = {"wpctl": [Wpctl(runner, env)], "pactl": [Pactl(runner, env)],
              "amixer": [Amixer(runner, env, section.mixer_control)], "none": []}
    volume["auto"] = volume["wpctl"] + volume["pactl"] + volume["amixer"]
    return Controls(brightness[section.brightness_via], volume[section.volume_via], player,
                    runner=runner)
