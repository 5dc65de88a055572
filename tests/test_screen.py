"""The display's state read back after a display command (agent/screen/): the core on a
fake clock, each source's words, the DRM connector in a fake sysfs tree, and a real X
server (Xvfb) asked with `xset q` (it has no DPMS extension: said so), and the real agent
answering a display command with what it read back."""
import shutil
import time
from types import SimpleNamespace

import pytest

from agent.commands.actions import Actions
from agent.config import load as cfgmod
from agent.config.model import Screen as ScreenSection
from agent.config.week import Schedule
from agent.hours.service import WorkingHours
from agent.screen import service as screen_service
from agent.screen.power import DisplayPower
from agent.screen.core import (OFF, ON, Asked, Mend, Mended, Read, ReadAt, ReadBack, Reading,
                               Stopped, Verdict)
from agent.screen.sources import Cec, Drm, Wayland, X11Dpms
from devtools.harness import agent_config, wait_for
from tests.test_steps import display_command

EVERY = {"DRM": 0.5, "X11 DPMS": 0.5, "CEC": 2.0}


def said(source, state, words="", present=True):
    return Reading(source, state, words or str(state), present)


# -- the core, on a fake clock --------------------------------------------------------
def test_off_is_confirmed_by_the_first_source_that_reads_off():
    core = ReadBack(EVERY, settle_s=10)
    assert core.handle(Asked(OFF, 100.0)) == [ReadAt(100.0, ("DRM", "X11 DPMS", "CEC"))]
    [verdict] = core.handle(Read((said("DRM", ON, "card0-HDMI-A-1 enabled, On"),
                                  said("X11 DPMS", OFF, "Off"), said("CEC", None, "to-standby")),
                                 100.2))
    assert verdict.confirmed and [r.source for r in verdict.by] == ["X11 DPMS"]
    assert verdict.said() == "confirmed by X11 DPMS (Off)"
    assert verdict.fields() == {"confirmed": True, "confirmed_by": ["X11 DPMS"],
                                "read": "X11 DPMS: Off"}
    assert core.handle(Read((), 101.0)) == [verdict]   # an answer is final


def test_on_waits_while_any_source_reads_off_and_each_source_is_read_at_its_pace():
    core = ReadBack(EVERY, settle_s=10)
    core.handle(Asked(ON, 0.0))
    # the connector is on, the TV still in standby: the picture does not show yet
    effects = core.handle(Read((said("DRM", ON), said("X11 DPMS", ON), said("CEC", OFF)), 0.1))
    assert effects == [ReadAt(0.6, ("DRM", "X11 DPMS"))]     # CEC is asked every 2 s only
    effects = core.handle(Read((said("DRM", ON), said("X11 DPMS", ON)), 0.6))
    assert effects == [ReadAt(1.1, ("DRM", "X11 DPMS"))]
    for now in (1.1, 1.6):
        effects = core.handle(Read((said("DRM", ON), said("X11 DPMS", ON)), now))
    assert effects == [ReadAt(2.1, ("DRM", "X11 DPMS", "CEC"))]
    [verdict] = core.handle(Read((said("DRM", ON), said("X11 DPMS", ON), said("CEC", ON)), 2.1))
    assert verdict.confirmed and [r.source for r in verdict.by] == ["DRM", "X11 DPMS", "CEC"]


def test_a_display_still_in_the_other_state_after_the_settle_is_unconfirmed_and_contrary():
    core = ReadBack({"X11 DPMS": 0.5}, settle_s=2)
    effects = core.handle(Asked(OFF, 0.0))
    now = 0.0
    looks = 0
    while isinstance(effects[0], ReadAt):
        assert effects[0].at <= 2.0, "never read past the settle"
        now = effects[0].at
        looks += 1
        effects = core.handle(Read((said("X11 DPMS", ON, "On"),), now))
    [verdict] = effects
    assert looks == 5 and now == 2.0   # at 0, 0.5, 1, 1.5 and the last look at 2
    assert not verdict.confirmed and verdict.contrary
    assert verdict.why == "the display reads on 2 s after it was turned off: X11 DPMS: On"
    assert verdict.fields() == {"confirmed": False, "why": verdict.why}


