"""Raspberry Pi OS's desktop is Wayland (issue #52.2): the picture check (grim) and the
read-back (wlr-randr) against a real headless wlroots compositor, sway 1.7 (bookworm's),
run as another user in a runtime directory of its own (0700): what Debian 12 ships.
Trixie's labwc, turned off and on and reached under the unit's sandbox, is in the
booted tier (tests/test_booted_systemd.py).

- a real capture is judged: the output filled black is black, dark content shown by the
  desktop's own client (swaybg: a starfield, dim text on near-black) is not, and an
  empty sway desktop is its own grey (0.25), not black;
- sway 1.7 says (wlr-output-management) that an output of a custom size, as every
  headless, nested or virtual one is, is disabled, with one mode of 0x0, whatever it
  shows; it cannot turn such an output off (wlr-randr --off exits 1): the read-back
  says it cannot tell, never "off" for a lit screen;
- the recipe's grant: an agent of another user reaches the socket only once the
  desktop's user has given it, with ACLs, the runtime directory's x and the socket's rw.
"""
import os
import shutil
import subprocess

import pytest

from agent.config.model import Commands, Screen as ScreenSection
from agent.screen import service as screen_service
from agent.screen.core import OFF
from agent.screen.picture import BLACK, OK
from agent.screen.sources import Runner, Wayland
from agent.screen.watch import from_config
from tests.test_picture_content import Clock, dim_text, starfield

AGENT_UID = 64123        # the agent's user: neither root nor the desktop's


def watch_of(env, **section):
    events = []
    w = from_config(ScreenSection(**section), Commands(frozenset(), None, None, None, 10.0),
                    env, dark=lambda: None, publish=events.append)
    w.clock = Clock()
    return w, events


def test_a_real_capture_is_judged_black_filled_black_and_ok_with_dark_content(wayland_desktop):
    w, events = watch_of(wayland_desktop.env)
    assert w.capture.how == "grim"
    w.check()      # nothing drawn: sway's own clear colour, a grey of 0.25
    snap = w.snapshot()
    assert snap["failure"] is None and snap["verdict"] == OK and snap["bright"] == 63, snap
    for picture in (starfield(), dim_text()):
        wayland_desktop.show(picture)
        w.clock.now += 60
        w.check()
        assert w.snapshot()["verdict"] == OK, w.snapshot()
    wayland_desktop.show("#000000")
    w.clock.now += 60
    w.check()
    snap = w.snapshot()
    assert snap["verdict"] == BLACK and snap["bright"] == 0, snap
    assert [e.type for e in events] == ["screen.black"]


def test_sway_17_says_a_lit_headless_output_is_disabled_the_read_back_cannot_tell(
        wayland_desktop):
    wayland_desktop.show(starfield())
    truth = wayland_desktop.swaymsg("-t", "get_outputs", "-r").stdout
    assert '"active": true' in truth and '"dpms": true' in truth, truth
    said = subprocess.run(["wlr-randr"], env=wayland_desktop.env, capture_output=True,
                          text=True).stdout
    assert "HEADLESS-1" in said and "Enabled: no" in said and "0x0 px" in said, said
    reading = Wayland(wayland_desktop.env, Runner()).read()
    assert reading.state is None and reading.present, reading
    assert reading.said.startswith("HEADLESS-1 reads disabled with no mode of any size"), \
        reading


def test_display_off_that_sway_17_refuses_is_not_confirmed_off(wayland_desktop):
    wayland_desktop.show(starfield())
    off = subprocess.run(["wlr-randr", "--output", "HEADLESS-1", "--off"],
                         env=wayland_desktop.env, capture_output=True, text=True)
    assert off.returncode == 1 and "failed to apply" in off.stderr, off
    runner = Runner()
    screen = screen_service.Screen([Wayland(wayland_desktop.env, runner)], 0.5, runner)
    verdict = screen.read_back(OFF)
    assert not verdict.confirmed, verdict.said()
    w, _ = watch_of(wayland_desktop.env)
    w.check()                                   # the screen still shows its stars
    assert w.snapshot()["verdict"] == OK, w.snapshot()


def test_grim_that_cannot_reach_the_compositor_is_a_failure_in_its_own_words(
        wayland_desktop):
    env = {**wayland_desktop.env, "WAYLAND_DISPLAY": "wayland-9"}
    w, events = watch_of(env)
    w.check()
    snap = w.snapshot()
    assert snap["verdict"] is None and snap["failures"] == 1, snap
    assert snap["failure"].startswith("grim exited 1") and \
        "failed to create display" in snap["failure"], snap


def test_an_agent_of_another_user_reaches_the_desktop_only_with_the_acl_grant(
        wayland_desktop):
    """The recipe's grant, without systemd: the capture run as the agent's user (a
    capture_command that is grim under setpriv) fails on the 0700 runtime directory,
    and works once the desktop's user grants the directory's x and the socket's rw."""
    if shutil.which("setfacl") is None:
        pytest.fail("this test needs setfacl (.ci/run installs acl)")
    env, runtime = wayland_desktop.env, wayland_desktop.runtime
    socket = runtime / env["WAYLAND_DISPLAY"]
    as_agent = (f"setpriv --reuid={AGENT_UID} --regid={AGENT_UID} --clear-groups "
                f"{shutil.which('grim')} -t ppm -")
    wayland_desktop.show(starfield())
    w, _ = watch_of(env, capture_command=as_agent)
    w.check()
    assert w.snapshot()["failure"] is not None and w.snapshot()["verdict"] is None
    assert "failed to create display" in w.snapshot()["failure"], w.snapshot()
    for path, perms in ((runtime, "x"), (socket, "rw")):
        subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                        "setfacl", "-m", f"u:{AGENT_UID}:{perms}", str(path)], check=True)
    w.clock.now += 60
    w.check()
    assert w.snapshot()["verdict"] == OK and w.snapshot()["failure"] is None, w.snapshot()
