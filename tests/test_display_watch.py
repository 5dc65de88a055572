"""The display watched between commands (agent/screen/core.py's DisplayState, the shell
display_watch.py): the rule on a fake clock; the real DRM source on sysfs fixture paths
(an injected root), written by hand outside the watch; the udev watcher's hotplug
reaching it; the real agent telling display.changed once, within display_every_s, and
saying it in status and the metrics."""
import time

import pytest

from agent.app import status
from agent.events.model import Event
from agent.events.outbox import Outbox
from agent.events.watcher import EventWatcher, SysfsState
from agent.metrics.core import gauges_of
from agent.screen.core import (DISCONNECTED, HOTPLUG_SETTLE_S, OFF, ON, DisplayChanged,
                               DisplayState, Read, Reading, display_state)
from agent.screen.display_watch import DisplayWatch
from agent.screen.sources import Drm
from devtools.harness import agent_config, wait_for
from tests.test_screen import connector

DRM_ON = Reading("DRM", ON, "card0-HDMI-A-1 enabled, On")
DRM_OFF = Reading("DRM", OFF, "card0-HDMI-A-1 enabled, Off")
UNPLUGGED = Reading("DRM", None, "no connector is connected")
CEC_STANDBY = Reading("CEC", OFF, "standby")
CEC_FAILED = Reading("CEC", None, "cec-ctl timed out after 5 s")
NO_X = Reading("X11 DPMS", None, "no X display to ask", present=False)


def test_the_readings_say_one_state():
    assert display_state((DRM_ON, NO_X)) == ON
    assert display_state((DRM_ON, CEC_STANDBY)) == OFF    # a TV in standby shows nothing
    assert display_state((UNPLUGGED, CEC_STANDBY)) == DISCONNECTED
    assert display_state((CEC_FAILED, NO_X)) == "unknown"
    assert display_state(()) == "unknown"


def test_a_change_is_told_once_the_first_state_and_a_reading_that_cannot_tell_are_not():
    core = DisplayState(60.0)
    assert core.due == 0.0                                     # read at once
    assert core.handle(Read((DRM_ON,), 10.0)) == [] and core.state == ON
    assert core.due == 70.0
    assert core.handle(Read((DRM_ON,), 70.0)) == []
    assert core.handle(Read((CEC_FAILED,), 130.0)) == [] and core.state == ON
    [told] = core.handle(Read((DRM_ON, CEC_STANDBY), 190.0))
    assert told == DisplayChanged(OFF, ON, "DRM: card0-HDMI-A-1 enabled, On; CEC: standby")
    assert core.handle(Read((DRM_OFF, CEC_STANDBY), 250.0)) == []   # still off: nothing
    assert core.since == 190.0 and core.state_read.endswith("CEC: standby")
    [unplugged] = core.handle(Read((UNPLUGGED,), 260.0))
    assert (unplugged.state, unplugged.was) == (DISCONNECTED, OFF)


def test_a_burst_of_hotplugs_is_one_read_soon_after():
    core = DisplayState(60.0)
    core.handle(Read((DRM_ON,), 0.0))
    for t in (5.0, 5.1, 5.3):
        core.hotplug(t)
    assert core.due == 5.0 + HOTPLUG_SETTLE_S
    core.handle(Read((UNPLUGGED,), core.due))
    assert core.due == 6.0 + 60.0
    core.hotplug(100.0)       # never later than it was due
    assert core.due == 66.0


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_the_real_drm_source_on_a_fixture_tree_is_told_once_and_said_by_the_board(tmp_path):
    root = tmp_path / "sys"
    connector(root)
    told, refreshed, clock = [], [], Clock()
    watch = DisplayWatch([Drm(str(root))], 60.0, publish=told.append,
                         on_change=lambda: refreshed.append(1), clock=clock)
    watch.check()
    assert told == [] and refreshed == [1] and watch.snapshot()["state"] == ON
    clock.now += 60
    watch.check()
    assert told == [] and refreshed == [1]          # nothing changed: nothing said
    connector(root, dpms="Off")                     # DPMS asleep, by hand
    clock.now += 60
    watch.check()
    [event] = told
    assert event.type == "display.changed" and event.details == {
        "state": OFF, "was": ON, "read": "DRM: card0-HDMI-A-1 enabled, Off"}
    connector(root, status="disconnected")          # the cable pulled
    clock.now += 5
    watch.dark = lambda: "off by working hours"
    watch.check()
    assert told[-1].details["state"] == DISCONNECTED
    assert told[-1].details["meant_dark"] == "off by working hours"
    assert len(told) == 2 and refreshed == [1, 1, 1]
    snap = watch.snapshot()
    assert snap == {"state": DISCONNECTED, "since_s": 0.0, "every_s": 60.0,
                    "read": "DRM: no connector is connected"}


