"""The dashboard's operator tools (shell, set-time, set-timezone): off unless allowed,
arguments checked strictly, the shell line bounded in time and output with whatever it
leaves behind killed, each use in the journal, the clock never set against NTP."""
import logging
import os
import shutil
import stat
import time
from types import SimpleNamespace

import pytest

from agent.commands.actions import Actions
from agent.commands.core import (COMMANDS, SHELL_OUTPUT, CommandCore, Finished, Persist,
                                 Received, Report, Run,
                                 set_time_args, set_timezone_args, shell_args)
from agent.commands.operator import TIMED_OUT


def actions(timeout_s=5.0):
    return Actions(SimpleNamespace(timeout_s=timeout_s), "http://fleet.invalid",
                   snapshot=dict, link_socket=lambda: None, request_restart=lambda: None,
                   enqueue=lambda *a: "x")


def gone(pid: int) -> bool:
    """Dead: no such process, or a zombie waiting for whoever reaps orphans here."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_gone(pid: int, within_s: float = 2.0) -> bool:
    deadline = time.monotonic() + within_s
    while not gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# -- off unless allowed, and the arguments ---------------------------------------------
@pytest.mark.parametrize("name,args", [("shell", {"cmd": "id"}),
                                       ("set-time", {"time": 1800000000}),
                                       ("set-timezone", {"zone": "Europe/Berlin"})])
def test_the_operator_tools_are_refused_unless_allowed(name, args):
    core = CommandCore(frozenset({"diagnostics", "logs", "reboot"}))
    [_, report] = core.handle(Received({"id": "c1", "name": name, "args": args}, 100.0, 100.0))
    assert isinstance(report, Report) and report.result["ok"] is False
    assert f"{name!r} is not allowed on this screen" in report.result["error"]
    allowed = CommandCore(frozenset({name}))
    [persist, run] = allowed.handle(Received({"id": "c1", "name": name, "args": args},
                                             100.0, 100.0))
    assert isinstance(persist, Persist) and persist.durable
    assert isinstance(run, Run) and run.args == COMMANDS[name](args)


@pytest.mark.parametrize("args", [{}, {"cmd": ""}, {"cmd": "   "}, {"cmd": 5},
                                  {"cmd": "id\nreboot"}, {"cmd": "id\rx"}, {"cmd": "a\x00b"}, {"cmd": "ls \u202e fdp.exe"}, {"cmd": "a\x85b"},
                                  {"cmd": "a\x1b[2Jb"}, {"cmd": "x" * 1001},
                                  {"cmd": "id", "as": "root"}])
def test_a_shell_line_is_one_clean_line(args):
    with pytest.raises(ValueError):
        shell_args(args)


def test_a_shell_line_keeps_its_pipes_and_tabs():
    line = "ls /\t| head -n 3; echo \"$HOME\" && uname -a"
    assert shell_args({"cmd": line}) == {"cmd": line}


@pytest.mark.parametrize("given,seconds", [
    (1800000000, 1800000000), (1800000000.7, 1800000000),
    ("2027-01-15T08:00:00Z", 1800000000), ("2027-01-15T09:00:00+01:00", 1800000000),
    ("2027-01-15 08:00:00+00:00", 1800000000)])
def test_set_time_takes_epoch_seconds_or_iso_8601_with_an_offset(given, seconds):
    assert set_time_args({"time": given}) == {"time": seconds}


@pytest.mark.parametrize("args", [
    {}, {"time": None}, {"time": True}, {"time": float("nan")}, {"time": float("inf")},
    {"time": "2027-01-15T08:00:00"},          # no offset: whose local time?
    {"time": "yesterday"}, {"time": "2027-13-01T00:00:00Z"},
    {"time": 1800000000000},                  # milliseconds sent as seconds
    {"time": 1000000000},                     # 2001: a clock set back, never a correction
    {"time": "2101-01-01T00:00:00Z"}, {"time": "2027-01-15T08:00:00Z" + " " * 40},
    {"time": 1800000000, "ntp": False}])
def test_set_time_refuses_what_is_not_a_time_within_bounds(args):
    with pytest.raises(ValueError):
        set_time_args(args)


@pytest.mark.parametrize("zone", ["../../etc/passwd", "/etc/localtime", "Europe/../../x",
                                  "", "Europe/Berlin\n", "a" * 65, "Europe//Berlin", 5])
def test_set_timezone_takes_only_a_zone_names_shape(zone):
    with pytest.raises(ValueError):
        set_timezone_args({"zone": zone})


# -- the shell line, run for real ----------------------------------------------------------
def test_a_shell_line_runs_as_a_shell_line_with_its_exit_and_both_outputs(caplog):
    caplog.set_level(logging.INFO, logger="edge_agent.commands")
    out = actions().run("shell", {"cmd": "echo out; echo err >&2; id -u; exit 3"})
    assert out.ok is False and out.extra == {"exit": 3} and out.error == "exited 3"
    assert out.output.splitlines() == ["out", "err", str(os.getuid())]
    [line] = [r.getMessage() for r in caplog.records if "shell line" in r.getMessage()]
    assert line.startswith("shell line from the fleet: 'echo out; echo err >&2; id -u; "
                           "exit 3': exit 3 after ")
    ok = actions().run("shell", {"cmd": "true"})
    assert ok.ok is True and ok.extra == {"exit": 0} and ok.output == "(no output)"


def test_a_background_child_the_line_leaves_behind_is_killed_with_its_group():
    t0 = time.monotonic()
    out = actions(timeout_s=20).run("shell", {"cmd": "sleep 60 & echo $!"})
    took = time.monotonic() - t0
    assert out.ok is True and out.extra == {"exit": 0}
    assert took < 2.0, f"waited {took:.1f}s on a background child holding the pipe"
    assert wait_gone(int(out.output.strip())), "the background sleep outlived its line"


def test_a_line_past_its_bound_is_killed_with_everything_it_forked():
    t0 = time.monotonic()
    out = actions(timeout_s=1.0).run("shell", {"cmd": "sleep 60 & echo $!; sleep 60"})
    took = time.monotonic() - t0
    assert 1.0 <= took < 3.0
    assert out.ok is False and out.extra == {"exit": TIMED_OUT}
    assert out.error == "killed after 1 s ([commands] timeout_s)"
    pid = int(out.output.splitlines()[0])
    assert out.output.endswith("[killed after 1 s ([commands] timeout_s)]")
    assert wait_gone(pid)


def test_the_lines_own_process_is_reaped_when_killed_at_its_bound():
    """Killed at its bound, the line's own process is waited for (base/children's one
    reaping): no zombie of the agent's is left behind."""
    out = actions(timeout_s=1.0).run("shell", {"cmd": "echo $$; sleep 60"})
    pid = int(out.output.splitlines()[0])
    assert out.extra == {"exit": TIMED_OUT}
    assert not os.path.exists(f"/proc/{pid}"), "a zombie: killed but never reaped"


