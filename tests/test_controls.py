"""The screen's buttons (agent/screen/controls.py): brightness on a backlight in a real
sysfs-shaped tree of real files, volume on a real PipeWire (started here, headless, in
a private runtime directory, with a null sink) through the real wpctl, pactl and amixer
(ALSA's pulse plugin), the player's restart through a stand-in player, power-off through
logind's command; what the screen has the means for, probed on a fake clock; and
ScreenTinker's buttons mapped onto them, declared only where they work."""
import glob
import os
import re
import shutil
import signal
import subprocess
import time
from types import SimpleNamespace

import pytest

from agent.commands.actions import Actions
from agent.commands.core import LATER, CommandCore, Outcome, Received, Recovered, level_args
from agent.config.model import Screen as ScreenSection
from agent.link.profiles import ProfileContext, ScreenTinkerProfile
from agent.screen import controls as controls_mod
from agent.screen.brightness import Backlight, Ddc
from agent.screen.controls import Controls, answer
from agent.screen.sources import Runner
from agent.screen.volume import Amixer, Pactl, Wpctl, environment

SOUND_DEBS = "pipewire pipewire-bin wireplumber pipewire-pulse pulseaudio-utils alsa-utils " \
             "libasound2-plugins dbus-daemon"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def backlight(root, name="rpi_backlight", maximum=255, now=255, follows=True):
    """A backlight as the kernel shows it; ``follows``: actual_brightness is what was
    last written (the hardware took it), else it stays where it was."""
    path = root / "class" / "backlight" / name
    path.mkdir(parents=True)
    (path / "max_brightness").write_text(f"{maximum}\n")
    (path / "brightness").write_text(f"{now}\n")
    if follows:
        # one file under two names, as the kernel reads one register for both
        os.link(path / "brightness", path / "actual_brightness")
    else:
        (path / "actual_brightness").write_text(f"{now}\n")
    return path


def controls_with(brightness=(), volume=(), player=None, clock=None, logind=False):
    return Controls(list(brightness), list(volume), player, clock=clock or Clock(),
                    logind=lambda: logind)


# -- brightness: a backlight in sysfs -----------------------------------------------------
def test_brightness_is_written_to_the_backlight_and_answered_with_what_it_reads_back(tmp_path):
    path = backlight(tmp_path)
    controls = controls_with([Backlight(str(tmp_path))])
    outcome = controls.act("brightness", {"level": 0.4})
    assert outcome.ok, outcome.error
    assert (path / "brightness").read_text() == "102\n"      # 0.4 of 255
    assert outcome.output == "brightness 40%: read back 40% (backlight rpi_backlight)"
    assert outcome.extra == {"level": 0.4, "via": "backlight", "read": 0.4,
                             "said": "backlight rpi_backlight", "confirmed": True}


def test_the_commands_part_answers_a_brightness_command_with_the_controls_read_back(tmp_path):
    backlight(tmp_path)
    controls = controls_with([Backlight(str(tmp_path))])
    actions = Actions(SimpleNamespace(timeout_s=5), "http://fleet.invalid", snapshot=dict,
                      link_socket=lambda: None, request_restart=lambda: None,
                      enqueue=lambda kind, payload: "u1", controls=controls)
    assert actions.read_back_s == controls.bound_s
    outcome = actions.run("brightness", {"level": 0.4})
    assert isinstance(outcome, Outcome) and outcome.ok
    assert outcome.output == "brightness 40%: read back 40% (backlight rpi_backlight)"
    assert outcome.extra["confirmed"] is True
    refused = actions.run("volume", {"level": 0.4})
    assert not refused.ok and refused.error == "volume: this screen has no means: [screen] volume_via is none"


def test_a_backlight_that_does_not_take_the_level_is_a_failure_that_says_what_it_reads(
        tmp_path):
    backlight(tmp_path, follows=False)
    outcome = controls_with([Backlight(str(tmp_path))]).act("brightness", {"level": 0.4})
    assert not outcome.ok
    assert outcome.error == ("brightness 40%: read back 100% (backlight rpi_backlight): "
                             "the level did not take")
    assert outcome.extra["confirmed"] is False and outcome.extra["read"] == 1.0


