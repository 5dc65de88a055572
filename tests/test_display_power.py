"""The display's power has one owner, the screen part (agent/screen/power.py): the
display command, the working hours and the recovery ladder's wake each turn it there,
one turn at a time, each read back; what the display is meant to be (off by the hours,
off by a command) is known there too. Real commands writing a file; the ladder on a
fake clock."""
import os
import stat
import threading
import time
from datetime import datetime
from types import SimpleNamespace

import pytest

from agent.base.steps import Until
from agent.commands.actions import Actions
from agent.commands.core import LATER
from agent.config import load as cfgmod
from agent.config.week import Schedule
from agent.hours.service import WorkingHours
from agent.screen import part as screen_part
from agent.screen.core import OFF, ON, Reading, Verdict
from agent.screen.power import DisplayPower
from tests.test_steps import display_command


class FakeReadBack:
    """A read-back that says what it read in the same log the commands write."""

    bound_s = 1.0

    def __init__(self, log):
        self.log = log

    def reading_back(self, state):
        """As screen/service.py's: a job whose settle is a wait the driver does."""
        with open(self.log, "a") as f:
            f.write(f"read-{state}\n")
        yield Until(time.monotonic() + 0.1, time.monotonic)
        return Verdict(state, True, (Reading("DRM", state, state.title()),))

    def snapshot(self):
        return None

    def stop(self):
        pass


def slow(log, state):
    """A display command that takes its time, its start and end in the log."""
    return f"sh -c 'echo start-{state} >> {log}; sleep 0.4; echo end-{state} >> {log}'"


