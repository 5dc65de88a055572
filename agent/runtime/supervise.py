"""Every loop of the agent under supervision: a bug costs a restart of that loop, seen.

An exception nobody expected (a library raising something it does not document, a
bug) is logged once per kind with its traceback at error priority, and the loop is
started again after a backoff (1 s doubling to a minute). A loop that keeps dying (5
times in 10 minutes) is left stopped: it stops ticking the watchdog gate, the pets
stop, and systemd starts a fresh process, which is the one remedy left.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from ..base.backoff import ceiling

log = logging.getLogger("edge_agent")

MAX_DEATHS, DEATH_WINDOW_S = 5, 600.0
BACKOFF_BASE_S, BACKOFF_CAP_S = 1.0, 60.0


def supervise(name: str, loop: Callable[[], None], stopping: Callable[[], bool],
              pause: Callable[[float], bool] | None = None,
              clock: Callable[[], float] = time.monotonic) -> bool:
    """Runs ``loop`` until it returns or ``stopping()``. ``pause(seconds)`` waits before
    a restart and returns True to give up early (default: time.sleep). False when it
    left a loop that kept dying stopped."""
    deaths: list[float] = []
    seen: set[str] = set()
    while not stopping():
        try:
            loop()
            return True
        except Exception as e:
            now = clock()
            deaths = [t for t in deaths if now - t < DEATH_WINDOW_S] + [now]
            kind = f"{type(e).__name__}"
            if kind not in seen:  # the traceback once per kind: the journal is not a loop
                seen.add(kind)
                log.error("%s loop failed: %s: %s", name, kind, e, exc_info=True)
            else:
                log.error("%s loop failed again: %s: %s", name, kind, e)
            if len(deaths) >= MAX_DEATHS:
                log.error("%s loop failed %d times in %.0f min: leaving it stopped, so the "
                          "watchdog stops being petted and systemd restarts the agent",
                          name, len(deaths), DEATH_WINDOW_S / 60)
                return False
            delay = ceiling(BACKOFF_BASE_S, BACKOFF_CAP_S, len(deaths) - 1)
            if (pause or _sleep)(delay):
                return True
    return True


def _sleep(seconds: float) -> bool:
    time.sleep(seconds)
    return False
