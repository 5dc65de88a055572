"""What a dying agent leaves behind: stack traces in the journal, no core file on the SD card.

systemd's watchdog kills a wedged agent with SIGABRT. faulthandler prints every
thread's stack to stderr (the journal) first, which is the one clue to why it wedged.
The core dump that SIGABRT would write is not wanted: tens of MB per restart on an SD
card, and the process memory holds the device token. ``LimitCORE=`` cannot prevent it
where systemd-coredump is installed (its core_pattern is a pipe, and pipes ignore
RLIMIT_CORE), so the process marks itself non-dumpable, which the kernel honours for
every core_pattern.
"""
from __future__ import annotations

import ctypes
import faulthandler
import logging
import sys

log = logging.getLogger("edge_agent")

PR_SET_DUMPABLE = 4  # linux/prctl.h


def prepare(stream=None) -> None:
    faulthandler.enable(file=stream or sys.stderr, all_threads=True)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")
    except (OSError, AttributeError) as e:
        log.warning("cannot turn off core dumps: %s", e)