def test_a_coarse_backlight_is_confirmed_at_its_nearest_step(tmp_path):
    path = backlight(tmp_path, name="10-0045", maximum=7, now=7)
    outcome = controls_with([Backlight(str(tmp_path))]).act("brightness", {"level": 0.4})
    assert (path / "brightness").read_text() == "3\n"
    assert outcome.ok and outcome.output == \
        "brightness 40%: read back 43% (backlight 10-0045)", outcome.error


def test_a_backlight_reading_garbage_is_not_read_back(tmp_path):
    path = backlight(tmp_path, follows=False)
    (path / "actual_brightness").write_text("bright\n")
    outcome = controls_with([Backlight(str(tmp_path))]).act("brightness", {"level": 0.5})
    assert not outcome.ok and outcome.error == ("brightness 50%: set through backlight, but "
                                                "not read back: rpi_backlight: "
                                                "actual_brightness is not a number")
    assert outcome.extra == {"level": 0.5, "via": "backlight", "confirmed": False}


def test_without_a_means_the_answer_says_what_was_looked_for(tmp_path):
    controls = controls_with([Backlight(str(tmp_path)), Ddc(Runner(), path=str(tmp_path))])
    assert "brightness" not in controls.means()
    outcome = controls.act("brightness", {"level": 0.5})
    assert not outcome.ok and outcome.error == ("brightness: this screen has no means: "
                                                "backlight: no backlight in sysfs; "
                                                "ddcutil: ddcutil is not installed")
    assert controls.why_not()["brightness"].startswith("backlight: no backlight")


def test_ddc_ci_through_ddcutil_sets_on_the_monitors_scale_and_reads_back(tmp_path):
    """No monitor answers DDC/CI on this machine: an EMULATION of ddcutil (a shell
    script named ddcutil, a monitor of 50 steps) stands in; the real ddcutil's
    --brief answer is what it prints."""
    bin_dir, dev = tmp_path / "bin", tmp_path / "dev"
    bin_dir.mkdir(), dev.mkdir()
    (dev / "i2c-20").touch()
    state = tmp_path / "vcp10"
    state.write_text("50")
    tool = bin_dir / "ddcutil"
    tool.write_text(f"#!/bin/sh\ncase \"$1\" in\n"
                    f"getvcp) echo \"VCP 10 C $(cat {state}) 50\";;\n"
                    f"setvcp) echo \"$3\" > {state}; echo \"$@\" >> {tmp_path}/calls;;\n"
                    f"*) exit 1;;\nesac\n")
    tool.chmod(0o755)
    ddc = Ddc(Runner(), path=str(bin_dir), dev_root=str(dev))
    controls = controls_with([Backlight(str(tmp_path / "sys")), ddc])
    assert "brightness" in controls.means()
    outcome = controls.act("brightness", {"level": 0.3})
    assert outcome.ok and outcome.output == "brightness 30%: read back 30% (ddcutil (DDC/CI))"
    assert (tmp_path / "calls").read_text() == "setvcp 10 15\n"
    assert controls.via() == {"brightness": "ddcutil"}


def test_ddcutil_answers_are_read_strictly():
    ddc = Ddc(Runner())
    assert ddc.parse("VCP 10 C 40 100\n") == 0.4 and ddc.maximum == 100
    for text in ("VCP 10 ERR\n", "Display not found\n", "VCP 10 C 140 100", "VCP 10 C 1 0",
                 "VCP 10 C 99999999 100", "VCP 12 C 40 100"):
        assert Ddc(Runner()).parse(text) is None, text


# -- what the screen has, probed rarely (a fake clock) ----------------------------------
def test_the_means_are_probed_once_and_again_only_when_stale(tmp_path):
    clock, probes = Clock(), []

    class Counted(Backlight):
        def probe(self):
            probes.append(clock.now)
            return super().probe()

    controls = controls_with([Counted(str(tmp_path))], clock=clock, logind=True)
    assert controls.means() == frozenset({"poweroff"})
    backlight(tmp_path)                       # plugged in after the agent started
    clock.now += 600
    assert controls.means() == frozenset({"poweroff"}) and len(probes) == 1
    clock.now += controls_mod.PROBE_EVERY_S
    assert controls.means() == frozenset({"poweroff", "brightness"}) and len(probes) == 2
    assert controls.means() and len(probes) == 2


def test_a_command_looks_again_for_a_means_found_missing(tmp_path):
    controls = controls_with([Backlight(str(tmp_path))])
    assert controls.means() == frozenset()
    backlight(tmp_path)
    assert controls.act("brightness", {"level": 1.0}).ok


