"""The dashboard's operator tools: one shell line, the clock and the time zone.

Each is off unless ``[commands] allow`` lists it (``shell``, ``set-time``,
``set-timezone``; the command core refuses it otherwise, and the link declares it to the
server only then).

The shell line runs as ``sh -c`` (operators type pipes and ``;``, and ScreenTinker's
dashboard sends its presets that way) as the agent's own user, inside the agent's
sandbox, which is the boundary: no capability, no new privileges, a read-only system.
It runs through base/children.py: its own session, bounded in time (``[commands]
timeout_s``) and output (what the result keeps, the rest read, counted and dropped; a
flood is stopped), and whatever it leaves behind (``sleep 600 &``) is killed with its
process group. Each use is written to the journal with the line and its exit.

The clock and the zone are systemd-timedated's (its polkit actions
``org.freedesktop.timedate1.set-time`` and ``...set-timezone``, granted to the agent's
user only while the allow list names them: agent/programs/grants.py). The clock is set
only while NTP does not synchronise it: the agent never fights NTP.
"""
from __future__ import annotations

import logging
import os
from datetime import datetime, timezone
from typing import Callable

from ..base import children
from ..base.fsutil import read_bounded
from ..base.server_clock import FAR_S
from .core import SHELL_OUTPUT, Outcome, _clip

log = logging.getLogger("edge_agent.commands")

SHELL = "/bin/sh"
TIMEDATECTL = "timedatectl"
ZONEINFO = "/usr/share/zoneinfo"
TZDATA_LIST = "tzdata.zi"     # tzdata's own list of zones and links, in zic's input form
MAX_TZDATA_LIST = 1 << 20     # about 110 KB in 2025
# a shell line's output beyond what its result keeps is read and dropped up to this, so
# a long listing still ends with its own exit; past it the line is stopped
SHELL_DRAIN = 1 << 20
NOT_RUN = -1          # the exit a shell result carries when nothing ran (1.9's players too)
TIMED_OUT = 124       # timeout(1)'s status: the line was killed at its bound
SHELL_SHOWN = 200     # characters of the line in the journal
NOTES_ROOM = 160      # what the notes after a shell's output may take


