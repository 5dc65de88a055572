"""Working hours: the schedule on a fake clock, the thread with real commands, and the
real agent with a real X server (Xvfb) and xset."""
import threading
import time
from datetime import datetime

import pytest

from agent.config import load as cfgmod
from agent.config.week import Schedule, ScheduleError
from agent.hours.service import RETRY_S, WorkingHours
from agent.screen.power import DisplayPower
from devtools.harness import agent_config, wait_for

WEEK = ["mon-fri 08:00-18:00", "sat 10:00-12:30,13:00-16:00"]
EXCEPTIONS = ["2026-12-25 off", "2026-12-24 08:00-12:00"]


def test_the_schedule_wants_the_display_on_in_hours_and_says_when_that_changes():
    s = Schedule.parse(WEEK, EXCEPTIONS)
    at = datetime.fromisoformat
    assert not s.wanted(at("2026-12-07 07:59"))        # a Monday
    assert s.wanted(at("2026-12-07 08:00")) and s.wanted(at("2026-12-07 17:59"))
    assert not s.wanted(at("2026-12-07 18:00"))
    assert s.wanted(at("2026-12-12 12:00")) and not s.wanted(at("2026-12-12 12:45"))  # Saturday
    assert not s.wanted(at("2026-12-13 12:00"))        # Sunday: not listed
    assert not s.wanted(at("2026-12-25 09:00"))        # Friday, but Christmas
    assert s.wanted(at("2026-12-24 11:00")) and not s.wanted(at("2026-12-24 13:00"))
    assert s.next_change(at("2026-12-07 07:00")) == at("2026-12-07 08:00")
    assert s.next_change(at("2026-12-07 08:00")) == at("2026-12-07 18:00")
    assert s.next_change(at("2026-12-12 12:40")) == at("2026-12-12 13:00")
    assert s.next_change(at("2026-12-12 16:30")) == at("2026-12-14 08:00")  # over Sunday
    assert s.next_change(at("2026-12-24 12:00")) == at("2026-12-26 10:00")  # over Christmas
    assert Schedule.parse(["mon-sun 00:00-24:00"], []).next_change(at("2026-12-07 09:00")) is None
    spaced = Schedule.parse(["sat 10:00-12:30 13:00-16:00"], [])   # spaces, as commas
    assert spaced.week == Schedule.parse(["sat 10:00-12:30,13:00-16:00"], []).week
    night = Schedule.parse(["fri 20:00-24:00", "sat 00:00-02:00"], [])
    assert night.wanted(at("2026-12-11 23:59")) and night.wanted(at("2026-12-12 01:59"))
    assert night.next_change(at("2026-12-11 21:00")) == at("2026-12-12 02:00")


@pytest.mark.parametrize("week, exceptions, why", [
    (["mon-fri 8-18"], [], r"hours.week\[0\]: '8-18' is not HH:MM-HH:MM"),
    (["mon-fri 18:00-08:00"], [], "ends before it starts"),
    (["fri-mon 08:00-18:00"], [], "runs backwards"),
    (["monday 08:00-18:00"], [], "is not a day"),
    (["mon 08:00-18:00", "mon-tue off"], [], r"hours.week\[1\]: mon is given twice"),
    ([], ["25.12.2026 off"], r"hours.exceptions\[0\]: '25.12.2026' is not a date"),
    ([], ["2026-02-30 off"], "is not a date"),
    ([], ["2026-12-25 off", "2026-12-25 off"], "given twice"),
    (["mon 25:00-26:00"], [], "is not HH:MM-HH:MM"),
])
def test_a_bad_entry_is_refused_naming_it(week, exceptions, why):
    with pytest.raises(ScheduleError, match=why):
        Schedule.parse(week, exceptions)


def test_the_configuration_checks_the_zone_and_the_commands_the_hours_need(tmp_path):
    path = tmp_path / "agent.toml"
    base = '[server]\nurl = "http://127.0.0.1:9"\n'
    for hours, commands, why in (
            ('week = ["mon-fri 08:00-18:00"]', "", "hours.week: needs \\[commands\\] display_on_command"),
            ('week = ["mon-fri 08:00-18:00"]\ntimezone = "Mars/Olympus"', "", "no such time zone"),
            ('timezone = "../../etc/passwd"', "", "hours.timezone: must be an IANA time zone"),
            ('week = ["mon 09:00"]', "", r"hours.week\[0\]")):
        path.write_text(f"{base}[hours]\n{hours}\n{commands}")
        with pytest.raises(cfgmod.ConfigError, match=why):
            cfgmod.load(str(path), {})
    path.write_text(f'{base}[hours]\nweek = ["mon-fri 08:00-18:00"]\ntimezone = "Europe/Berlin"\n'
                    f'[commands]\ndisplay_on_command = "true"\ndisplay_off_command = "true"\n')
    assert cfgmod.load(str(path), {}).hours.week == ("mon-fri 08:00-18:00",)