def test_output_past_the_bound_is_cut_and_said_and_its_exit_kept():
    out = actions().run("shell", {"cmd": "head -c 100000 /dev/zero | tr '\\0' a; exit 4"})
    assert out.extra == {"exit": 4} and out.error == "exited 4"
    body, note = out.output.rsplit("\n", 1)
    assert set(body) == {"a"} and len(body) <= SHELL_OUTPUT
    assert note == f"[output cut: {100000 - len(body)} more bytes left out]"


def test_a_flood_of_output_is_stopped_long_before_its_time_bound():
    t0 = time.monotonic()
    out = actions(timeout_s=60).run("shell", {"cmd": "yes"})
    assert time.monotonic() - t0 < 10.0
    assert out.ok is False and out.extra == {"exit": TIMED_OUT}
    assert out.error == "stopped: more than 1048576 bytes of output"
    assert "more bytes left out]" in out.output


def test_a_shell_result_as_the_core_reports_it():
    core = CommandCore(frozenset({"shell"}))
    [_, run] = core.handle(Received({"id": "c1", "name": "shell",
                                     "args": {"cmd": "printf 'a\\nb'"}}, 100.0, 100.0))
    out = actions().run(run.name, run.args)
    [_, report] = core.handle(Finished("c1", out.ok, out.output, out.error, 100.5, 101.0,
                                       out.extra))
    r = report.result
    assert (r["ok"], r["output"], r["exit"], r["name"]) == (True, "a\nb", 0, "shell")
    assert "error" not in r


def test_the_agents_stop_kills_a_running_line():
    from agent.runtime.threads import start_worker
    acts = actions(timeout_s=30)
    got = {}
    worker = start_worker("test-shell", lambda: got.update(
        out=acts.run("shell", {"cmd": "sleep 30"})), reason="the line runs while the test "
                                                            "stops the actions")
    time.sleep(0.3)
    t0 = time.monotonic()
    acts.stop()
    assert worker.join(5.0) and time.monotonic() - t0 < 3.0
    assert got["out"].ok is False and got["out"].extra["exit"] == 128 + 9