def test_sources_that_cannot_tell_leave_it_unconfirmed_but_not_contrary():
    core = ReadBack({"DRM": 0.5, "X11 DPMS": 0.5}, settle_s=1)
    core.handle(Asked(ON, 0.0))
    core.handle(Read((said("DRM", None, "no connector is connected"),
                      said("X11 DPMS", None, "xset exited 1: unable to open display"),), 0.0))
    core.handle(Read((said("DRM", None, "no connector is connected"),
                      said("X11 DPMS", None, "xset exited 1: unable to open display"),), 0.5))
    [verdict] = core.handle(Read((said("DRM", None, "no connector is connected"),
                                  said("X11 DPMS", None, "xset exited 1: unable to open display")),
                                 1.0))
    assert not verdict.confirmed and not verdict.contrary
    assert verdict.why == ("no source read on within 1 s: DRM: no connector is connected; "
                           "X11 DPMS: xset exited 1: unable to open display")


def test_off_with_a_source_on_and_another_that_cannot_tell_is_not_contrary():
    """A TV put in standby over CEC that does not answer a power-status question: the
    HDMI signal is still on, the screen may well be dark. Unconfirmed, not a fault."""
    core = ReadBack({"DRM": 0.5, "CEC": 2.0}, settle_s=0)
    core.handle(Asked(OFF, 0.0))
    [verdict] = core.handle(Read((said("DRM", ON, "card0-HDMI-A-1 enabled, On"),
                                  said("CEC", None, "the TV gave no power status")), 0.0))
    assert not verdict.confirmed and not verdict.contrary
    assert verdict.why == ("no source read off within 0 s: DRM: card0-HDMI-A-1 enabled, On; "
                           "CEC: the TV gave no power status")


def test_a_screen_with_no_source_answers_at_once_and_says_why():
    core = ReadBack(EVERY, settle_s=10)
    core.handle(Asked(OFF, 0.0))
    [verdict] = core.handle(Read((
        said("DRM", None, "no DRM connector in sysfs", present=False),
        said("X11 DPMS", None, "no X display to ask", present=False),
        said("CEC", None, "cec-ctl is not installed (v4l-utils)", present=False)), 0.01))
    assert not verdict.confirmed and not verdict.contrary
    assert verdict.said() == ("unconfirmed: nothing here reads the display: DRM: no DRM "
                              "connector in sysfs; X11 DPMS: no X display to ask; CEC: "
                              "cec-ctl is not installed (v4l-utils)")
    assert ReadBack({}, 5).handle(Asked(ON, 0.0))[0].why == "no source to read the display from"


def test_a_source_that_is_not_there_is_not_read_again_and_a_stop_ends_it():
    core = ReadBack({"DRM": 0.5, "CEC": 2.0}, settle_s=10)
    core.handle(Asked(ON, 0.0))
    effects = core.handle(Read((said("DRM", None, "no connector is connected"),
                                said("CEC", None, "no CEC adapter (/dev/cec0)", present=False)),
                               0.0))
    assert effects == [ReadAt(0.5, ("DRM",))]
    [verdict] = core.handle(Stopped("the agent is stopping"))
    assert verdict == Verdict(ON, False, why="not read back: the agent is stopping")


# -- each source's words -----------------------------------------------------------
XSET_Q = """Keyboard Control:
  auto repeat:  on    key click percent:  0    LED mask:  00000000
DPMS (Energy Star):
  Standby: 600    Suspend: 600    Off: 600
  DPMS is Enabled
  Monitor is {}
"""