class OperatorTools:
    def __init__(self, timeout_s: float, start: Callable, release: Callable[[object], None],
                 run: Callable, zoneinfo: str = ZONEINFO,
                 server_far: Callable[[float], float | None] = lambda when: None):
        """``start(argv, merge_stderr)``: the child, tracked so the agent's stop kills
        it, or an Outcome saying why it did not start; ``release(child)`` when it is done.
        ``run(argv)``: a program's CompletedProcess, or an Outcome saying why it failed
        (the commands' own helpers, commands/actions.py). ``server_far(when)``: how far
        ``when`` is from the server's clock when that is more than a day, else None
        (base/server_clock.py)."""
        self.timeout_s = timeout_s
        self._start = start
        self._release = release
        self._run = run
        self.zoneinfo = zoneinfo
        self._server_far = server_far

    # -- shell ----------------------------------------------------------------------
    def shell(self, args: dict) -> Outcome:
        cmd = args["cmd"]
        shown = shown_line(cmd)
        child = self._start([SHELL, "-c", cmd], True)
        if isinstance(child, Outcome):
            log.warning("shell line from the fleet not run: %s: %s", shown, child.error)
            return Outcome(False, error=child.error, extra={"exit": NOT_RUN})
        try:
            got = children.collect(child, self.timeout_s, SHELL_OUTPUT, SHELL_DRAIN)
        finally:
            self._release(child)
        text = got.output.decode("utf-8", errors="replace")
        if got.flooded:
            status, why = TIMED_OUT, f"stopped: more than {SHELL_DRAIN} bytes of output"
        elif got.exit is None:
            status, why = TIMED_OUT, f"killed after {self.timeout_s:g} s ([commands] timeout_s)"
        else:
            # a signal's death told the way a shell tells it (128 + the signal)
            status = got.exit if got.exit >= 0 else 128 - got.exit
            why = f"exited {status}" if status else ""
        # room for the notes: the result's whole output fits SHELL_OUTPUT as the ledger
        # writes it (JSON), so nothing after this cuts the notes off
        kept = _clip(text, SHELL_OUTPUT - NOTES_ROOM)
        notes = []
        left_out = got.dropped + max(0, len(got.output) - len(kept.encode()))
        if left_out:
            notes.append(f"[output cut: {left_out}{'+' if got.flooded else ''} more bytes "
                         "left out]")
        if why and status != got.exit:
            notes.append(f"[{why}]")
        output = kept + ("\n" + "\n".join(notes) if notes else "")
        log.info("shell line from the fleet: %s: exit %d after %.1f s, %d bytes of output",
                 shown, status, got.took_s, len(got.output) + got.dropped)
        extra = {"exit": status}
        if status == 0:
            return Outcome(True, output or "(no output)", extra=extra)
        return Outcome(False, output or None, error=why, extra=extra)

    # -- the clock ------------------------------------------------------------------
    def set_time(self, args: dict) -> Outcome:
        far = None if args.get("force") else self._server_far(args["time"])
        if far is not None:
            # 2062 typed for 2026 would refuse every command the fleet sends after it
            return Outcome(False, error=(
                f"set-time refused: {_when(args['time'])} is {_span(abs(far))} "
                f"{'ahead of' if far > 0 else 'behind'} the server's clock (more than "
                f"{_span(FAR_S)}); send force: true to set it anyway"))
        synced = self._run([TIMEDATECTL, "show", "-p", "NTPSynchronized", "--value"])
        if isinstance(synced, Outcome):
            return Outcome(False, error="set-time refused: cannot tell whether NTP "
                                        f"synchronises the clock ({synced.error})")
        state = synced.stdout.decode(errors="replace").strip()
        if state != "no":
            return Outcome(False, error=(
                "set-time refused: NTP synchronises this clock; the agent never fights NTP "
                "(to set it by hand, turn NTP off on the screen: timedatectl set-ntp false)"
                if state == "yes" else
                f"set-time refused: timedatectl said {state[:40]!r} of NTPSynchronized"))
        when = datetime.fromtimestamp(args["time"], timezone.utc)
        r = self._run([TIMEDATECTL, "--no-ask-password", "set-time",
                       when.strftime("%Y-%m-%d %H:%M:%S UTC")])
        if isinstance(r, Outcome):
            return Outcome(False, error=f"set-time refused: {r.error}")
        log.warning("the clock set from the fleet to %s%s", when.isoformat(),
                    " (forced: the server's clock not asked)" if args.get("force") else "")
        return Outcome(True, f"clock set to {when.isoformat()}")

    def set_timezone(self, args: dict) -> Outcome:
        zone = args["zone"]
        # a name tzdata lists (what timedatectl list-timezones reads), whose file is a
        # TZif file inside the database: tzdata's own localtime -> /etc/localtime would
        # make /etc/localtime a link to itself, posixrules is rules, Europe a directory
        if zone not in zone_names(self.zoneinfo) or not _in_database(self.zoneinfo, zone):
            return Outcome(False, error=f"no such time zone here: {zone!r} "
                                        f"(not in tzdata's list of zones under {self.zoneinfo})")
        r = self._run([TIMEDATECTL, "--no-ask-password", "set-timezone", zone])
        if isinstance(r, Outcome):
            return Outcome(False, error=f"set-timezone refused: {r.error}")
        log.warning("the time zone set from the fleet to %s", zone)
        return Outcome(True, f"time zone set to {zone}")


def shown_line(cmd: str) -> str:
    """The line as the journal shows it: quoted (its escapes visible), bounded."""
    return repr(cmd if len(cmd) <= SHELL_SHOWN else cmd[:SHELL_SHOWN - 3] + "...")


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _span(seconds: float) -> str:
    days = seconds / 86400
    if days >= 730:
        return f"{days / 365.25:.0f} years"
    return f"{days:.0f} day{'s' if round(days) != 1 else ''}" if days >= 1 \
        else f"{seconds / 3600:.0f} hours"


def zone_names(zoneinfo: str) -> frozenset:
    """The zones tzdata lists in ``tzdata.zi`` (Debian 12 and 13 ship it; systemd's
    list-timezones reads it): each zone (``Z name``) and each link's name (``L target
    name``); empty when it cannot be read, so nothing is taken."""
    try:
        text = read_bounded(os.path.join(zoneinfo, TZDATA_LIST), MAX_TZDATA_LIST,
                            follow_links=True).decode("ascii", "replace")
    except (OSError, ValueError):
        return frozenset()
    names = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "Z":
            names.add(fields[1])
        elif len(fields) >= 3 and fields[0] == "L":
            names.add(fields[2])
    return frozenset(names)


def _in_database(zoneinfo: str, zone: str) -> bool:
    """The zone's file resolves inside the zone database (a link within it, as UTC ->
    Etc/UTC, is fine; one out of it is not) and is a TZif file."""
    root = os.path.realpath(zoneinfo)
    real = os.path.realpath(os.path.join(root, zone))
    if not real.startswith(root + os.sep):
        return False
    try:
        return read_bounded(real, 1 << 20)[:4] == b"TZif"
    except (OSError, ValueError):
        return False

