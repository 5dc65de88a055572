"""The configuration checked whole: config's own rules (config/load.py), and the rules
only a part knows, such as the working hours' syntax. `edge-agent run`, `check-config`
and a revision from the fleet are checked here; root's programs, which act on none of
these, read the configuration through config/ alone and load no part."""
from __future__ import annotations

from ..config import load as config_load
from ..config.model import Config
from ..config.schema import ConfigError
from ..hours.rules import Schedule, ScheduleError


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
