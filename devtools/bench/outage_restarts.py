"""Watchdog restarts through a long outage of the network, on a fake clock: the real
gate (agent/runtime/watchdog_gate.py) asked every half period, as the agent's petter asks it,
and systemd's watchdog played as it acts (no pet for WatchdogSec: a restart,
RestartSec later a new process, which reads the outage's count its predecessor kept).
Side by side with the gate as it was before the outage's patience: every WatchdogSec."""
from __future__ import annotations

from dataclasses import dataclass

from agent.runtime.watchdog_gate import OutagePatience, WatchdogGate

HOUR = 3600.0


@dataclass
class OutageRun:
    patience: bool
    hours: float
    watchdog_s: float
    restarts: int
    restart_times_min: list


def simulate(hours: float = 8.0, watchdog_s: float = 300.0, restart_s: float = 5.0,
             patience: bool = True, outage: bool = True, wedged_at: float | None = None) -> OutageRun:
    """Restarts of an agent whose link stays down ``hours`` for an outage (or, with
    ``outage`` False, for a reason a fresh process may mend). ``wedged_at``: a loop of
    the process alive then stops ticking."""
    now, kept, times = 0.0, 0, []
    end = hours * HOUR
    while now < end:
        gate = WatchdogGate(require_link=True,
                            patience=OutagePatience(watchdog_s, kept, now) if patience else None)
        gate.register("link", 5.0, now)
        last_pet = now
        while now < end:
            now += watchdog_s / 2
            if wedged_at is None or now < wedged_at:
                gate.tick("link", now)
            ok, _ = gate.verdict(now, link_live=False, outage=outage)
            if gate.restarts_to_keep is not None:
                kept, gate.restarts_to_keep = gate.restarts_to_keep, None
            if ok:
                last_pet = now
            elif now - last_pet >= watchdog_s:
                times.append(round(now / 60, 1))
                if wedged_at is not None and now >= wedged_at:
                    wedged_at = None   # a fresh process does not wedge again
                now += restart_s
                break
    return OutageRun(patience, hours, watchdog_s, len(times), times)


def compare() -> list[OutageRun]:
    return [simulate(patience=True), simulate(patience=False)]


def section(runs: list[OutageRun]) -> list[str]:
    ours, before = runs
    return ["## Restarts during a long outage", "",
            f"An agent whose link is down {ours.hours:g} h for the network's reason "
            f"(WatchdogSec {ours.watchdog_s / 60:g} min, RestartSec 5 s), on a fake clock with "
            "the real watchdog gate; systemd's watchdog played as it acts.", "",
            "| gate | restarts | first restarts at (min) |", "|---|---|---|",
            f"| edge-agent: each restart in one outage later than the last | {ours.restarts} | "
            f"{', '.join(map(str, ours.restart_times_min[:8]))} |",
            f"| before: every WatchdogSec | {before.restarts} | "
            f"{', '.join(map(str, before.restart_times_min[:8]))} |", "",
            f"{before.restarts / max(1, ours.restarts):.1f}x fewer restarts."]