def test_each_source_reads_its_tools_words():
    assert X11Dpms.parse(XSET_Q.format("Off")) == Reading("X11 DPMS", OFF, "Off")
    assert X11Dpms.parse(XSET_Q.format("On")) == Reading("X11 DPMS", ON, "On")
    assert X11Dpms.parse(XSET_Q.format("in Standby")).state == OFF
    assert X11Dpms.parse("DPMS (Energy Star):\n  DPMS is Disabled\n").state == ON
    assert X11Dpms.parse("Server does not have the DPMS Extension\n").present is False
    assert Cec.parse("    REPORT_POWER_STATUS (0x90):\n        pwr-state: standby (0x01)\n") \
        == Reading("CEC", OFF, "standby")
    assert Cec.parse("pwr-state: on (0x00)").state == ON
    assert Cec.parse("pwr-state: to-on (0x02)").state is None
    assert Cec.parse("Transmit from Playback Device 1 to TV (4 to 0):\n"
                     "\tTx, Not Acknowledged (4), Max Retries\n").said == \
        "the TV gave no power status (Tx, Not Acknowledged (4), Max Retries)"
    text = ('HDMI-A-1 "Dell Inc."\n  Enabled: no\n  Modes:\n    1920x1080 px\n'
            'DP-1 "x"\n  Enabled: no\n')
    assert Wayland.parse_text(text) == Reading("Wayland", OFF, "HDMI-A-1 disabled; DP-1 disabled")


def test_wayland_outputs_are_read_from_wlr_randr_json_or_its_text_where_it_has_no_json(tmp_path):
    from agent.screen.sources import Runner
    tool = tmp_path / "wlr-randr"
    tool.write_text('#!/bin/sh\n[ "$WAYLAND_DISPLAY" = wayland-1 ] || exit 9\n'
                    'echo \'[{"name": "HDMI-A-1", "enabled": true}, {"name": "DP-1", '
                    '"enabled": true}]\'\n')
    tool.chmod(0o755)
    env = {"WAYLAND_DISPLAY": "wayland-1", "PATH": str(tmp_path)}
    assert Wayland(env, Runner()).read() == Reading("Wayland", ON,
                                                    "HDMI-A-1 enabled; DP-1 enabled")
    tool.write_text('#!/bin/sh\n[ "$1" = --json ] && { echo "unrecognized option" >&2; exit 1; }\n'
                    'printf \'HDMI-A-1 "TV"\\n  Enabled: no\\n\'\n')
    assert Wayland(env, Runner()).read() == Reading("Wayland", OFF, "HDMI-A-1 disabled")
    assert Wayland({"PATH": str(tmp_path)}, Runner()).read().present is False
    # wlroots 0.15 (sway 1.7) says an output of a custom size (headless, nested) is
    # disabled with one mode of 0x0 whatever it shows (tests/test_wayland.py): not "off"
    tool.write_text("#!/bin/sh\necho '[{\"name\": \"HEADLESS-1\", \"enabled\": false, "
                    "\"modes\": [{\"width\": 0, \"height\": 0}]}, {\"name\": \"HDMI-A-1\", "
                    "\"enabled\": false, \"modes\": [{\"width\": 1920, \"height\": 1080}]}]'\n")
    assert Wayland(env, Runner()).read() == Reading("Wayland", None, (
        "HEADLESS-1 reads disabled with no mode of any size: cannot tell; HDMI-A-1 disabled"))
    assert Wayland.parse_text('HEADLESS-1 "Headless output 1"\n  Enabled: no\n  Modes:\n'
                              '    0x0 px\n').state is None
    assert Wayland.parse_text('HDMI-A-1 "TV"\n  Enabled: no\n  Modes:\n    1920x1080 px, '
                              '60.000000 Hz (preferred)\n').state == OFF
    assert Wayland({"WAYLAND_DISPLAY": "w", "PATH": str(tmp_path / "none")},
                   Runner()).read().said == "wlr-randr is not installed"


