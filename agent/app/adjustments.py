"""What start-up found in the configuration, said: values an earlier release took and
today's bounds moved (config/load.py decides them; the journal and the server hear
them here, once per start)."""
from __future__ import annotations

import logging
import time

from ..config import load as config_load
from ..config.model import Config
from ..events.model import Event

log = logging.getLogger("edge_agent")


def said(config: Config) -> list[Event]:
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