def test_the_player_is_restarted_through_the_player_and_answers_with_its_state():
    class Player:
        bound_s = 42.0

        def __init__(self, ok, words):
            self.ok, self.words, self.asked = ok, words, 0

        def restart(self):
            self.asked += 1
            return self.ok, self.words

    player = Player(True, "kiosk.service active again (pid 4242)")
    controls = controls_with(player=player)
    assert controls.means() == frozenset({"restart-player"}) and controls.bound_s >= 42.0
    outcome = controls.act("restart-player", {})
    assert outcome.ok and outcome.output == "player restarted: kiosk.service active again " \
                                            "(pid 4242)" and player.asked == 1
    assert outcome.extra == {"via": "player", "confirmed": True}
    failed = controls_with(player=Player(False, "kiosk.service failed (exit 1)")).act(
        "restart-player", {})
    assert not failed.ok and failed.error == "player not restarted: kiosk.service failed " \
                                             "(exit 1)"
    none = controls_with()
    assert "restart-player" not in none.means()
    assert none.act("restart-player", {}).error == (
        "restart-player: this screen has no player unit ([screen] player_unit in agent.toml)")


def test_from_config_follows_the_via_keys(tmp_path):
    backlight(tmp_path)
    env = {"PATH": str(tmp_path)}   # no sound program there
    auto = controls_mod.from_config(ScreenSection(), sysfs_root=str(tmp_path), environ=env)
    assert [m.via for m in auto.candidates["brightness"]] == ["backlight", "ddcutil"]
    assert [m.via for m in auto.candidates["volume"]] == ["wpctl", "pactl", "amixer"]
    assert auto.act("brightness", {"level": 0.2}).ok
    none = controls_mod.from_config(ScreenSection(brightness_via="none", volume_via="amixer",
                                                  mixer_control="PCM"),
                                    sysfs_root=str(tmp_path), environ=env)
    assert none.means() & {"brightness", "volume"} == frozenset()
    assert none.why_not()["brightness"] == "[screen] brightness_via is none"
    assert none.why_not()["volume"] == "amixer: amixer is not installed"
    assert none.candidates["volume"][0].control == "PCM"


def test_a_level_that_did_not_take_is_judged_on_the_means_scale():
    coarse = SimpleNamespace(via="amixer", resolution=1 / 31)
    # 15 of 31 steps, shown as amixer shows it: [48%]
    assert answer("volume", 0.5, coarse, "", 0.48, "amixer PCM (ALSA)").ok
    assert not answer("volume", 0.5, coarse, "", 0.45, "amixer PCM (ALSA)").ok
    fine = SimpleNamespace(via="wpctl", resolution=0.01)
    assert answer("volume", 0.4, fine, "", 0.4, "wpctl (PipeWire)").ok
    assert not answer("volume", 0.4, fine, "", 0.42, "wpctl (PipeWire)").ok