# -- the one retry ---------------------------------------------------------------------
def test_on_that_still_reads_off_is_retried_once_and_read_for_one_more_settle():
    core = ReadBack({"X11 DPMS": 0.5, "DRM": 0.5}, settle_s=1, menders=("X11 DPMS",))
    effects = core.handle(Asked(ON, 0.0))
    while isinstance(effects[0], ReadAt):
        effects = core.handle(Read((said("X11 DPMS", OFF, "Off"), said("DRM", OFF, "Off")),
                                   effects[0].at))
    assert effects == [Mend(("X11 DPMS",))]
    assert core.handle(Mended(("DPMS force on",), 1.2)) == [ReadAt(1.2, ("X11 DPMS", "DRM"))]
    [verdict] = core.handle(Read((said("X11 DPMS", ON, "On"), said("DRM", ON, "On")), 1.3))
    assert verdict.said() == ("confirmed by X11 DPMS (On), DRM (On) after a retry "
                              "(DPMS force on)")
    assert verdict.fields()["retried"] == ["DPMS force on"]


def test_the_retry_is_once_and_never_for_off():
    core = ReadBack({"X11 DPMS": 0.5}, settle_s=0, menders=("X11 DPMS",))
    core.handle(Asked(ON, 0.0))
    assert core.handle(Read((said("X11 DPMS", OFF, "Off"),), 0.0)) == [Mend(("X11 DPMS",))]
    core.handle(Mended(("DPMS force on",), 0.1))
    [verdict] = core.handle(Read((said("X11 DPMS", OFF, "Off"),), 0.1))
    assert verdict.contrary and verdict.why == (
        "the display reads off 0 s after it was turned on, and again after a retry "
        "(DPMS force on): X11 DPMS: Off")
    core = ReadBack({"X11 DPMS": 0.5}, settle_s=0, menders=("X11 DPMS",))
    core.handle(Asked(OFF, 0.0))
    [verdict] = core.handle(Read((said("X11 DPMS", ON, "On"),), 0.0))
    assert verdict.contrary and not verdict.retried


def test_a_wayland_output_left_disabled_is_enabled_again_once(tmp_path):
    """A stand-in wlr-randr keeping its output's state in a file: the display command
    (true) turned nothing on; the one retry enables the output that read disabled."""
    from agent.screen.sources import Runner
    state = tmp_path / "enabled"
    state.write_text("false")
    tool = tmp_path / "wlr-randr"
    tool.write_text(f'#!/bin/sh\nif [ "$1" = --output ]; then echo true > {state}; exit 0; fi\n'
                    f'read v < {state}\nprintf \'[{{"name": "HDMI-A-1", "enabled": %s}}]\' "$v"\n')
    tool.chmod(0o755)
    runner = Runner()
    screen = screen_service.Screen(
        [Wayland({"WAYLAND_DISPLAY": "wayland-1", "PATH": str(tmp_path)}, runner)], 0.3, runner)
    verdict = screen.read_back(ON)
    assert verdict.said() == ("confirmed by Wayland (HDMI-A-1 enabled) after a retry "
                              "(output HDMI-A-1 enabled again)")
    state.write_text("false")
    assert not screen.read_back(OFF).retried   # off is never retried


def test_a_tv_left_in_standby_is_woken_and_shown_this_input_over_cec_once(tmp_path):
    """A stand-in cec-ctl (no CEC adapter here: an emulation of its words, from
    v4l-utils' cec-ctl) keeping the TV's power in a file: the display command turned
    nothing on; the one retry sends Image View On to the TV and Active Source with the
    adapter's physical address to everyone."""
    from agent.screen.sources import Runner
    power, sent = tmp_path / "power", tmp_path / "sent"
    power.write_text("standby")
    device = tmp_path / "cec0"
    device.write_text("")
    tool = tmp_path / "cec-ctl"
    tool.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {sent}\n'
        'case "$*" in\n'
        f'  *--image-view-on*) echo on > {power} ;;\n'
        f'  *--give-device-power-status*) read p < {power}; echo "  pwr-state: $p" ;;\n'
        '  *--active-source*) ;;\n'
        '  *) echo "Physical Address              : 1.0.0.0" ;;\n'
        "esac\n")
    tool.chmod(0o755)
    runner = Runner()
    screen = screen_service.Screen([Cec(str(device), runner, str(tmp_path))], 0.3, runner)
    verdict = screen.read_back(ON)
    assert verdict.said() == ("confirmed by CEC (on) after a retry "
                              "(CEC Image View On, Active Source)"), verdict.said()
    lines = sent.read_text().splitlines()
    assert f"-d {device} --to 0 --image-view-on" in lines
    assert f"-d {device} --to 15 --active-source phys-addr=1.0.0.0" in lines


