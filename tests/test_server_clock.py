"""The server's clock as the link measures it (base/server_clock.py): a wrong device
clock cannot refuse the fleet's commands, set-time refuses a time far from the server's
unless forced, and a clock far from the server's is a status line and an event.

Before: a device clock 36 years ahead (2062 typed for 2026 passed set-time's bounds)
refused every command that carries ``expires_at`` ("expired 1135295... s before it
arrived"), the set-time that would repair it included."""
from __future__ import annotations

import os
import shutil
import stat
import time

import pytest

from agent.base.server_clock import CLOCK_OK, CLOCK_SKEWED, FAR_S, SKEWED_S, ServerClock
from agent.commands.core import CommandCore, Persist, Received, Run, set_time_args
from agent.commands.operator import OperatorTools
from devtools.harness import REPO, AgentProcess, agent_config, wait_for

YEARS_36 = 36 * 365 * 86400      # libfaketime's "+36y"


def commands(server):
    return server.admin("/api/v1/devices/screen-1/commands")


def ask(server, name, args=None):
    """As an operator asks: the reference server sends ``expires_at`` (300 s on)."""
    return server.admin("/api/v1/commands", {"device_id": "screen-1", "name": name,
                                             "args": args or {}})["id"]


def result_of(server, cid, timeout=15.0):
    return wait_for(lambda: commands(server)[cid]["result"], timeout, interval=0.1,
                    what=f"the result of command {cid}")


def events(server, kind):
    return [e for e in server.admin("/admin/devices").get("screen-1", {}).get("events", [])
            if e.get("type") == kind]


SERVER = 1_796_000_000.0        # the server's clock (2026)


# -- sans I/O: the measure, the expiry, set-time's bound ---------------------------------
def test_the_servers_clock_runs_on_the_monotonic_clock_whatever_the_wall_does():
    clock = ServerClock()
    assert clock.now(5.0) is None and clock.skew_s(SERVER, 5.0) is None
    clock.measured_skew(-YEARS_36, SERVER + YEARS_36, 100.0)   # this clock 36 years ahead
    assert clock.now(160.0) == SERVER + 60
    assert clock.skew_s(SERVER + YEARS_36 + 60, 160.0) == -YEARS_36
    assert clock.skew_s(SERVER + 60, 160.0) == 0          # set right: within at once


def test_a_skewed_clock_is_told_once_and_again_when_back_within():
    clock = ServerClock()
    clock.measured(SERVER, 0.0)
    assert clock.change(SERVER + 1, 1.0) is None                 # a first measure within
    assert clock.change(SERVER + 3 + SKEWED_S, 2.0) == (CLOCK_SKEWED, -1 - SKEWED_S)
    assert clock.change(SERVER + 1e6, 3.0) is None               # no news: still skewed
    assert clock.change(SERVER + 4, 4.0) == (CLOCK_OK, 0.0)
    assert clock.change(SERVER + 5, 5.0) is None


def _diagnostics(cid: str, expires_at: float) -> dict:
    return {"id": cid, "name": "diagnostics", "args": {}, "expires_at": expires_at}


def test_expiry_is_judged_by_the_servers_clock_on_a_device_36_years_ahead():
    ahead = SERVER + YEARS_36
    core = CommandCore(frozenset({"diagnostics"}))
    fresh = core.handle(Received(_diagnostics("c1", SERVER + 300), ahead, 1.0, SERVER))
    assert [type(a) for a in fresh] == [Persist, Run], fresh
    stale = core.handle(Received(_diagnostics("c2", SERVER - 1), ahead, 2.0, SERVER))
    assert "expired 1s before it arrived" in stale[1].result["error"], stale
    # before any measure, the device's clock is all there is
    alone = core.handle(Received(_diagnostics("c3", SERVER + 300), ahead, 3.0))
    assert "expired" in alone[1].result["error"], alone


def test_set_time_far_from_the_servers_clock_is_refused_unless_forced():
    clock = ServerClock()
    clock.measured(SERVER, 0.0)
    ran = []

    def run(argv):
        ran.append(argv)
        return __import__("subprocess").CompletedProcess(argv, 0, b"no\n", b"")
    tools = OperatorTools(5.0, None, None, run, server_far=lambda when: clock.far(when, 0.0))
    out = tools.set_time(set_time_args({"time": int(SERVER + YEARS_36)}))
    assert out.ok is False and "36 years ahead of the server's clock" in out.error, out
    assert "force: true" in out.error and ran == []
    out = tools.set_time(set_time_args({"time": int(SERVER - 2 * FAR_S)}))
    assert out.ok is False and "2 days behind the server's clock" in out.error, out
    assert tools.set_time(set_time_args({"time": int(SERVER + FAR_S)})).ok
    assert tools.set_time(set_time_args({"time": int(SERVER + YEARS_36), "force": True})).ok
    with pytest.raises(ValueError, match="force"):
        set_time_args({"time": int(SERVER), "force": "yes"})


@pytest.mark.netns
def test_a_device_clock_36_years_ahead_runs_the_fleets_commands(
        netns, fleet, agent_python, tmp_path):
    assert shutil.which("faketime"), "faketime is missing: TEST_DEBS installs it"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    fake = bin_dir / "timedatectl"      # timedated answers: NTP does not synchronise it
    fake.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\n"
                    "if [ \"$1\" = show ]; then echo no; fi\nexit 0\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    server = fleet()
    cfg = agent_config(server, tmp_path,
                       commands={"allow": ["diagnostics", "logs", "set-time"]})
    # libfaketime moves the monotonic clock too (by a constant: no timer changes); left
    # alone, its clock_nanosleep answers Python 3.11's time.sleep with EINVAL now and then
    agent = AgentProcess(agent_python, cfg, tmp_path,
                         env={"PYTHONPATH": str(REPO),
                              "PATH": f"{bin_dir}:{os.environ['PATH']}"},
                         command=["faketime", "-f", "+36y", agent_python, "-m", "agent"])
    agent.start()
    try:
        agent.wait_live(15)
        r = result_of(server, ask(server, "diagnostics"))
        assert r["ok"] is True, r
        # the clock told: a status line and one event
        skewed = wait_for(lambda: events(server, "clock.skewed"), 15, what="clock.skewed")
        assert len(skewed) == 1 and abs(skewed[0]["skew_s"] + YEARS_36) < 60, skewed
        from agent.app import status
        assert "ahead of the server" in status.render(agent.status(), True)
        # set-time far from the server's clock: refused, forced: done
        far = int(time.time() + YEARS_36)
        r = result_of(server, ask(server, "set-time", {"time": far}))
        assert r["ok"] is False and "years ahead of the server's clock" in r["error"], r
        assert "force: true" in r["error"], r
        assert "set-time" not in (calls.read_text() if calls.exists() else "")
        r = result_of(server, ask(server, "set-time", {"time": far, "force": True}))
        assert r["ok"] is True, (r, agent.log_text()[-4000:].replace("\n", " | "))
        assert "--no-ask-password set-time" in calls.read_text()
        # a time near the server's is no mistake: no force needed
        r = result_of(server, ask(server, "set-time", {"time": int(time.time())}))
        assert r["ok"] is True, r
    finally:
        agent.stop()