def test_the_udev_watcher_tells_the_screen_of_a_connector_that_changed(tmp_path):
    root = str(tmp_path)
    connector(tmp_path, name="card1-HDMI-A-1")
    plugged = []
    w = EventWatcher(Outbox(), sysfs=SysfsState(root), settle_s=0.1,
                     on_display=lambda: plugged.append(1))
    w.scan(0.0, baseline=True)
    assert plugged == []
    connector(tmp_path, name="card1-HDMI-A-1", status="disconnected")
    w.scan(1.0)
    w.scan(1.5)
    assert plugged == [1]


def test_status_and_the_metrics_say_the_display_as_last_read():
    doc = {"pid": 1, "link": {"state": "online"}, "screen": {"watched": {
        "state": OFF, "since_s": 120.0, "every_s": 60.0, "read": "X11 DPMS: Off",
        "meant_dark": "off by working hours"}}}
    text = status.render(doc, True)
    assert ("display now off for 2 min, meant dark: off by working hours (X11 DPMS: Off); "
            "read every 60 s and at each hotplug") in text, text
    gauges = {labels: value for name, labels, value in gauges_of(doc) if name == "display_state"}
    assert gauges == {(("state", "on"),): 0.0, (("state", "off"),): 1.0,
                      (("state", "disconnected"),): 0.0, (("state", "unknown"),): 0.0}
    assert not [g for g in gauges_of({"screen": None}) if g[0] == "display_state"]


def events(server, kind):
    return [e for e in server.admin("/admin/devices").get("screen-1", {}).get("events", [])
            if e.get("type") == kind]


@pytest.mark.netns
def test_the_agent_notices_a_display_switched_off_by_hand_within_display_every_s(
        netns, fleet, spawn_agent, agent_python, xvfb_pictures, tmp_path):
    """A real agent on a real X server, its DRM connector a fixture tree written by hand
    (no command of the agent's): noticed within one display_every_s, told once."""
    sys_root = tmp_path / "sys"
    dpms = connector(sys_root) / "dpms"
    server = fleet()
    agent = spawn_agent(agent_python, agent_config(
        server, tmp_path, screen={"x_display": xvfb_pictures, "display_every_s": 1.0,
                                  "picture_every_s": 0},
        debug={"sysfs_root": str(sys_root)}))
    agent.wait_live(15)
    wait_for(lambda: ((agent.status().get("screen") or {}).get("watched") or {}).get(
        "state") == ON, 10, what="the display read on")
    dpms.write_text("Off\n")
    changed_at = time.monotonic()
    told = wait_for(lambda: events(server, "display.changed"), 10, interval=0.05,
                    what="display.changed")
    took = time.monotonic() - changed_at
    print(f"\ndisplay.changed at the server {took:.2f} s after the change (every 1 s)")
    assert took < 1.0 + 1.5, took   # one display_every_s, and the way to the server
    assert told[0]["state"] == OFF and told[0]["was"] == ON, told
    assert "DRM: card0-HDMI-A-1 enabled, Off" in told[0]["read"], told
    assert agent.status()["screen"]["watched"]["state"] == OFF
    assert "display now off for" in status.render(agent.status(), True)
    time.sleep(3)                                    # three reads more, the same state
    assert len(events(server, "display.changed")) == 1
    assert time.monotonic() - changed_at > 3