# -- volume: a real PipeWire --------------------------------------------------------------
@pytest.fixture
def pipewire(tmp_path):
    """A headless PipeWire (with WirePlumber and its PulseAudio server) in a private
    runtime directory, a null sink its default; the environment to reach it in."""
    missing = [t for t in ("dbus-run-session", "pipewire", "wireplumber", "pipewire-pulse",
                           "pw-cli", "wpctl", "pactl", "amixer") if shutil.which(t) is None]
    if not glob.glob("/usr/lib/*/alsa-lib/libasound_module_ctl_pulse.so"):
        missing.append("ALSA's pulse plugin")
    if missing:
        pytest.fail(f"no {', '.join(missing)}: .ci/run must install {SOUND_DEBS} "
                    "(scripts/_env.sh TEST_DEBS)")
    home = tmp_path / "home"
    run = home / "run"
    run.mkdir(parents=True, mode=0o700)
    # amixer reaches the same server through ALSA's pulse plugin
    (home / ".asoundrc").write_text("pcm.!default pulse\nctl.!default pulse\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "XDG_RUNTIME_DIR": str(run),
           "XDG_CONFIG_HOME": str(home / "config"), "XDG_STATE_HOME": str(home / "state")}
    server = subprocess.Popen(
        ["dbus-run-session", "--", "sh", "-c",
         'pipewire & while [ ! -S "$XDG_RUNTIME_DIR/pipewire-0" ]; do sleep 0.05; done; '
         'wireplumber & pipewire-pulse & wait'],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _until(lambda: (run / "pipewire-0").exists(), "pipewire's socket")
        subprocess.run(["pw-cli", "create-node", "adapter",
                        "{ factory.name=support.null-audio-sink node.name=test-sink "
                        "media.class=Audio/Sink object.linger=true audio.position=[FL FR] }"],
                       env=env, check=True, capture_output=True, timeout=5)
        _until(lambda: subprocess.run(["wpctl", "get-volume", "@DEFAULT_AUDIO_SINK@"], env=env,
                                      capture_output=True, timeout=5).returncode == 0,
               "the null sink the default")
        _until(lambda: subprocess.run(["pactl", "get-sink-volume", "@DEFAULT_SINK@"], env=env,
                                      capture_output=True, timeout=5).returncode == 0,
               "pipewire-pulse")
        yield env
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(5)


def _until(check, what, within_s=15.0):   # a sound server's start, 1-2 s on a quiet machine
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {within_s} s")
        time.sleep(0.05)


@pytest.mark.parametrize("means, said", [(Wpctl, "wpctl (PipeWire)"),
                                         (Pactl, "pactl (PulseAudio)"),
                                         (Amixer, "amixer Master (ALSA)")])
def test_volume_is_set_and_read_back_on_a_real_sound_server(pipewire, means, said):
    env = environment(pipewire)
    controls = controls_with(volume=[means(Runner(), env)])
    assert controls.means() == frozenset({"volume"})
    outcome = controls.act("volume", {"level": 0.4})
    assert outcome.ok, outcome.error
    assert outcome.output == f"volume 40%: read back 40% ({said})"
    assert outcome.extra["read"] == pytest.approx(0.4, abs=0.005)
    # the server holds it: the other tools read the same level
    wpctl = subprocess.run(["wpctl", "get-volume", "@DEFAULT_AUDIO_SINK@"], env=pipewire,
                           capture_output=True, text=True, timeout=5).stdout
    assert wpctl.strip() == "Volume: 0.40"
    assert controls.act("volume", {"level": 0.75}).output == \
        f"volume 75%: read back 75% ({said})"


def test_auto_takes_the_first_sound_program_that_answers(pipewire, tmp_path):
    auto = controls_mod.from_config(ScreenSection(), sysfs_root=str(tmp_path),
                                    environ=pipewire)
    assert auto.means() == frozenset({"volume"}) and auto.via() == {"volume": "wpctl"}
    subprocess.run(["wpctl", "set-mute", "@DEFAULT_AUDIO_SINK@", "1"], env=pipewire,
                   check=True, timeout=5)
    outcome = auto.act("volume", {"level": 0.1})
    assert outcome.ok and outcome.output == "volume 10%: read back 10% (wpctl (PipeWire), muted)"


def test_without_a_sound_server_there_is_no_volume_and_it_says_why(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    env = environment({"PATH": "/usr/bin:/bin", "XDG_RUNTIME_DIR": str(run),
                       "HOME": str(tmp_path)})
    controls = controls_with(volume=[Wpctl(Runner(), env), Pactl(Runner(), env)])
    assert controls.means() == frozenset()
    why = controls.why_not()["volume"]
    # bookworm's words (trixie's wpctl and pactl may word the failure their own way)
    assert re.fullmatch(r"wpctl: wpctl exited \d+: .*PipeWire.*; pactl: pactl exited \d+: "
                        r".*(Connection refused|No such file).*", why), why


# -- power-off: logind, the same way as a reboot -----------------------------------------
def _systemctl(tmp_path, monkeypatch, script: str):
    """An EMULATION of systemctl on PATH (a real one would power this machine off), and
    the command actions that run it."""
    tool = tmp_path / "systemctl"
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    return tool, Actions(SimpleNamespace(timeout_s=5), "http://fleet.invalid", snapshot=dict,
                         link_socket=lambda: None, request_restart=lambda: None,
                         enqueue=lambda kind, payload: "u1")


def test_poweroff_asks_logind_and_its_result_comes_after_the_next_start(tmp_path, monkeypatch):
    """The emulated systemctl records what it was asked."""
    _, actions = _systemctl(tmp_path, monkeypatch, (
        f"echo \"$@\" >> {tmp_path}/calls\n"
        f"[ -e {tmp_path}/refuse ] && {{ echo 'Access denied' >&2; exit 1; }}\nexit 0\n"))
    assert actions.run("poweroff", {}) is LATER
    assert actions.run("reboot", {}) is LATER
    assert (tmp_path / "calls").read_text() == ("poweroff --no-ask-password\n"
                                                "reboot --no-ask-password\n")
    (tmp_path / "refuse").touch()
    refused = actions.run("poweroff", {})
    assert not refused.ok and refused.error == "poweroff refused: systemctl exited 1: " \
                                               "Access denied"
    # the device powered off with the command running: at the next boot it is done
    core = CommandCore(allow=frozenset({"poweroff"}))
    core.handle(Received({"id": "p1", "name": "poweroff"}, 100.0, 100.0, boot="boot-a", pid=10))
    [_, report] = CommandCore(allow=core.allow, entries=core.entries).handle(
        Recovered("boot-b", pid=20, now=300.0))
    assert report.result["ok"] and report.result["output"] == \
        "the device powered off (started again since)"


def test_a_systemctl_ended_by_a_signal_leaves_the_reboots_result_to_the_next_start(
        tmp_path, monkeypatch):
    """The device going down stops the agent's unit: systemd signals its whole control
    group at once, a systemctl logind has answered but that has not exited yet with it
    (likely what failed the booted reboot test once on CI: a reboot that happened,
    reported to the fleet as refused). The emulated systemctl ends by a real SIGTERM."""
    tool, actions = _systemctl(tmp_path, monkeypatch, "kill -TERM $$\nsleep 5\n")
    assert actions.run("reboot", {}) is LATER
    assert actions.run("poweroff", {}) is LATER
    # a refusal is still one: it exited with its own status
    tool.write_text("#!/bin/sh\necho 'Access denied' >&2\nexit 1\n")
    refused = actions.run("reboot", {})
    assert not refused.ok and refused.error == "reboot refused: systemctl exited 1: Access denied"


# -- ScreenTinker 1.9's buttons ----------------------------------------------------------
def st_profile(allowed, means=None):
    return ScreenTinkerProfile(ProfileContext(device_id=lambda: "st-1", token=lambda: None,
                                              allowed_commands=frozenset(allowed), means=means))


def test_screentinkers_buttons_are_the_agents_screen_commands():
    command = ScreenTinkerProfile._command
    assert command("set_volume", {"level": 0.4}) == ("volume", {"level": 0.4})
    assert command("set_brightness", {"level": 1}) == ("brightness", {"level": 1})
    assert command("launch", {}) == ("restart-player", {})
    assert command("refresh", None) == ("restart-player", {})
    assert command("shutdown", {}) == ("poweroff", {})
    # the level is the core's to check: a malformed one is refused there, with why
    for payload in (None, {}, {"level": "40"}, {"level": 40}, {"level": True}):
        name, args = command("set_volume", payload)
        with pytest.raises(ValueError, match="level: a number from 0 to 1"):
            level_args(args)
    assert level_args(command("set_brightness", {"level": 0.25, "x": 1})[1]) == {"level": 0.25}


def test_a_button_is_declared_only_where_it_is_allowed_and_the_screen_has_the_means():
    every = ["reboot", "display", "screenshot", "restart-player", "brightness", "volume",
             "poweroff"]
    assert st_profile(every).capabilities() == [
        "audio.volume", "display.brightness", "display.power", "remote.screenshot",
        "system.reboot", "system.restart_player"]
    assert st_profile(every, means=lambda: frozenset({"volume"})).capabilities() == [
        "audio.volume", "display.power", "system.reboot"]
    # a screenshot too needs a means (a capture tool and Pillow, or its command)
    assert st_profile(every, means=lambda: frozenset({"volume", "screenshot"})
                      ).capabilities() == ["audio.volume", "display.power", "remote.screenshot",
                                           "system.reboot"]
    assert st_profile(["volume", "brightness"], means=lambda: frozenset()).capabilities() == []
    # power-off shares system.reboot: declared for reboot, never for poweroff alone
    assert st_profile(["poweroff"], means=lambda: frozenset({"poweroff"})).capabilities() == []
    assert st_profile(["brightness"], means=lambda: frozenset({"brightness", "volume"})
                      ).register_payload()["capabilities"] == ["display.brightness"]