# -- the clock and the zone ------------------------------------------------------------
@pytest.fixture
def timedatectl(tmp_path, monkeypatch):
    """A timedatectl first on PATH that answers NTPSynchronized as told and records what
    it was asked: the real one needs a running timedated (the booted tier has it)."""
    calls = tmp_path / "calls"
    state = tmp_path / "ntp"
    script = tmp_path / "bin" / "timedatectl"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n"
                      f"echo \"$*\" >> {calls}\n"
                      f"if [ \"$1\" = show ]; then cat {state}; exit 0; fi\n"
                      "exit 0\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{script.parent}:{os.environ['PATH']}")
    return SimpleNamespace(state=state, calls=calls)


def test_set_time_is_refused_while_ntp_synchronises_the_clock(timedatectl):
    timedatectl.state.write_text("yes\n")
    out = actions().run("set-time", {"time": 1800000000})
    assert out.ok is False and "NTP synchronises this clock" in out.error
    assert timedatectl.calls.read_text().splitlines() == ["show -p NTPSynchronized --value"]


def test_set_time_goes_to_timedated_when_nothing_synchronises_it(timedatectl):
    timedatectl.state.write_text("no\n")
    out = actions().run("set-time", {"time": 1800000000})
    assert out.ok is True and out.output == "clock set to 2027-01-15T08:00:00+00:00"
    assert timedatectl.calls.read_text().splitlines() == [
        "show -p NTPSynchronized --value",
        "--no-ask-password set-time 2027-01-15 08:00:00 UTC"]


def test_set_time_is_refused_when_it_cannot_tell_whether_ntp_runs():
    """The real timedatectl with no timedated to ask (this machine has no systemd as
    PID 1): not knowing is not "not synchronised"."""
    assert shutil.which("timedatectl"), "timedatectl is missing: .ci/run installs systemd"
    out = actions().run("set-time", {"time": 1800000000})
    assert out.ok is False
    assert out.error.startswith("set-time refused: cannot tell whether NTP synchronises "
                                "the clock (timedatectl exited 1")


def test_set_timezone_only_for_a_zone_this_screen_has(timedatectl):
    assert os.path.isfile("/usr/share/zoneinfo/Europe/Berlin"), \
        "tzdata is missing: .ci/run installs it (TEST_DEBS)"
    for zone in ("Europe/Nowhere", "Europe", "Etc"):
        out = actions().run("set-timezone", {"zone": zone})
        assert out.ok is False and out.error.startswith(f"no such time zone here: {zone!r}")
    assert not timedatectl.calls.exists()
    out = actions().run("set-timezone", {"zone": "Europe/Berlin"})
    assert out.ok is True and out.output == "time zone set to Europe/Berlin"
    assert timedatectl.calls.read_text().splitlines() == [
        "--no-ask-password set-timezone Europe/Berlin"]


@pytest.mark.parametrize("zone", ["localtime", "posixrules", "Factory/../localtime",
                                  "right", "Etc", "zone1970.tab", "tzdata.zi", "leapseconds"])
def test_set_timezone_takes_only_a_zone_of_tzdatas_own_list(timedatectl, zone):
    """tzdata ships zoneinfo/localtime -> /etc/localtime: timedated would make
    /etc/localtime a link to itself, and every program would fall back to UTC.
    posixrules is a file of rules, not a zone. Only the names tzdata lists are zones."""
    assert os.path.islink("/usr/share/zoneinfo/localtime"), "tzdata ships the link"
    out = actions().run("set-timezone", {"zone": zone})
    assert out.ok is False and out.error.startswith(f"no such time zone here: {zone!r}"), out
    assert not timedatectl.calls.exists()


@pytest.mark.parametrize("zone", ["Europe/Berlin", "UTC", "Etc/GMT+2", "America/New_York"])
def test_the_zones_tzdata_lists_are_taken(timedatectl, zone):
    out = actions().run("set-timezone", {"zone": zone})
    assert out.ok is True, out
    assert timedatectl.calls.read_text().splitlines() == [
        f"--no-ask-password set-timezone {zone}"]


