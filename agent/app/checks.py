"""The configuration checked whole: config's own rules (config/load.py), and the rules
only a part knows, such as the working hours' syntax. `edge-agent run`, `check-config`
and a revision from the fleet are checked here; root's programs, which act on none of
these, read the configuration through config/ alone and load no part."""
from __future__ import annotations

import logging
import time

from ..config import load as config_load
from ..config.model import Config
from ..config.schema import ConfigError
from ..events.model import Event
from ..hours.rules import Schedule, ScheduleError

log = logging.getLogger("edge_agent")


def part_rules(values: dict) -> None:
    """The parts' rules on the values by key, each problem a ConfigError naming its key."""
    try:
        Schedule.parse(values["hours.week"], values["hours.exceptions"])
    except ScheduleError as e:
        raise ConfigError(str(e)) from None


def load(path: str | None = None, env: dict[str, str] | None = None,
         fleet: dict | None = None, **layers) -> Config:
    """config.load with the parts' rules: what the running agent starts on."""
    return config_load.load(path, env, fleet=fleet, part_rules=part_rules, **layers)


def adjustments(config: Config) -> list[Event]:
    """Values an earlier release took, moved to today's bounds: said in the journal at
    start, and the events that tell the server (config.adjusted)."""
    events = []
    for key, given, used in config.adjusted:
        log.warning("configuration: %s (a value an earlier release took; set it within "
                    "today's bounds in %s)", config_load.adjustment_text(key, given, used),
                    config.source)
        events.append(Event("config.adjusted", time.time(),
                            {"key": key, "given": given, "used": used}))
    return events
