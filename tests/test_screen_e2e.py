"""The screen part in the running agent, against the reference fleet server and the
real ScreenTinker 1.9: a real X server (Xvfb) shows what the test draws, the agent
captures it with ImageMagick and judges it; the verdicts reach the server as events
and 1.9's incident feed, and `edge-agent status` says what the screen shows."""
import time

import pytest

from agent.app import status
from devtools.harness import agent_config, wait_for
from tests.test_picture import draw, xbm
from tests.test_screentinker_real import (device_events, generation, only_19,  # noqa: F401
                                          register_and_pair, st, st_config)

pytestmark = pytest.mark.netns


def events(server, kind):
    return [e for e in server.admin("/admin/devices").get("screen-1", {}).get("events", [])
            if e.get("type") == kind]


def test_a_black_screen_is_told_once_and_a_lit_one_brings_ok(
        netns, fleet, spawn_agent, agent_python, xvfb_pictures, tmp_path):
    display = xvfb_pictures
    draw(display, "-solid", "black")
    server = fleet()
    agent = spawn_agent(agent_python, agent_config(
        server, tmp_path, screen={"x_display": display, "picture_every_s": 0.5}))
    agent.wait_live(15)
    black = wait_for(lambda: events(server, "screen.black"), 15, what="screen.black")
    assert black[0]["mean"] < 16 and black[0]["captured_by"].startswith("xwd"), black
    picture = agent.status()["screen"]["picture"]
    assert picture["verdict"] == "black" and picture["every_s"] == 0.5, picture
    draw(display, "-bitmap", xbm(tmp_path / "lit.xbm", 32, 12), "-fg", "white", "-bg", "#202020")
    ok = wait_for(lambda: events(server, "screen.ok"), 15, what="screen.ok")
    assert ok[0]["was"] == "black"
    assert len(events(server, "screen.black")) == 1   # told on change, never per look
    assert "picture     ok" in status.render(agent.status(), True)


@only_19
def test_a_black_screen_is_an_incident_in_screentinker_1_9s_feed(
        st, spawn_agent, agent_python, xvfb_pictures, tmp_path):
    display = xvfb_pictures
    draw(display, "-solid", "black")
    agent = spawn_agent(agent_python, st_config(
        st, tmp_path, screen={"x_display": display, "picture_every_s": 0.5}))
    device_id = register_and_pair(st, agent, tmp_path)
    agent.wait_live(15)
    rows = wait_for(lambda: [r for r in device_events(st, device_id)
                             if r["type"] == "app_error"], 20, what="the incident row")
    assert rows[0]["reason"] == "screen black" and "mean" in rows[0]["detail"], rows


def picture_line(agent) -> str:
    said = status.render(agent.status(), True)
    assert "None" not in said, said
    return next(line for line in said.splitlines() if line.startswith("picture"))


def test_status_says_each_look_as_it_stands_and_dark_from_the_moment_it_is(
        netns, fleet, spawn_agent, agent_python, xvfb_pictures, tmp_path):
    """The picture's line is the last look's, not the last event's: a night scene and a
    bright board are both ok (no event between them), and status shows the board's
    numbers within a look or two; its "checked N s ago" never grows past the pace; a
    display turned off by a command is dark at once, not at the next look."""
    display = xvfb_pictures
    draw(display, "-bitmap", xbm(tmp_path / "night.xbm", 32, 12), "-fg", "#303030",
         "-bg", "black")
    server = fleet()
    agent = spawn_agent(agent_python, agent_config(
        server, tmp_path, screen={"x_display": display, "picture_every_s": 0.5},
        commands={"allow": ["display"], "display_off_command": "true",
                  "display_on_command": "true"}))
    agent.wait_live(15)
    night = wait_for(lambda: (agent.status().get("screen") or {}).get("picture", {}).get(
        "mean") is not None and agent.status()["screen"]["picture"], 15, what="a first look")
    assert night["verdict"] == "ok" and night["mean"] < 16, night
    draw(display, "-solid", "white")
    board = wait_for(lambda: (lambda p: p if p["mean"] > 200 else None)(
        agent.status()["screen"]["picture"]), 3, interval=0.1, what="the board's numbers")
    assert board["verdict"] == "ok", board
    assert not events(server, "screen.black")
    for _ in range(15):   # 3 s of reads: the last look is never older than the pace allows
        line = picture_line(agent)
        ago = float(line.split("checked ")[1].split(" s ago")[0])
        assert ago <= 2, line
        time.sleep(0.2)
    cid = server.admin("/api/v1/commands", {"device_id": "screen-1", "name": "display",
                                            "args": {"state": "off"}})["id"]
    wait_for(lambda: server.admin("/api/v1/devices/screen-1/commands")[cid]["result"], 15,
             interval=0.05, what="the display command's result")
    line = picture_line(agent)
    assert line.startswith("picture     dark") and "turned off by a display command" in line, line


@only_19
def test_a_display_switched_off_by_hand_is_a_display_off_in_screentinker_1_9s_feed(
        st, spawn_agent, agent_python, xvfb_pictures, tmp_path):
    """Nobody's command: the DRM connector (a fixture tree) reads Off, written by hand."""
    from tests.test_screen import connector
    sys_root = tmp_path / "sys"
    dpms = connector(sys_root) / "dpms"
    agent = spawn_agent(agent_python, st_config(
        st, tmp_path, screen={"x_display": xvfb_pictures, "display_every_s": 0.5,
                              "picture_every_s": 0}, debug={"sysfs_root": str(sys_root)}))
    device_id = register_and_pair(st, agent, tmp_path)
    agent.wait_live(15)
    wait_for(lambda: ((agent.status().get("screen") or {}).get("watched") or {}).get(
        "state") == "on", 10, what="the display read on")
    dpms.write_text("Off\n")
    rows = wait_for(lambda: [r for r in device_events(st, device_id)
                             if r["type"] == "display_off"], 20, what="the incident row")
    assert rows[0]["reason"] == "display off, not by the agent", rows
    assert "DRM: card0-HDMI-A-1 enabled, Off" in rows[0]["detail"], rows