# -- the DRM connector, in a fake sysfs tree ------------------------------------------
def connector(root, name="card0-HDMI-A-1", status="connected", dpms="On", enabled="enabled"):
    path = root / "class" / "drm" / name
    path.mkdir(parents=True, exist_ok=True)
    for attribute, value in (("status", status), ("dpms", dpms), ("enabled", enabled)):
        (path / attribute).write_text(value + "\n")
    return path


def drm_screen(root, settle_s=0.6):
    return screen_service.Screen([Drm(str(root))], settle_s)


def test_the_drm_connector_confirms_off_and_on_and_a_connector_left_on_is_contrary(tmp_path):
    sys_root = tmp_path / "sys"
    hdmi = connector(sys_root)
    connector(sys_root, "card0-HDMI-A-2", status="disconnected", dpms="Off", enabled="disabled")
    screen = drm_screen(sys_root)
    verdict = screen.read_back(ON)
    assert verdict.said() == "confirmed by DRM (card0-HDMI-A-1 enabled, On)"
    started = time.monotonic()
    verdict = screen.read_back(OFF)   # nothing turned it off
    took = time.monotonic() - started
    assert not verdict.confirmed and verdict.contrary and 0.6 <= took < 2.0, took
    assert verdict.why == ("the display reads on 0.6 s after it was turned off: "
                           "DRM: card0-HDMI-A-1 enabled, On")
    (hdmi / "dpms").write_text("Off\n")
    assert screen.read_back(OFF).said() == "confirmed by DRM (card0-HDMI-A-1 enabled, Off)"
    (hdmi / "dpms").write_text("On\n")
    (hdmi / "enabled").write_text("disabled\n")   # a compositor's output turned off
    assert screen.read_back(OFF).confirmed
    assert not screen.read_back(ON).confirmed


def test_a_connector_that_reaches_the_state_within_the_settle_is_confirmed(tmp_path):
    import threading
    sys_root = tmp_path / "sys"
    hdmi = connector(sys_root, dpms="Off")
    screen = drm_screen(sys_root, settle_s=5)
    threading.Timer(0.7, lambda: (hdmi / "dpms").write_text("On\n")).start()
    started = time.monotonic()
    verdict = screen.read_back(ON)
    assert verdict.confirmed and 0.7 <= time.monotonic() - started < 2.5


def test_no_drm_connector_and_nothing_else_is_unconfirmed_at_once(tmp_path):
    screen = screen_service.from_config(
        ScreenSection(settle_s=30), SimpleNamespace(display_on_command="true",
                                                    display_off_command="true"),
        sysfs_root=str(tmp_path / "nosys"), environ={"PATH": str(tmp_path)})
    started = time.monotonic()
    verdict = screen.read_back(OFF)
    assert time.monotonic() - started < 1.0
    assert verdict.said() == (
        "unconfirmed: nothing here reads the display: DRM: no DRM connector in sysfs; "
        "X11 DPMS: no X display to ask ([screen] x_display, DISPLAY); Wayland: "
        "WAYLAND_DISPLAY is not set; CEC: cec-ctl is not installed (v4l-utils)")


def test_the_x_display_is_the_keys_else_the_commands_else_the_environments():
    commands = SimpleNamespace(display_off_command="xset -display :7 dpms force off",
                               display_on_command="env DISPLAY=:8 xset s reset dpms force on")
    def x11(section, environ):
        screen = screen_service.from_config(section, commands, sysfs_root="/nonexistent",
                                            environ=environ)
        return screen.sources["X11 DPMS"].display
    assert x11(ScreenSection(x_display=":5"), {"DISPLAY": ":6"}) == ":5"
    assert x11(ScreenSection(), {"DISPLAY": ":6"}) == ":7"   # what was turned off
    commands.display_off_command = commands.display_on_command = "wlr-randr --output X --off"
    assert x11(ScreenSection(), {"DISPLAY": ":6"}) == ":6"
    assert screen_service.display_in(["wlr-randr --output HDMI-A-1 --off", None]) is None