@pytest.mark.parametrize("driven", ["stepped", "whole"])
def test_a_scheduled_off_and_a_command_on_at_once_are_turned_one_after_the_other(tmp_path,
                                                                                   driven):
    """The working hours turn the display off as a display command turns it on: each
    command runs and is read back before the other's starts (two owners interleaved
    them: start-off, start-on, end-off, ...; the read-back judged the other's). The
    command's turn driven a look at a time (the commands thread) or whole."""
    log = tmp_path / "display"
    events, changes, faults = [], [], []
    power = DisplayPower(slow(log, ON), slow(log, OFF), 5.0, FakeReadBack(log), events.append,
                         sysfs_root=str(tmp_path / "nosys"), connect_grace_s=0)
    evening = datetime.fromisoformat("2026-12-07 20:00").timestamp()   # a Monday: off
    hours = WorkingHours(Schedule.parse(["mon-fri 08:00-18:00"], []), None, power,
                         trust_clock=True, on_fault=faults.append, on_change=changes.append,
                         now=lambda: evening)
    actions = Actions(SimpleNamespace(timeout_s=5.0), "http://fleet.invalid", snapshot=dict,
                      link_socket=lambda: None, request_restart=lambda: None,
                      enqueue=lambda *a: "x", power=power)
    together = threading.Barrier(2)
    answered = {}

    def command():
        together.wait()
        answered["on"] = display_command(actions, ON, driven)

    def scheduled():
        together.wait()
        hours.step()
    threads = [threading.Thread(target=command), threading.Thread(target=scheduled)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    seen = log.read_text().split()
    turns = [seen[i:i + 3] for i in range(0, len(seen), 3)]
    assert sorted(turns) == [["start-off", "end-off", "read-off"],
                             ["start-on", "end-on", "read-on"]], seen
    assert answered["on"].ok and answered["on"].output == "display on: confirmed by DRM (On)"
    assert faults == [] and changes == [{"state": "off", "by": "working hours",
                                         "confirmed": True, "confirmed_by": ["DRM"],
                                         "read": "DRM: Off"}]
    # the command's read-back is told as display.read_back; the hours' in their own event
    assert [(e.type, e.details["state"]) for e in events] == [("display.read_back", ON)]
    # what it is meant to be now: off by the hours, whoever turned it last
    assert power.meant == seen[-1].split("-")[1]
    assert power.meant_dark() == "off by working hours"


def config_of(tmp_path, commands, screen=""):
    path = tmp_path / "agent.toml"
    path.write_text(f'[server]\nurl = "http://fleet.invalid"\n[commands]\n{commands}\n'
                    f'[screen]\n{screen}\n')
    return cfgmod.load(str(path), {})


def test_the_ladders_wake_is_a_turn_of_the_displays_owner_and_a_display_meant_dark_holds_it(
        tmp_path):
    """The screen part as the daemon builds it: a black picture, twice and for the
    confirm time (a fake clock), and the ladder's wake runs the display's on command
    through the owner, read back and told; the hours' off, said to the owner, holds the
    ladder before anything is done."""
    log = tmp_path / "display"
    config = config_of(tmp_path, f"display_on_command = \"sh -c 'echo on >> {log}'\"\n"
                                 f"display_off_command = \"sh -c 'echo off >> {log}'\"",
                       "recovery = true\npicture_every_s = 0\ndisplay_every_s = 0")
    events = []
    part = screen_part.assemble(config, sysfs=str(tmp_path / "nosys"),
                                environ={"PATH": str(tmp_path)}, runtime_dir=str(tmp_path),
                                publish=events.append, enqueue=lambda *a: None, gate=None)
    now = [1000.0]
    mender = part.mender
    mender.clock = lambda: now[0]

    def black_for(seconds):
        for _ in range(2):
            mender.on_picture("black")
            mender.step()
            now[0] += seconds

    part.power.schedule(OFF)   # the working hours have it off: a black picture is dark
    black_for(60.0)
    assert not log.exists() and mender.ladder.state == "watching"
    assert part.dark() == "off by working hours"
    part.power.schedule(ON)
    black_for(31.0)
    mender.on_picture("black")
    mender.step()
    assert log.read_text() == "on\n", "the wake ran the owner's on command, once"
    assert part.power.meant == ON and part.dark() is None
    told = [(e.type, e.details.get("state") or e.details.get("rung")) for e in events]
    assert ("display.read_back", ON) in told and ("screen.recovery", "wake-display") in told
    wake = next(e for e in events if e.type == "screen.recovery")
    assert wake.details["said"].startswith("display on: unconfirmed: nothing here reads "
                                           "the display"), wake.details


def test_a_display_turned_off_by_a_command_is_meant_dark_until_it_is_turned_on(tmp_path):
    power = DisplayPower("true", "true", 5.0, None, lambda event: None)
    assert power.meant_dark() is None
    assert power.turn(OFF).outcome == "done" and power.meant_dark() == (
        "turned off by a display command")
    failed = DisplayPower("true", "false", 5.0, None, lambda event: None)
    assert failed.turn(OFF).error == "false exited 1" and failed.meant_dark() is None
    assert power.turn(ON).ok and power.meant_dark() is None


def fake_systemctl(tmp_path, monkeypatch, exit_code, said=""):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    asked = tmp_path / "asked"
    script = bin_dir / "systemctl"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {asked}\necho '{said}' >&2\nexit {exit_code}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return asked


def test_the_ladder_reboots_as_the_reboot_command_does(tmp_path, monkeypatch):
    """One home for how this device reboots (base/boot.py): logind asked, in the same
    words, by the reboot command and by the ladder's last rung."""
    config = config_of(tmp_path, 'allow = ["reboot"]', "recovery = true\npicture_every_s = 0")
    part = screen_part.assemble(config, sysfs=str(tmp_path / "nosys"), environ={},
                                runtime_dir=str(tmp_path), publish=lambda e: None,
                                enqueue=lambda *a: None, gate=None)
    actions = Actions(SimpleNamespace(timeout_s=5.0), "http://fleet.invalid", snapshot=dict,
                      link_socket=lambda: None, request_restart=lambda: None,
                      enqueue=lambda *a: "x")
    asked = fake_systemctl(tmp_path, monkeypatch, 0)
    assert part.mender.reboot_fn() == (True, "logind asked to reboot")
    assert actions.run("reboot", {}) == LATER
    assert asked.read_text().splitlines() == ["reboot --no-ask-password"] * 2
    fake_systemctl(tmp_path, monkeypatch, 1, "Access denied")
    refused = "reboot refused: systemctl exited 1: Access denied"
    assert part.mender.reboot_fn() == (False, refused)
    assert actions.run("reboot", {}).error == refused


def test_a_stop_while_the_commands_thread_turns_the_display_kills_its_command(tmp_path):
    """The display's command runs under the commands thread's looks, not on a thread of
    its own: the agent's stop ends the turn at once, its command's whole group killed,
    and the ledger keeps the command as running (told as interrupted at the next
    start, never run again)."""
    from agent.commands.service import CommandService

    marker = tmp_path / "turning"
    pids = tmp_path / "pids"
    off = f"sh -c 'echo $$ > {pids}; sleep 60 & echo $! >> {pids}; touch {marker}; wait'"
    power = DisplayPower("true", off, 120.0, None, lambda event: None,
                         sysfs_root=str(tmp_path / "nosys"))
    actions = Actions(SimpleNamespace(timeout_s=120.0), "http://fleet.invalid", snapshot=dict,
                      link_socket=lambda: None, request_restart=lambda: None,
                      enqueue=lambda *a: "x", power=power)
    actions.run = lambda *a, **k: pytest.fail("the display ran on the executor")
    service = CommandService(str(tmp_path / "commands.json"), frozenset({"display"}),
                             actions, str(tmp_path))
    service.start()
    try:
        recorded = threading.Event()
        service.serve({"id": "c-1", "name": "display", "args": {"state": OFF}}, recorded.set)
        assert recorded.wait(5)
        deadline = time.monotonic() + 10
        while not marker.exists():
            assert time.monotonic() < deadline, "the display's command never started"
            time.sleep(0.05)
        running = [int(p) for p in pids.read_text().split()]
        t0 = time.monotonic()
        service.stop()
        service.loop.join(5)
        took = time.monotonic() - t0
    finally:
        service.stop()
    assert not service.loop._thread.is_alive() and took < 2.0, took
    time.sleep(0.2)
    alive = [pid for pid in running if os.path.exists(f"/proc/{pid}")
             and "Z" not in open(f"/proc/{pid}/stat").read().split()[2]]
    assert alive == [], f"still running after the stop: {alive}"
    assert service.core.entries["c-1"].state == "running"
    assert power._turning.acquire(blocking=False), "the turn's lock was left held"