class Bench:
    """WorkingHours on a fake clock, with real commands writing to a file."""

    def __init__(self, tmp_path, start, zone="Europe/Berlin", on_ok=True, synced=True):
        self.log = tmp_path / "display"
        self.wall = datetime.fromisoformat(start).timestamp()  # this host's zone: UTC
        self.mono = 0.0
        self.synced = synced
        self.faults, self.changes = [], []
        on = f"sh -c 'echo on >> {self.log}'" if on_ok else "sh -c 'echo CEC: no answer >&2; exit 3'"
        # the display's owner, as the screen part builds it, with nothing to read it back
        self.power = DisplayPower(on, f"sh -c 'echo off >> {self.log}'", 5.0, None,
                                  lambda event: None, sysfs_root=str(tmp_path / "nosys"),
                                  connect_grace_s=0)
        self.hours = WorkingHours(Schedule.parse(WEEK, EXCEPTIONS), zone, self.power,
                                  trust_clock=False, on_fault=self.faults.append,
                                  on_change=self.changes.append, now=lambda: self.wall,
                                  synced=lambda: self.synced, monotonic=lambda: self.mono)

    def advance(self, seconds):
        self.wall += seconds
        self.mono += seconds

    def seen(self):
        return self.log.read_text().split() if self.log.exists() else []


def test_the_display_goes_off_and_on_at_local_times_and_not_before_the_clock_is_set(tmp_path):
    # 06:59 UTC on a Monday is 07:59 in Berlin
    b = Bench(tmp_path, "2026-12-07 06:59:00+00:00", synced=False)
    assert b.hours.step() == 30.0 and b.seen() == [] and b.hours.snapshot()["waiting_for_clock"]
    b.synced = True
    wait = b.hours.step()
    assert b.seen() == ["off"] and wait == 30.0   # the change is 60 s away; look again at 30
    b.advance(60)
    b.hours.step()
    assert b.seen() == ["off", "on"] and b.changes[-1] == {"state": "on", "by": "working hours"}
    b.hours.step()
    assert b.seen() == ["off", "on"]   # once per change, not per look
    b.advance(10 * 3600)               # 18:00 in Berlin
    b.hours.step()
    assert b.seen() == ["off", "on", "off"] and b.hours.expected_off()
    assert b.hours.snapshot()["next_change"] == "2026-12-08T08:00"


def test_the_hour_the_clocks_go_back_does_not_turn_the_display_on_again(tmp_path):
    b = Bench(tmp_path, "2026-10-24 23:00:00+00:00")   # Sunday 01:00 CEST in Berlin
    b.hours.schedule = Schedule.parse(["sun 00:00-02:30"], [])
    b.hours.step()
    assert b.seen() == ["on"]
    b.advance(90 * 60)     # 02:30 CEST: off
    b.hours.step()
    b.advance(30 * 60)     # 03:00 CEST is 02:00 CET: the same half hour again
    for _ in range(4):
        b.hours.step()
        b.advance(15 * 60)
    assert b.seen() == ["on", "off"], "on and off again in the repeated hour"


def test_a_display_that_will_not_come_on_is_a_fault_once_and_is_tried_again(tmp_path):
    b = Bench(tmp_path, "2026-12-07 08:00:00+00:00", on_ok=False)
    b.hours.step()
    assert b.faults == [{"wanted": "on", "error": "sh exited 3: CEC: no answer"}]
    assert not b.hours.expected_off()   # meant to be on: a disconnect now is a fault
    b.advance(RETRY_S - 1)
    b.hours.step()
    b.advance(1)
    b.hours.step()
    assert len(b.faults) == 1 and b.hours.snapshot()["fault"].startswith("sh exited 3")
    b.power.commands["on"] = "true"
    b.advance(RETRY_S)
    b.hours.step()
    assert b.hours.snapshot()["fault"] is None and b.hours.applied is True


def unplugged(tmp_path):
    """A Bench at 09:00 Berlin on a Monday whose one HDMI connector is disconnected;
    and that connector's status file."""
    card = tmp_path / "sys" / "class" / "drm" / "card0-HDMI-A-1"
    card.mkdir(parents=True)
    (card / "status").write_text("disconnected\n")
    b = Bench(tmp_path, "2026-12-07 08:00:00+00:00")
    b.power.sysfs_root = str(tmp_path / "sys")
    return b, card / "status"