def test_the_screen_section_is_checked(tmp_path):
    path = tmp_path / "agent.toml"
    base = '[server]\nurl = "http://127.0.0.1:9"\n'
    for screen, why in (('x_display = "../../etc/passwd"',
                         "screen.x_display: must be an X display"),
                        ("settle_s = 600", "screen.settle_s: must be between 0 and 120"),
                        ('cec_device = "cec0"', "screen.cec_device: must be an absolute path")):
        path.write_text(f"{base}[screen]\n{screen}\n")
        with pytest.raises(cfgmod.ConfigError, match=why):
            cfgmod.load(str(path), {})
    path.write_text(f'{base}[screen]\nx_display = ":0"\nsettle_s = 2.5\n')
    config = cfgmod.load(str(path), {})
    assert config.screen == ScreenSection(settle_s=2.5, x_display=":0", cec_device="/dev/cec0")


# -- a real X server -----------------------------------------------------------------
def x_actions(display, tmp_path, off=None, on=None, settle_s=1.0):
    """Actions whose display commands are xset's on ``display``, read back with only
    xset on the PATH (no cec-ctl, no wlr-randr: the same words on every machine)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "xset").exists():
        (bin_dir / "xset").symlink_to(shutil.which("xset"))
    commands = SimpleNamespace(
        timeout_s=5.0,
        display_off_command=off or f"xset -display {display} dpms force off",
        display_on_command=on or f"xset -display {display} s reset dpms force on")
    screen = screen_service.from_config(ScreenSection(settle_s=settle_s), commands,
                                        sysfs_root=str(tmp_path / "nosys"),
                                        environ={"PATH": str(bin_dir)})
    power = DisplayPower(commands.display_on_command, commands.display_off_command,
                         commands.timeout_s, screen, lambda event: None)
    return Actions(commands, "http://fleet.invalid", snapshot=dict, link_socket=lambda: None,
                   request_restart=lambda: None, enqueue=lambda *a: "x", power=power)


@pytest.mark.parametrize("driven", ["whole", "stepped"])
def test_a_real_x_server_is_asked_and_one_without_dpms_is_said_at_once(xvfb, tmp_path,
                                                                        driven):
    """Xvfb has no DPMS extension: `xset dpms force off` exits 0 there and changes
    nothing. What the display command answers is what `xset q` read: no DPMS here,
    unconfirmed, at once (nothing else on this machine can tell)."""
    display, _ = xvfb
    actions = x_actions(display, tmp_path, settle_s=30)
    started = time.monotonic()
    off = display_command(actions, "off", driven)
    assert time.monotonic() - started < 5
    why = ("nothing here reads the display: DRM: no DRM connector in sysfs; X11 DPMS: the X "
           "server has no DPMS; Wayland: WAYLAND_DISPLAY is not set; CEC: cec-ctl is not "
           "installed (v4l-utils)")
    assert off.ok and off.output == f"display off: unconfirmed: {why}", off
    assert off.extra == {"confirmed": False, "why": why}


@pytest.mark.parametrize("driven", ["whole", "stepped"])
def test_a_display_that_cannot_be_read_is_unconfirmed_after_the_bounded_settle(xvfb, tmp_path,
                                                                              driven):
    """The X server gone after the command: xset is asked again until the settle is
    over, then the answer says what it last said."""
    display, x_server = xvfb
    x_server.kill()
    x_server.wait()
    actions = x_actions(display, tmp_path, off="true", settle_s=1.0)
    started = time.monotonic()
    outcome = display_command(actions, "off", driven)
    took = time.monotonic() - started
    assert 1.0 <= took < 1.0 + actions.read_back_s, took
    assert outcome.ok, "the command ran: ok; what the display did is in confirmed"
    assert outcome.extra["confirmed"] is False
    assert outcome.extra["why"].startswith("no source read off within 1 s: X11 DPMS: xset "
                                           "exited 1: "), outcome.extra
    assert "unable to open display" in outcome.extra["why"]


def test_working_hours_say_how_the_display_was_confirmed_and_fault_one_that_stays_on(
        tmp_path):
    """Real commands writing a fake connector's dpms, as a compositor's DPMS would."""
    sys_root = tmp_path / "sys"
    dpms = connector(sys_root) / "dpms"
    changes, faults = [], []
    wall = [time.mktime((2026, 12, 7, 20, 0, 0, 0, 0, -1))]   # a Monday evening: off
    screen = screen_service.from_config(
        ScreenSection(settle_s=0.6), SimpleNamespace(display_on_command="", display_off_command=""),
        sysfs_root=str(sys_root), environ={"PATH": str(tmp_path)})
    power = DisplayPower(f"sh -c 'echo On > {dpms}'", "true", 5.0, screen, lambda event: None,
                         sysfs_root=str(sys_root), connect_grace_s=0)
    hours = WorkingHours(Schedule.parse(["mon-fri 08:00-18:00"], []), None, power,
                         trust_clock=True, on_fault=faults.append, on_change=changes.append,
                         now=lambda: wall[0])
    hours.step()   # "off" ran (true) and the connector still reads On: a fault, once
    assert faults == [{"wanted": "off", "error": "the display reads on 0.6 s after it was "
                                                 "turned off: DRM: card0-HDMI-A-1 enabled, On"}]
    assert changes == [] and hours.applied is None
    assert hours.snapshot()["fault"] == faults[0]["error"]
    power.commands["off"] = f"sh -c 'echo Off > {dpms}'"
    hours._retry_at = 0.0
    hours.step()
    assert changes == [{"state": "off", "by": "working hours", "confirmed": True,
                        "confirmed_by": ["DRM"], "read": "DRM: card0-HDMI-A-1 enabled, Off"}]
    assert hours.applied is False and hours.fault is None and len(faults) == 1
    assert hours.snapshot()["read_back"] == "confirmed by DRM (card0-HDMI-A-1 enabled, Off)"
    wall[0] += 12 * 3600   # Tuesday 08:00: on
    hours.step()
    assert changes[-1]["state"] == "on" and changes[-1]["confirmed"] is True
    assert hours.snapshot()["read_back"] == "confirmed by DRM (card0-HDMI-A-1 enabled, On)"


@pytest.mark.netns
def test_the_agent_answers_a_display_command_with_the_state_read_back(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    """The daemon's wiring: the fleet server's display command, run by the real agent,
    answered with what the DRM connector reads afterwards (the tree of debug.sysfs_root,
    written by the real commands)."""
    sys_root = tmp_path / "sys"
    dpms = connector(sys_root) / "dpms"
    server = fleet()
    config = agent_config(server, tmp_path, commands={
        "allow": ["display"], "display_off_command": f"sh -c 'echo Off > {dpms}'",
        "display_on_command": "true"}, screen={"settle_s": 1.0},
        debug={"sysfs_root": str(sys_root)})
    spawn_agent(agent_python, config).wait_live(15)

    def result(state):
        cid = server.admin("/api/v1/commands", {"device_id": "screen-1", "name": "display",
                                                "args": {"state": state}})["id"]
        return wait_for(lambda: server.admin("/api/v1/devices/screen-1/commands")[cid]["result"],
                        15, interval=0.1, what=f"the result of display {state}")

    off = result("off")
    assert off["ok"] and off["output"] == ("display off: confirmed by DRM (card0-HDMI-A-1 "
                                           "enabled, Off)"), off
    assert off["confirmed"] is True and off["confirmed_by"] == ["DRM"]
    on = result("on")   # "true" turns nothing on: the connector still reads Off
    assert on["ok"] and on["confirmed"] is False, on
    assert on["why"] == ("the display reads off 1 s after it was turned on: DRM: "
                         "card0-HDMI-A-1 enabled, Off")