def test_a_listed_zone_that_leads_out_of_the_zone_database_is_refused(tmp_path, timedatectl):
    """A copy of the database where a listed name is a link out of it (as localtime
    is), and one that is a link inside it (as UTC is, to Etc/UTC)."""
    from agent.commands.operator import OperatorTools
    zi = tmp_path / "zoneinfo"
    (zi / "Etc").mkdir(parents=True)
    shutil.copy("/usr/share/zoneinfo/Etc/UTC", zi / "Etc" / "UTC")
    (zi / "UTC").symlink_to("Etc/UTC")
    (zi / "Etc" / "Out").symlink_to("/usr/share/zoneinfo/Europe/Berlin")
    (zi / "tzdata.zi").write_text("# version test\nZ Etc/UTC 0 - UTC\nL Etc/UTC UTC\n"
                                  "L Etc/UTC Etc/Out\n")
    done = []
    tools = OperatorTools(5.0, None, None, lambda argv: done.append(argv) or
                          __import__("subprocess").CompletedProcess(argv, 0, b"", b""),
                          zoneinfo=str(zi))
    assert tools.set_timezone({"zone": "Etc/Out"}).ok is False
    assert tools.set_timezone({"zone": "UTC"}).ok is True
    assert done == [["timedatectl", "--no-ask-password", "set-timezone", "UTC"]]


# -- ScreenTinker 1.9's terminal and clock ---------------------------------------------------
def st_profile(allowed):
    from agent.link.profiles.contract import ProfileContext
    from agent.link.profiles.screentinker import ScreenTinkerProfile
    return ScreenTinkerProfile(ProfileContext(device_id=lambda: "st-1", token=lambda: None,
                                              allowed_commands=frozenset(allowed)))


def test_screentinkers_operator_commands_are_the_agents():
    from agent.link.profiles.screentinker import ScreenTinkerProfile
    command = ScreenTinkerProfile._command
    assert command("shell", {"cmd": "uptime"}) == ("shell", {"cmd": "uptime"})
    assert command("set_timezone", {"timezone": "Europe/Berlin"}) == \
        ("set-timezone", {"zone": "Europe/Berlin"})
    assert command("set_time", {"millis": 1800000000000}) == ("set-time", {"time": 1800000000.0})
    assert set_time_args(command("set_time", {"millis": 1800000000123})[1]) == \
        {"time": 1800000000}
    # what they carry is the core's to check: refused there, by name
    for kind, payload, check in (("shell", None, shell_args), ("shell", {"cmd": 5}, shell_args),
                                 ("set_time", {"millis": "soon"}, set_time_args),
                                 ("set_time", {"millis": True}, set_time_args),
                                 ("set_time", {"millis": 10 ** 30}, set_time_args),
                                 ("set_time", {}, set_time_args),
                                 ("set_timezone", {"timezone": "../x"}, set_timezone_args)):
        with pytest.raises(ValueError):
            check(command(kind, payload)[1])


def test_system_shell_and_system_time_are_declared_exactly_when_allowed():
    assert st_profile(["diagnostics", "logs"]).capabilities() == []
    assert st_profile(["shell"]).capabilities() == ["system.shell"]
    assert st_profile(["set-timezone"]).capabilities() == ["system.time"]
    assert st_profile(["set-time", "set-timezone", "shell", "reboot"]).capabilities() == [
        "system.reboot", "system.shell", "system.time"]


def test_a_shell_result_goes_to_screentinker_as_its_terminal_reads_it():
    from agent.link import inbox
    profile = st_profile(["shell"])
    posted = []
    handlers = profile.handlers(posted.append)
    handlers["device:command"](None, {"type": "shell", "payload": {"cmd": "echo hi; false"}})
    handlers["device:command"](None, {"type": "shell", "payload": {"cmd": "x" * 1100}})
    [ran, refused] = [p.raw for p in posted if isinstance(p, inbox.Request)]
    core = CommandCore(frozenset({"shell"}))
    [_, run] = core.handle(Received(ran, 100.0, 100.0))
    out = actions().run(run.name, run.args)
    [_, report] = core.handle(Finished(run.id, out.ok, out.output, out.error, 100.0, 101.0,
                                       out.extra))
    assert profile.command_result(report.result) == ("device:shell-result", {
        "device_id": "st-1", "cmd": "echo hi; false", "output": "hi\n", "exit": 1}, False)
    # refused before it ran: the terminal is told why, and that it never ran
    [_, report] = core.handle(Received(refused, 100.0, 100.0))
    event, payload, confirms = profile.command_result(report.result)
    assert (event, payload["cmd"], payload["exit"]) == ("device:shell-result", "x" * 500, -1)
    assert payload["output"] == "bad argument: cmd: at most 1000 characters"
    # other results stay device:log lines
    assert profile.command_result({"id": "a", "name": "set-time", "ok": False,
                                   "error": "set-time refused: NTP synchronises this clock"}
                                  )[0] == "device:log"
