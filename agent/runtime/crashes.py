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
import os
import sys
from contextlib import contextmanager

from ..base.fsutil import atomic_write, read_bounded
from ..base.journal_fields import MessageId, journal
from ..base.libc import libc

log = logging.getLogger("edge_agent")

PR_SET_DUMPABLE = 4  # linux/prctl.h


def prepare(stream=None) -> None:
    faulthandler.enable(file=stream or sys.stderr, all_threads=True)
    try:
        if libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")
    except (OSError, AttributeError) as e:
        log.warning("cannot turn off core dumps: %s", e)


RUN_MARK = "running"


@contextmanager
def watched_run(runtime_dir: str):
    """The agent's run, marked in the runtime directory (tmpfs, kept across restarts of
    the unit, emptied at boot: nothing on the card) and unmarked when it ends in any way
    Python sees. A mark found at start is a previous process that ended without a
    word: killed by systemd's watchdog (its usual cause), the OOM killer or a stop that
    timed out; this start says so, once, with an id the journal's catalog explains."""
    path = os.path.join(runtime_dir, RUN_MARK)
    try:
        before = read_bounded(path, 32).decode("ascii", "replace").strip()
    except (OSError, ValueError):   # absent (the last run stopped), a link, too long
        before = None
    if before:
        log.warning("started again after the previous process (pid %s) was killed without "
                    "stopping: most often systemd's watchdog (journalctl -x -u edge-agent "
                    "has its 'Watchdog timeout' and the threads' stacks)", before[:12],
                    extra=journal(MessageId.RESTARTED_AFTER_KILL))
    try:
        atomic_write(path, str(os.getpid()).encode(), 0o644, durable=False)
    except OSError as e:
        log.warning("cannot mark this run in %s: %s", path, e.strerror)
    try:
        yield
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
