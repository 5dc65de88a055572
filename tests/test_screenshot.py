"""The screenshot command (issue #50 item 8): by default it is the screen itself, full
size, taken by the picture check's means (xwd, grim, import; Pillow), bounded; it is
offered to a server (ScreenTinker's ``remote.screenshot``) only where such a means, or
``[commands] screenshot_command``, exists; ``check-config`` says which, or why none.
On a real X server (Xvfb), through the screen part the daemon builds."""
import io
import os
import subprocess
import sys


from agent.commands.actions import Actions
from agent.config import load as cfgmod
from agent.link.profiles import ProfileContext, ScreenTinkerProfile
from agent.screen import part as screen_part
from devtools.harness import REPO
from tests.test_picture_content import screen_hd  # noqa: F401 (a fixture: 1920x1080 Xvfb)


def config_of(tmp_path, commands: str, screen: str = ""):
    path = tmp_path / "agent.toml"
    path.write_text(f'[server]\nurl = "http://fleet.invalid"\n[commands]\n{commands}\n'
                    f'[screen]\n{screen}\n')
    return path, cfgmod.load(str(path), {})


def part_of(config, tmp_path, environ):
    return screen_part.assemble(
        config, sysfs=str(tmp_path), environ=environ, runtime_dir=str(tmp_path),
        publish=lambda e: None, enqueue=lambda kind, data: None, gate=None)


def actions_of(config, part, queued):
    def enqueue(kind, data):
        queued.append((kind, data))
        return f"u{len(queued)}"
    return Actions(config.commands, "http://fleet.invalid", snapshot=dict,
                   link_socket=lambda: None, request_restart=lambda: None, enqueue=enqueue,
                   shoot=part.screenshot)


def capabilities(config, part):
    return ScreenTinkerProfile(ProfileContext(
        device_id=lambda: "st-1", token=lambda: None,
        allowed_commands=config.commands.allow, means=part.means)).capabilities()


def check_config(path, environ) -> str:
    out = subprocess.run([sys.executable, "-m", "agent", "check-config", "--config", str(path)],
                         capture_output=True, text=True, timeout=60, cwd=REPO,
                         env={"PYTHONPATH": str(REPO), **environ})
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_screenshot_is_the_screen_full_size_by_the_picture_checks_means(screen_hd,
                                                                         tmp_path):
    subprocess.run(["xsetroot", "-display", screen_hd, "-solid", "#c03020"], check=True,
                   timeout=10)
    environ = {"PATH": os.environ["PATH"]}
    path, config = config_of(tmp_path, 'allow = ["screenshot"]', f'x_display = "{screen_hd}"')
    part, queued = part_of(config, tmp_path, environ), []
    assert "screenshot" in part.means()
    assert capabilities(config, part) == ["remote.screenshot"]
    outcome = actions_of(config, part, queued).run("screenshot", {})
    assert outcome.ok, outcome
    [(kind, image)] = queued
    from PIL import Image
    with Image.open(io.BytesIO(image)) as im:
        assert (kind, im.format, im.size) == ("screenshot", "JPEG", (1920, 1080))
        red, green, blue = im.convert("RGB").getpixel((960, 540))
        assert red > 160 and green < 80 and blue < 70, (red, green, blue)
    assert len(image) < ScreenTinkerProfile.MAX_IMAGE_B64 * 3 // 4
    assert f"screenshot  xwd on {screen_hd}" in check_config(path, environ)


def test_a_screen_with_no_means_is_not_offered_the_screenshot_and_is_told_why(tmp_path):
    environ = {"PATH": "/nowhere"}
    path, config = config_of(tmp_path, 'allow = ["screenshot", "reboot"]', 'x_display = ":9"')
    part, queued = part_of(config, tmp_path, environ), []
    assert "screenshot" not in part.means()
    assert capabilities(config, part) == ["system.reboot"]
    outcome = actions_of(config, part, queued).run("screenshot", {})
    assert not outcome.ok and queued == []
    assert "no capture tool on this X screen" in outcome.error, outcome
    said = check_config(path, environ)
    assert "screenshot  none (not offered to the server): no capture tool on this X " \
           "screen" in said, said


def test_a_screenshot_command_is_the_means_where_it_is_set(tmp_path):
    environ = {"PATH": "/nowhere"}
    path, config = config_of(tmp_path, 'allow = ["screenshot"]\n'
                                       'screenshot_command = "grim -t jpeg -"')
    part = part_of(config, tmp_path, environ)
    assert "screenshot" in part.means()
    assert capabilities(config, part) == ["remote.screenshot"]
    assert "screenshot  grim ([commands] screenshot_command)" in check_config(path, environ)
