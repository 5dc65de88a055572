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
import tempfile
from pathlib import Path

import pytest

from agent.config.model import Commands, Screen as ScreenSection
from agent.screen import service as screen_service
from agent.screen.core import OFF
from agent.screen.picture import BLACK, OK
from agent.screen.sources import Runner, Wayland
from agent.screen.watch import from_config
from tests.conftest import DESKTOP_UID
from tests.test_picture_content import Clock, dim_text, starfield
from tests.test_steps import run_stepped

AGENT_UID = 64123        # the agent's user: neither root nor the desktop's
# docs/operate.md's Wayland recipe, the desktop's side: its autostart, run at every start
# of the compositor, links the compositor's socket (a new one at each start) into a 0700
# directory of the runtime directory's that it grants the agent, and the socket's rw; the
# runtime directory itself gets no ACL: its other sockets stay the desktop user's
DESKTOP_GRANT = ('mkdir -p -m 0700 "$XDG_RUNTIME_DIR/edge-agent"\n'
                 'ln -f "$XDG_RUNTIME_DIR/$WAYLAND_DISPLAY" "$XDG_RUNTIME_DIR/edge-agent/"\n'
                 'setfacl -m u:edge-agent:x "$XDG_RUNTIME_DIR/edge-agent"\n'
                 'setfacl -m u:edge-agent:rw "$XDG_RUNTIME_DIR/edge-agent/$WAYLAND_DISPLAY"\n')


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
    # the same read-back a look at a time, as the commands thread drives a display
    # command's: wlr-randr's answers judged alike
    stepped = run_stepped(screen.reading_back(OFF))
    assert stepped.said() == verdict.said(), (stepped.said(), verdict.said())
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


# python3 -c CONNECT PATH prints "connected" or the errno's name of connect() to PATH
CONNECT = ("import errno, socket, sys\n"
           "s = socket.socket(socket.AF_UNIX)\n"
           "try:\n    s.connect(sys.argv[1]); print('connected')\n"
           "except OSError as e:\n    print(errno.errorcode[e.errno])\n")


def listening_socket(path, mode: int, owner: int):
    """A unix socket listening at path, as a desktop's daemon leaves one (PipeWire's
    pipewire-0 is 0666: its own mode admits every user who can reach it)."""
    import socket as sockets
    sock = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(4)
    os.chmod(path, mode)
    os.chown(path, owner, owner)
    return sock


def connect_as(uid: int, path) -> str:
    """connect() to the unix socket at path as uid: "connected" or the errno's name."""
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                           "/usr/bin/python3", "-c", CONNECT, str(path)], capture_output=True,
                          text=True, check=True, timeout=10).stdout.strip()


def test_an_agent_of_another_user_reaches_the_desktop_only_with_the_acl_grant(
        wayland_desktop, tmp_path_factory):
    """The recipe, without systemd: the capture run as the agent's user (a
    capture_command that is grim under setpriv) in a mount namespace where the desktop's
    edge-agent directory is bound read-only where the unit's drop-in binds it. It fails
    while that directory is the desktop user's 0700 alone, and works once the desktop's
    autostart has linked the socket there and granted it. The desktop's other sockets
    stay out of reach: a 0666 one beside the compositor's (PipeWire's pipewire-0, the
    microphone) is refused to the agent's user, at its path and through the bind."""
    if shutil.which("setfacl") is None:
        pytest.fail("this test needs setfacl (.ci/run installs acl)")
    runtime = wayland_desktop.runtime
    shared = runtime / "edge-agent"
    # the unit's runtime directory (0755), where the drop-in binds the desktop's
    bound = Path(tempfile.mkdtemp(prefix="edge-agent-unit-")) / "desktop"
    bound.parent.chmod(0o755)
    bound.mkdir()
    env = {**wayland_desktop.env, "XDG_RUNTIME_DIR": str(bound)}
    desktop = ["setpriv", f"--reuid={DESKTOP_UID}", f"--regid={DESKTOP_UID}", "--clear-groups"]
    pipewire = listening_socket(runtime / "pipewire-0", 0o666, DESKTOP_UID)
    try:
        assert connect_as(DESKTOP_UID, runtime / "pipewire-0") == "connected"
        # the bind needs its source at the unit's start: user-runtime-dir@1000's drop-in
        # makes it with the runtime directory, as the desktop's user (docs/operate.md)
        subprocess.run([*desktop, "mkdir", "-p", "-m", "0700", str(shared)], check=True)
        in_unit = (f"unshare --mount sh -c 'mount --bind \"$1\" \"$2\" && "
                   f"mount -o remount,bind,ro \"$2\" && shift 2 && exec \"$@\"' unit "
                   f"{shared} {bound} setpriv --reuid={AGENT_UID} --regid={AGENT_UID} "
                   f"--clear-groups ")
        wayland_desktop.show(starfield())
        w, _ = watch_of(env, capture_command=in_unit + f"{shutil.which('grim')} -t ppm -")
        w.check()
        assert w.snapshot()["failure"] is not None and w.snapshot()["verdict"] is None
        assert "failed to create display" in w.snapshot()["failure"], w.snapshot()
        grant = DESKTOP_GRANT.replace("u:edge-agent:", f"u:{AGENT_UID}:")
        subprocess.run([*desktop, "sh", "-ec", grant], env=wayland_desktop.env, check=True)
        w.clock.now += 60
        w.check()
        assert w.snapshot()["verdict"] == OK and w.snapshot()["failure"] is None, w.snapshot()
        acl = subprocess.run(["getfacl", "-p", str(runtime)], capture_output=True, text=True,
                             check=True).stdout.splitlines()
        assert [e for e in acl if e.startswith("user:") and not e.startswith("user::")] == [], \
            acl                                  # the runtime directory itself: no ACL
        assert connect_as(AGENT_UID, runtime / "pipewire-0") == "EACCES"
        assert connect_as(AGENT_UID, runtime / env["WAYLAND_DISPLAY"]) == "EACCES"
    finally:
        pipewire.close()
        shutil.rmtree(bound.parent, ignore_errors=True)


def test_the_grant_tested_here_is_the_one_operate_md_gives():
    recipe = (Path(__file__).parent.parent / "docs/operate.md").read_text()
    for line in DESKTOP_GRANT.splitlines():
        assert f"`{line}`" in recipe, line