def test_a_tv_that_raises_hot_plug_a_moment_after_waking_is_no_fault(tmp_path):
    b, status = unplugged(tmp_path)
    b.power.connect_grace_s = 5.0
    threading.Timer(1.0, lambda: status.write_text("connected\n")).start()
    b.hours.step()
    assert b.faults == [] and b.hours.applied is True


def test_a_clock_once_set_stays_trusted_and_a_new_state_is_not_held_by_a_retry(tmp_path):
    b = Bench(tmp_path, "2026-12-07 16:59:00+00:00", on_ok=False)   # 17:59 in Berlin
    b.hours.step()
    assert len(b.faults) == 1
    b.synced = False   # hours offline: the kernel says unsynchronised again
    b.advance(60)      # 18:00: off is due now, not after the failed on's minute
    b.hours.step()
    assert b.seen() == ["off"] and b.hours.applied is False


def test_a_hanging_command_is_killed_with_its_children_and_its_line_never_reported(tmp_path):
    b = Bench(tmp_path, "2026-12-07 08:00:00+00:00")
    b.power.runner.timeout_s = 0.5
    b.power.commands["on"] = "sh -c 'sleep 30 & sleep 30' password=hunter2"
    started = time.monotonic()
    b.hours.step()
    assert time.monotonic() - started < 5
    assert b.faults == [{"wanted": "on", "error": "sh timed out after 0.5 s"}]


def test_on_with_no_display_connected_is_a_fault(tmp_path):
    b, status = unplugged(tmp_path)
    b.hours.step()
    assert b.faults[0]["error"] == "no display is connected (HDMI unplugged?)"
    status.write_text("connected\n")
    b.advance(RETRY_S)
    b.hours.step()
    assert b.hours.applied is True and b.hours.fault is None


def _events(server, kind):
    return [e for e in server.admin("/admin/devices").get("screen-1", {}).get("events", [])
            if e.get("type") == kind]


@pytest.mark.netns
@pytest.mark.x_killed   # its X server on a number no other stream's Xvfb takes (conftest)
def test_the_agent_turns_a_real_x_display_off_and_on_and_reports_one_that_is_gone(
        netns, fleet, spawn_agent, agent_python, xvfb, tmp_path):
    """X11's recipe (xset) on a real X server: off by today's exception, on without
    it; then the X server gone while the hours want the display on: the fault the
    server hears."""
    display, x_server = xvfb
    server = fleet()
    today = time.strftime("%Y-%m-%d")
    commands = {"display_on_command": f"xset -display {display} s reset dpms force on",
                "display_off_command": f"xset -display {display} dpms force off"}

    def run(exceptions):
        hours = {"week": ["mon-sun 00:00-24:00"], "exceptions": exceptions, "clock": "trusted"}
        return spawn_agent(agent_python, agent_config(server, tmp_path, hours=hours,
                                                      commands=commands))

    def stop(agent):
        agent.proc.terminate()
        assert agent.proc.wait(10) == 0

    agent = run([f"{today} off"])
    agent.wait_live(15)
    states = lambda: [e["state"] for e in _events(server, "display.scheduled")]  # noqa: E731
    # (waits, not bounds: three test streams share 2 cores with a booted Debian)
    wait_for(lambda: states() == ["off"], 30, what="display.scheduled off")
    # the status file is written after the event is sent: wait for it as well
    wait_for(lambda: (agent.status().get("hours") or {}).get("applied") == "off", 15,
             what="status hours applied off")
    # read back from the X server the off command named (agent/screen/): Xvfb has no
    # DPMS extension, so `xset dpms force off` exited 0 and did nothing; the agent says so
    off = _events(server, "display.scheduled")[0]
    assert off["confirmed"] is False and "X11 DPMS: the X server has no DPMS" in off["why"], off
    assert agent.status()["hours"]["read_back"].startswith(
        "unconfirmed: nothing here reads the display: ")
    stop(agent)
    agent = run([])
    wait_for(lambda: states() == ["off", "on"], 30, what="display.scheduled on")
    stop(agent)
    x_server.kill()
    x_server.wait()
    agent = run([])
    fault = wait_for(lambda: _events(server, "display.fault"), 30, what="display.fault")
    assert fault[0]["wanted"] == "on" and "unable to open display" in fault[0]["error"]
    wait_for(lambda: (agent.status().get("hours") or {}).get("fault") == fault[0]["error"], 15,
             what="status hours fault")
