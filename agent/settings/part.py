"""The fleet's settings, assembled: the overlay on the card (service.py) and the trial
of a new revision (trial.py), which checks a revision by loading the whole
configuration with it, as the next start would."""
from __future__ import annotations

from typing import Callable

from ..config import load as config_load
from ..config.model import Config
from ..events.model import Event
from ..runtime.watchdog_gate import WatchdogGate
from .service import FleetSettings
from .trial import SettingsTrial


def assemble(config: Config, environ, fleet: FleetSettings | None, *,
             publish: Callable[[Event], None], stop: Callable[[str], None],
             gate: WatchdogGate | None) -> SettingsTrial:
    """``fleet``: the overlay already read (the command line's), or None to read it."""
    return SettingsTrial(
        fleet or FleetSettings(config.state_dir, config.fleet.proof_timeout_s),
        check=lambda values: config_load.load(config.source, environ, fleet=values),
        publish=publish, stop=stop, fleet_problem=config.fleet_problem,
        origins=config.origins, gate=gate,
        adjusted=[config_load.adjustment_text(*a) for a in config.adjusted])
