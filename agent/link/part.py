"""The link, assembled: the server's profile, the runner (the loop and the connection
of the moment) and its port, which is all the other parts see of it. The daemon builds
it first among the parts, after the identity it connects with; a part built later
gives the profile what it reports (telemetry, the screen's means) and hears the
server's clock by subscribing here, never through a callable standing for itself."""
from __future__ import annotations

from typing import Callable

from ..base.hardware import hardware_facts
from ..base.server_clock import ServerClock
from ..config.model import Config
from ..runtime.watchdog_gate import WatchdogGate
from .idle_memory import IdleMemory
from .liveness import heal_window_s
from .profiles import PROFILES, ProfileContext, uncarried
from .runner import Hooks, Keeps, LinkRunner, Settings
from .schedule_store import ScheduleStore

__all__ = ["PROFILES", "Link", "ScheduleStore", "heal_window_s", "schedule", "uncarried"]


def schedule(config: Config) -> ScheduleStore:
    """The reconnect schedule and the outage's restarts, both kept across restarts (the
    watchdog's patience is built on them before any part)."""
    return ScheduleStore(config.schedule_path)


class Link:
    """``identity``: the device's (identity/part.py's DeviceIdentity), which the link
    connects with and follows (pause, resume, re-register); ``on_status(link)`` and
    ``on_turn()``: the runner's hooks, on its thread."""

    def __init__(self, config: Config, profile_name: str, identity, *, store: ScheduleStore,
                 gate: WatchdogGate | None, cold_start: bool,
                 on_status: Callable[[dict], None], on_turn: Callable[[], None]):
        ids, sysfs = identity.ids, config.debug.sysfs
        self._reports: list[Callable[[], dict]] = []
        self._clock: list[Callable[[str, float], None]] = []
        self._means: Callable[[], frozenset] | None = None
        self.profile = PROFILES[profile_name](ProfileContext(
            device_id=ids.device_id, token=ids.token, on_token=ids.registered,
            on_unpaired=ids.unpaired_by_server, facts=lambda: hardware_facts(sysfs),
            pairing_code=ids.pairing_code, claimed=ids.claimed, on_claimed=ids.claimed_as,
            telemetry=self._telemetry, allowed_commands=config.commands.allow,
            means=self._screen_means, cold_start=cold_start))
        self.server_clock = ServerClock()   # as the link measures it: expiry, set-time
        self.runner = LinkRunner(Settings(
            config.link, config.server, config.debug,
            paused=identity.token() is None and not self.profile.pairs_in_link),
            profile=self.profile, identity=identity.current, gate=gate,
            hooks=Hooks(on_status, on_turn, ids.refused, self._clock_news),
            keeps=Keeps(store, IdleMemory(config.state_dir), self.server_clock))
        self.port = self.runner.pipe   # the link's port, all the other parts see of it
        identity.subscribe(pause_link=self.runner.pause, resume_link=self.runner.resume,
                           reregister=self.runner.credentials_dropped,
                           next_attempt=self.runner.seconds_to_next_attempt, pairs=self.profile)

    def subscribe(self, *, telemetry: Callable[[], dict] | None = None,
                  means: Callable[[], frozenset] | None = None,
                  clock: Callable[[str, float], None] | None = None) -> None:
        """``telemetry()``: what a part adds to the profile's telemetry (later ones win a
        shared key); ``means()``: what the screen can do; ``clock(kind, skew_s)``: this
        device's clock gone far from the server's, or back (on the link's thread)."""
        if telemetry is not None:
            self._reports.append(telemetry)
        if means is not None:
            self._means = means
        if clock is not None:
            self._clock.append(clock)

    def _telemetry(self) -> dict:
        report: dict = {}
        for part in self._reports:
            report.update(part())
        return report

    def _screen_means(self) -> frozenset | None:
        return self._means() if self._means is not None else None

    def _clock_news(self, kind: str, skew_s: float) -> None:
        for heard in self._clock:
            heard(kind, skew_s)

    def enqueue_problem(self, kind: str) -> str | None:
        """Why this server's profile takes no upload of ``kind``, or None."""
        return uncarried(self.profile, kind)
