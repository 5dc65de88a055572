"""The recovery ladder: what the agent does, step by step, for a screen that shows
nothing useful (sans I/O).

What it watches: the picture's verdict (``black``, ``frozen``, ``ok``, or ``dark``: the
display is meant off, by the working hours or a command) and, where ``[screen]
player_unit`` is set, whether the player's unit is active. The screen is *bad* when the
picture is black or frozen or the player is down; *ok* when the picture is ok (or never
judged) and the player is up (or there is none).

- **Not one sample.** A bad screen is acted on only once it has been bad for
  ``confirm_s`` and said so at least twice (two pictures, or two reads of the unit): a
  player restarting itself, a picture caught between two slides, are not acted on.
  Each episode that begins within the hour of the one before waits twice as long
  (at most 16 times): a screen that keeps falling over is not mended in a storm.
- **The rungs, in order**, each at most once an episode: restart the player (where a
  unit is set, and at most ``player_restarts_per_hour``), wake the display (at most
  WAKES_PER_HOUR), reboot (only where ``[commands] allow`` lists reboot; the budget of
  ``reboots_per_day`` counted across reboots is the shell's, reboots.py, which answers
  a reboot it refuses as a rung that did not run). A rung whose budget is spent is
  passed over; one that fails is reported and the next is tried.
- **After each rung** the screen has ``wait_s`` to come back. A verdict from before the
  rung does not count: a black picture taken before the player restarted is no proof
  that the restart failed, so the wait is drawn out (up to twice more) until a picture
  or a read of the unit made after it tells. Still bad: the next rung. Ok: recovered.
- **Exhausted**: no rung left (or a reboot that did not happen). Said once, then
  nothing is tried until the screen is seen ok again, which ends the episode.
- **Dark never acts**: the picture of a display meant off is black by design, and a
  wake would light it against the hours. A dark verdict, or the word that the display
  is meant off (``DisplayMeant``, from the working hours or the display command, for a
  screen whose picture is not checked), holds the episode's wait and everything else
  until the display is meant on again.

Inputs: ``PictureSeen``, ``PlayerSeen``, ``DisplayMeant``, ``RungDone``, ``Tick`` (each
with the monotonic ``now``). Effects: ``Rung`` (run it, then answer with RungDone) and
``Report`` (an event: ``screen.recovery``, ``screen.recovered``,
``screen.recovery_exhausted``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..base.backoff import ceiling

BLACK, FROZEN, OK, DARK = "black", "frozen", "ok", "dark"
VERDICTS = (BLACK, FROZEN, OK, DARK)
BAD = (BLACK, FROZEN)
RESTART_PLAYER, WAKE_DISPLAY, REBOOT = "restart-player", "wake-display", "reboot"
RUNGS = (RESTART_PLAYER, WAKE_DISPLAY, REBOOT)

HOUR = 3600.0
CONFIRM_S = 30.0          # a bad screen, this long and said twice, is acted on
MAX_BACKOFF = 16          # a recurring episode's confirm_s, at most this many times
WAKES_PER_HOUR = 4        # waking a display that is on costs nothing, but not a storm
STALE_WAITS = 2           # the waits added for want of a verdict made after the rung
MAX_SAID = 300            # what an event keeps of a rung's words


@dataclass(frozen=True)
class PictureSeen:
    verdict: str
    now: float


@dataclass(frozen=True)
class PlayerSeen:
    active: bool
    now: float
    said: str = ""           # the unit's state in words ("failed (exit-code)")


@dataclass(frozen=True)
class DisplayMeant:
    dark: bool               # the display is meant off (the hours, a display command)
    now: float


@dataclass(frozen=True)
class RungDone:
    rung: str
    ok: bool
    said: str
    now: float


@dataclass(frozen=True)
class Tick:
    now: float


@dataclass(frozen=True)
class Rung:
    rung: str
    why: str


@dataclass(frozen=True)
class Report:
    event_type: str
    fields: dict


@dataclass(frozen=True)
class Policy:
    enabled: bool                  # [screen] recovery
    player: bool                   # a player unit is set
    restarts_per_hour: int         # [screen] player_restarts_per_hour
    reboot: bool                   # reboot in [commands] allow and reboots_per_day > 0
    wait_s: float                  # [screen] recovery_wait_s
    confirm_s: float = CONFIRM_S
    wakes_per_hour: int = WAKES_PER_HOUR
    wake: bool = True              # a display_on_command turns the display on


@dataclass
class _Seen:
    value: object
    at: float


@dataclass
class _Budget:
    """Times a rung ran within the last ``window_s``; at most ``limit`` of them."""
    limit: int
    window_s: float
    times: list = field(default_factory=list)

    def left(self, now: float) -> int:
        self.times = [t for t in self.times if now - t < self.window_s]
        return max(0, self.limit - len(self.times))

    def spend(self, now: float) -> None:
        self.times.append(now)


Budget = _Budget   # the rule the network's healer counts its rungs by (device/network.py)


WATCHING, CONFIRMING, ACTING, WAITING, EXHAUSTED, HELD = (
    "watching", "confirming", "acting", "waiting", "exhausted", "held: the display is meant dark")


class Ladder:
    def __init__(self, policy: Policy):
        self.policy = policy
        self.picture: _Seen | None = None
        self.player: _Seen | None = None
        self.meant_dark = False
        self.state = WATCHING
        self.bad_since: float | None = None
        self.bad_samples = 0
        self.why = ""                  # what began the episode: "picture black", ...
        self.considered: list[str] = []    # this episode's rungs, run or passed over
        self.tried: list[str] = []         # those of them that ran
        self.taken = {rung: 0 for rung in RUNGS}   # every rung run since the start
        self.passed: list[str] = []        # why the others were passed over
        self.rung_at = 0.0             # when the last rung finished
        self.wait_until = 0.0
        self.stale_waits = 0
        self.episodes: list[float] = []    # when each episode of the last hour began
        self.budgets = {RESTART_PLAYER: _Budget(policy.restarts_per_hour, HOUR),
                        WAKE_DISPLAY: _Budget(policy.wakes_per_hour, HOUR)}
        self.last_outcome = ""

    # -- what the shell's status shows -----------------------------------------------
    def snapshot(self, now: float) -> dict:
        return {"enabled": self.policy.enabled, "state": self.state,
                "why": self.why or None, "tried": list(self.tried), "taken": dict(self.taken),
                "last": self.last_outcome or None,
                "player_restarts_left": (self.budgets[RESTART_PLAYER].left(now)
                                         if self.policy.player else None),
                "wakes_left": self.budgets[WAKE_DISPLAY].left(now)}

    # -- inputs ----------------------------------------------------------------------
    def handle(self, event) -> list:
        if isinstance(event, PictureSeen):
            if event.verdict not in VERDICTS:
                raise ValueError(f"verdict: {event.verdict!r}")
            self.picture = _Seen(event.verdict, event.now)
            return self._look(event.now, sample=event.verdict in BAD)
        if isinstance(event, PlayerSeen):
            if not self.policy.player:
                return []
            self.player = _Seen(bool(event.active), event.now)
            return self._look(event.now, sample=not event.active)
        if isinstance(event, DisplayMeant):
            self.meant_dark = bool(event.dark)
            return self._look(event.now, sample=False)
        if isinstance(event, Tick):
            return self._look(event.now, sample=False)
        if isinstance(event, RungDone):
            return self._done(event)
        raise TypeError(f"not an input of the ladder: {event!r}")

    # -- internals -------------------------------------------------------------------
    def _dark(self) -> bool:
        return self.meant_dark or (self.picture is not None and self.picture.value == DARK)

    def _bad(self, since: float | None = None) -> str:
        """Why the screen is bad, from what was seen at or after ``since``; or ""."""
        why = []
        if (self.picture is not None and self.picture.value in BAD
                and (since is None or self.picture.at >= since)):
            why.append(f"picture {self.picture.value}")
        if (self.player is not None and not self.player.value
                and (since is None or self.player.at >= since)):
            why.append("player down")
        return " and ".join(why)

    def _ok(self, since: float | None = None) -> bool:
        """Seen ok: nothing bad nor dark, and something seen at or after ``since``."""
        if self._bad() or self._dark():
            return False
        told = [s for s in (self.picture, self.player)
                if s is not None and s.value != DARK]
        return any(since is None or s.at >= since for s in told)

    def _look(self, now: float, sample: bool) -> list:
        if not self.policy.enabled:
            return []
        if self._dark():
            if self.state == CONFIRMING:
                self.state, self.bad_since, self.bad_samples = WATCHING, None, 0
            elif self.state == WAITING:
                self.state = HELD
            return []   # acting: the rung's answer comes, then this holds it
        if self.state == HELD:
            # the display is meant on again: the episode goes on, judged afresh
            self.state, self.rung_at, self.stale_waits = WAITING, now, 0
            self.wait_until = now + self.policy.wait_s
        if self.state in (WATCHING, CONFIRMING):
            return self._confirm(now, sample)
        if self.state == WAITING:
            return self._wait(now)
        if self.state == EXHAUSTED and self._ok():
            return self._recovered()
        return []

    def _confirm(self, now: float, sample: bool) -> list:
        why = self._bad()
        if not why:
            self.state, self.bad_since, self.bad_samples = WATCHING, None, 0
            return []
        if self.bad_since is None:
            self.state, self.bad_since, self.bad_samples = CONFIRMING, now, 0
        self.bad_samples += 1 if sample else 0
        if self.bad_samples < 2 or now - self.bad_since < self._confirm_s(now):
            return []
        self.why = why
        self.episodes.append(now)
        return self._next(now)

    def _confirm_s(self, now: float) -> float:
        self.episodes = [t for t in self.episodes if now - t < HOUR]
        return ceiling(self.policy.confirm_s, self.policy.confirm_s * MAX_BACKOFF,
                       len(self.episodes))

    def _wait(self, now: float) -> list:
        if self._ok(since=self.rung_at):
            return self._recovered()
        if now < self.wait_until:
            return []
        fresh = self._bad(since=self.rung_at)
        if not fresh and self.stale_waits < STALE_WAITS:
            # nothing seen since the rung says it failed: no proof yet, a while more
            self.stale_waits += 1
            self.wait_until = now + self.policy.wait_s
            return []
        if not self._bad():
            return self._recovered()
        self.why = fresh or self._bad()
        return self._next(now)

    def _next(self, now: float) -> list:
        """The episode's next rung that its budget allows, or exhaustion."""
        for rung in RUNGS:
            if rung in self.considered:
                continue
            self.considered.append(rung)
            run, refusal = self._allowed(rung, now)
            if not run:
                if refusal:
                    self.passed.append(refusal)
                continue
            self.tried.append(rung)
            self.taken[rung] += 1
            self.state = ACTING
            if rung in self.budgets:
                self.budgets[rung].spend(now)
            return [Rung(rung, self.why)]
        return self._exhaust()

    def _allowed(self, rung: str, now: float) -> tuple[bool, str]:
        """(run it, or why not: "" where there is nothing to say)."""
        p = self.policy
        if rung == RESTART_PLAYER:
            if not p.player:
                return False, ""
            if not self.budgets[rung].left(now):
                return False, (f"{rung}: done {p.restarts_per_hour} times in the hour"
                               if p.restarts_per_hour else f"{rung}: none allowed "
                               "([screen] player_restarts_per_hour = 0)")
        if rung == WAKE_DISPLAY and not p.wake:
            return False, f"{rung}: no [commands] display_on_command to wake it with"
        if rung == WAKE_DISPLAY and not self.budgets[rung].left(now):
            return False, f"{rung}: done {p.wakes_per_hour} times in the hour"
        if rung == REBOOT and not p.reboot:
            return False, (f"{rung}: not allowed ([commands] allow does not list it, or "
                           "[screen] reboots_per_day = 0)")
        return True, ""

    def _done(self, event: RungDone) -> list:
        if self.state != ACTING or not self.tried or event.rung != self.tried[-1]:
            return []   # an answer to nothing asked: not the ladder's
        said = " ".join(str(event.said).split())[:MAX_SAID]
        self.last_outcome = f"{event.rung} {'done' if event.ok else 'failed'}: {said}"
        report = Report("screen.recovery", {"rung": event.rung, "why": self.why,
                                            "ok": event.ok, "said": said})
        if not event.ok:
            if event.rung == REBOOT:
                self.passed.append(f"{REBOOT}: {said}")
                return [report, *self._exhaust()]
            if self._dark():   # meant dark meanwhile: the next rung waits for it to end
                self.state = HELD
                return [report]
            return [report, *self._next(event.now)]
        self.state, self.rung_at, self.stale_waits = WAITING, event.now, 0
        self.wait_until = event.now + self.policy.wait_s
        return [report]

    def _exhaust(self) -> list:
        self.state = EXHAUSTED
        return [Report("screen.recovery_exhausted", {
            "why": self.why, "tried": list(self.tried), "passed_over": list(self.passed)})]

    def _recovered(self) -> list:
        episode = self.state in (WAITING, EXHAUSTED)
        tried, why = list(self.tried), self.why
        self.state, self.why = WATCHING, ""
        self.considered, self.tried, self.passed = [], [], []
        self.bad_since, self.bad_samples, self.stale_waits = None, 0, 0
        if not episode:
            return []
        return [Report("screen.recovered", {"after": tried, "why": why})]
