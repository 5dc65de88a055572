"""The system's own (hardware) watchdog, opt-in (#53): [device] hardware_watchdog and its
bound, the drop-in root's start step writes or removes (agent/programs/system_watchdog.py,
run by `python3 -m agent.programs.grants` as root under the unit's UMask=0077, on real
directories, links planted by a real unprivileged user, systemctl a stand-in that
records its call), the doctor's step on sysfs fixtures, the status line. What systemd
makes of the drop-in: tests/test_booted_systemd.py."""
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agent.app import doctor as D, doctor_probes
from agent.base import system_watchdog as W
from agent.config import load as config_mod, overlay as overlay_file
from agent.config.schema import SCHEMA, ConfigError
from agent.device import words
from agent.device.part import DevicePart
from agent.device.reader import DeviceReader
from tests.test_grants import GROUP, USER, ground  # noqa: F401 (a fixture)

REPO = Path(__file__).resolve().parent.parent
CONFIG = '[server]\nurl = "http://127.0.0.1:9"\n'
PI = W.Device("Broadcom BCM2835 Watchdog timer", 15, 15, True)


def _load(tmp_path, text: str):
    cfg = tmp_path / "agent.toml"
    cfg.write_text(CONFIG + f'[identity]\nstate_dir = "{tmp_path}"\n' + text)
    return config_mod.load(str(cfg), env={}, vendor=None)


# -- the rule: the key, its bound, the drop-in's text -----------------------------------------
def test_the_drop_in_asks_systemd_for_the_configured_period_and_nothing_when_off(tmp_path):
    assert _load(tmp_path, "").device.watchdog_s is None    # off by default
    on = _load(tmp_path, "[device]\nhardware_watchdog = true\n").device
    assert on.watchdog_s == 15 == W.PI_MAX_S
    assert _load(tmp_path, "[device]\nhardware_watchdog = true\nhardware_watchdog_s = 10\n"
                 ).device.watchdog_s == 10
    text = W.dropin_text(10, "/etc/edge-agent/agent.toml")
    assert text.endswith("\n[Manager]\nRuntimeWatchdogSec=10s\n"), text
    assert all(line.startswith("#") for line in text.splitlines()[:-2])
    assert "[device] hardware_watchdog = true in /etc/edge-agent/agent.toml" in text
    assert W.dropin_text(None) is None


def test_the_period_is_bounded_by_the_bcm2835s_fifteen_seconds(tmp_path):
    # drivers/watchdog/bcm2835_wdt.c: max_timeout = WDOG_TICKS_TO_SECS(PM_WDOG_TIME_SET)
    assert W.PI_MAX_S == 0x000fffff >> 16 == 15
    rule = SCHEMA["device"]["hardware_watchdog_s"].rule
    assert (rule.lo, rule.hi) == (W.MIN_S, W.PI_MAX_S)
    for value, said in (("16", "device.hardware_watchdog_s: must be between 5 and 15, got 16"),
                        ("4", "device.hardware_watchdog_s: must be between 5 and 15, got 4"),
                        ("10.5", "device.hardware_watchdog_s: expected a int, got float"),
                        ('"15"', "device.hardware_watchdog_s: expected a int, got str")):
        with pytest.raises(ConfigError) as e:
            _load(tmp_path, f"[device]\nhardware_watchdog = true\nhardware_watchdog_s = {value}\n")
        assert str(e.value) == said
    with pytest.raises(ConfigError, match="device.hardware_watchdog: expected true or false"):
        _load(tmp_path, '[device]\nhardware_watchdog = "yes"\n')


def test_the_fleet_may_not_set_it(tmp_path):
    """Root acts on it: the fleet's settings (which the agent's user writes to the card)
    never reach it, whichever way."""
    assert not SCHEMA["device"]["hardware_watchdog"].fleet
    assert not SCHEMA["device"]["hardware_watchdog_s"].fleet
    cfg = tmp_path / "agent.toml"
    cfg.write_text(CONFIG)
    for key, value in (("device.hardware_watchdog", True), ("device.hardware_watchdog", False),
                       ("device.hardware_watchdog_s", 5)):
        with pytest.raises(ConfigError, match=f"{key}: not set from the fleet on this device"):
            config_mod.load(str(cfg), env={}, fleet={key: value}, vendor=None)


def test_systemds_answer_over_dbus_in_seconds():
    assert W.parse_busctl("t 15000000\n") == 15.0
    assert W.parse_busctl("t 0") == 0.0
    assert W.parse_busctl(f"t {W.USEC_INFINITY}") == float("inf")
    for odd in ("", "s \"15s\"", "t -1", "t 15s", "t 1 2", "t " + "9" * 40):
        assert W.parse_busctl(odd) is None, odd


def test_each_state_in_words():
    judge = W.judge
    assert judge(15, 15.0, PI) == ("armed", "armed: systemd pets /dev/watchdog0: Broadcom "
                                   "BCM2835 Watchdog timer (timeout 15 s, running) every 7.5 s; "
                                   "the board resets 15 s after the last")
    # the device's own word where systemd could not be asked
    assert judge(15, None, PI)[0] == "armed"
    assert judge(15, 15.0, None) == ("no-device", "configured, no watchdog device here "
                                     "(systemd's RuntimeWatchdogSec is 15 s)")
    assert judge(15, 0.0, PI)[0] == "not-armed" and "RuntimeWatchdogSec is off" in judge(15, 0.0, PI)[1]
    assert judge(15, 10.0, PI)[0] == "not-armed"
    assert judge(15, 15.0, PI, dropin=False)[0] == "not-armed"
    assert judge(15, 15.0, W.Device("x", 15, 15, False))[0] == "not-armed"
    assert judge(15, 15.0, W.Device("x", 10, 10, True))[0] == "not-armed"   # over its max
    assert judge(15, 15.0, W.Device("x", 14, None, True))[0] == "configured"   # its nearest
    assert judge(15, None, W.Device("x", None, None, None))[0] == "unknown"
    assert judge(None, 0.0, W.Device(PI.identity, 15, 15, False)) == (
        "off", "off ([device] hardware_watchdog); /dev/watchdog0: Broadcom BCM2835 Watchdog "
               "timer (timeout 15 s, stopped)")
    assert judge(None, 0.0, None)[0] == "off"
    assert judge(None, 30.0, None)[0] == "armed-by-others"
    assert judge(None, None, PI)[0] == "armed-by-others"


# -- root's start step on real directories ----------------------------------------------------
@pytest.fixture
def watchdog_ground(ground):
    """test_grants' ground (a root-owned base standing for /etc/systemd, a directory of
    the unprivileged user's) and a systemctl that records each call."""
    base, theirs = ground
    bin_ = base / "bin"
    bin_.mkdir()
    fake = bin_ / "systemctl"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {base}/systemctl.calls\n'
                    f'[ -e {base}/systemctl.fails ] && {{ echo "Failed to reload" >&2; exit 1; }}\n'
                    'exit 0\n')
    fake.chmod(0o755)
    return base, theirs


def step(base: Path, text: str = "", *args, dropins: Path | None = None):
    """`python3 -m agent.programs.grants`, as root, with the unit's umask."""
    cfg = base / "agent.toml"
    cfg.write_text(CONFIG + text)
    dropins = dropins or base / "system.conf.d"
    return subprocess.run([sys.executable, "-m", "agent.programs.grants", "--config", str(cfg),
                           "--dir", str(base / "grants"), "--watchdog-dir", str(dropins),
                           "--node-exporter-dir", str(base / "none"), *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO, umask=0o077,
                          env={"PYTHONPATH": str(REPO), "PATH": f"{base}/bin:/usr/bin:/bin"})


def reloads(base: Path) -> list[str]:
    calls = base / "systemctl.calls"
    return calls.read_text().splitlines() if calls.exists() else []


ON = "[device]\nhardware_watchdog = true\nhardware_watchdog_s = 12\n"


def test_root_writes_the_drop_in_only_while_configured_and_reloads_systemd_on_a_change(watchdog_ground):
    base, _ = watchdog_ground
    dropin = base / "system.conf.d" / W.DROPIN_NAME
    r = step(base)
    assert r.returncode == 0 and not r.stdout, r
    assert not (base / "system.conf.d").exists() and reloads(base) == []

    r = step(base, ON)
    assert r.returncode == 0, r
    # root's file, 0644 in root's 0755 directory, though the unit's umask is 0077: PID 1
    # reads it as root, an operator reads it as anyone
    assert stat.S_IMODE(dropin.parent.stat().st_mode) == 0o755 and dropin.parent.stat().st_uid == 0
    st = dropin.lstat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644 and st.st_uid == 0
    assert dropin.read_text() == W.dropin_text(12, str(base / "agent.toml"))
    assert reloads(base) == ["daemon-reload"]
    assert r.stdout == (f"edge-agent: the system's watchdog: systemd's RuntimeWatchdogSec=12s "
                        f"in {dropin}, systemd reloaded\n"), r.stdout

    for _ in range(2):   # restarts: nothing written, systemd left alone
        before = dropin.stat().st_mtime_ns
        r = step(base, ON)
        assert r.returncode == 0 and not r.stdout and dropin.stat().st_mtime_ns == before, r
    assert reloads(base) == ["daemon-reload"]

    r = step(base, ON.replace("12", "15"))   # another period: the file anew
    assert "RuntimeWatchdogSec=15s\n" in dropin.read_text() and len(reloads(base)) == 2

    r = step(base, ON, "--revoke")   # a stop: the board's watchdog stays armed
    assert r.returncode == 0 and dropin.exists() and len(reloads(base)) == 2, r
    r = step(base, ON + "[link]\nack_timeout_s = -1\n")   # a file that does not load: left
    assert r.returncode == 0 and dropin.exists() and len(reloads(base)) == 2, r

    r = step(base)   # the operator turned it off and restarted the agent
    assert r.returncode == 0 and not dropin.exists() and len(reloads(base)) == 3, r
    assert r.stdout == (f"edge-agent: the system's watchdog: off: {dropin} removed, "
                        "systemd reloaded\n"), r.stdout


def test_a_reload_that_fails_is_said_and_the_drop_in_waits_for_the_next_boot(watchdog_ground):
    base, _ = watchdog_ground
    (base / "systemctl.fails").touch()
    r = step(base, ON)
    assert r.returncode == 0 and (base / "system.conf.d" / W.DROPIN_NAME).exists(), r
    assert r.stdout.startswith("edge-agent: the system's watchdog: systemd's "
                               "RuntimeWatchdogSec=12s in "), r.stdout
    assert ("systemd not told (systemctl exited 1: Failed to reload): it applies at the next "
            "boot") in r.stdout, r.stdout


def _overlay(theirs: Path, values: dict) -> str:
    overlay = overlay_file.Overlay(overlay_file.Revision(9, values))
    (theirs / overlay_file.FILE).write_text(json.dumps(overlay.to_dict()))
    shutil.chown(theirs / overlay_file.FILE, USER, GROUP)
    return f'[identity]\nstate_dir = "{theirs}"\n'


def test_the_fleets_overlay_the_agents_user_writes_turns_it_neither_on_nor_off(watchdog_ground):
    base, theirs = watchdog_ground
    dropin = base / "system.conf.d" / W.DROPIN_NAME
    state = _overlay(theirs, {"device.hardware_watchdog": True, "log.level": "debug"})
    r = step(base, state)
    assert r.returncode == 0 and not dropin.exists() and reloads(base) == [], r
    r = step(base, state + ON)
    assert dropin.exists() and len(reloads(base)) == 1, r
    state = _overlay(theirs, {"device.hardware_watchdog": False})
    r = step(base, state + ON)
    assert r.returncode == 0 and dropin.exists() and len(reloads(base)) == 1, r
    state = _overlay(theirs, {"device.hardware_watchdog_s": 5})
    r = step(base, state + ON)
    assert "RuntimeWatchdogSec=12s\n" in dropin.read_text() and len(reloads(base)) == 1, r


def test_root_never_writes_through_a_link_nor_into_a_directory_someone_else_owns(watchdog_ground):
    base, theirs = watchdog_ground
    target = theirs / "target"
    subprocess.run(["sh", "-c", f"echo theirs > {target}"], check=True, user=USER, group=GROUP)
    dropins = base / "system.conf.d"
    dropins.mkdir(mode=0o755)
    (dropins / W.DROPIN_NAME).symlink_to(target)
    r = step(base, ON)
    assert r.returncode == 0 and target.read_text() == "theirs\n", r
    st = (dropins / W.DROPIN_NAME).lstat()
    assert stat.S_ISREG(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o644
    assert len(reloads(base)) == 1

    # the directory itself a link to the user's, or the user's own: nothing written there
    for where in (base / "linked.conf.d", theirs / "system.conf.d"):
        if where.parent == base:
            where.symlink_to(theirs)
        r = step(base, ON, dropins=where)
        assert r.returncode == 0 and r.stdout.startswith("edge-agent: the system's "
                                                         "watchdog: "), r.stdout
        assert not (theirs / W.DROPIN_NAME).exists() and not (
            theirs / "system.conf.d" / W.DROPIN_NAME).exists()
        assert "left as it was" in r.stdout, r.stdout
    assert "not root's alone" in r.stdout, r.stdout
    assert len(reloads(base)) == 1


# -- the doctor's step on sysfs fixtures --------------------------------------------------------
def _sysfs(tmp_path: Path, **attrs) -> Path:
    root = tmp_path / "sys"
    d = root / "class/watchdog/watchdog0"
    d.mkdir(parents=True)
    for name, value in attrs.items():
        (d / name).write_text(f"{value}\n")
    return root


PI_ATTRS = {"identity": "Broadcom BCM2835 Watchdog timer", "timeout": 15, "max_timeout": 15,
            "state": "active", "bootstatus": 0}


def _busctl(tmp_path: Path, monkeypatch, said: str | None):
    """A busctl that answers ``said`` (None: none on the PATH)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    if said is not None:
        (bin_ / "busctl").write_text(f"#!/bin/sh\necho '{said}'\n")
        (bin_ / "busctl").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_))


def _doctor(tmp_path, monkeypatch, configured: bool, attrs: dict | None, said: str | None,
            dropin: bool = True):
    config = _load(tmp_path, ON if configured else "")
    _busctl(tmp_path, monkeypatch, said)
    root = _sysfs(tmp_path, **attrs) if attrs is not None else tmp_path / "empty"
    path = tmp_path / W.DROPIN_NAME
    if dropin:
        path.touch()
    return D.judge_watchdog(doctor_probes.system_watchdog(config, str(root), str(path)))


@pytest.mark.parametrize("configured, attrs, said, dropin, verdict, words_, exit", [
    (True, {**PI_ATTRS, "timeout": 12}, "t 12000000", True, "ok",
     "armed: systemd pets /dev/watchdog0: Broadcom BCM2835 Watchdog timer (timeout 12 s, "
     "running) every 6 s", 0),
    (True, None, "t 12000000", True, "info", "configured, no watchdog device here", 0),
    (True, {**PI_ATTRS, "state": "inactive"}, "t 0", True, "fail",
     "configured (12 s), but systemd's RuntimeWatchdogSec is off", 10),
    (True, PI_ATTRS, "t 12000000", False, "fail", "edge-agent-watchdog.conf is not there", 10),
    (True, {**PI_ATTRS, "timeout": 12}, None, True, "ok", "armed", 0),   # no bus: the device
    (True, {"identity": "x"}, None, True, "warn", "systemd did not say its setting", 0),
    (False, {**PI_ATTRS, "state": "inactive"}, "t 0", False, "info",
     "off ([device] hardware_watchdog); /dev/watchdog0: Broadcom", 0),
    (False, PI_ATTRS, "t 15000000", False, "info", "systemd pets it at 15 s by another", 0),
])
def test_the_doctor_says_whether_it_is_armed(tmp_path, monkeypatch, configured, attrs, said,
                                             dropin, verdict, words_, exit):
    found = _doctor(tmp_path, monkeypatch, configured, attrs, said, dropin)
    assert (found.name, found.verdict, found.exit) == ("watchdog", verdict, exit), found
    assert words_ in found.said, found.said
    if verdict == "fail":
        assert "systemctl restart edge-agent" in found.todo


def test_the_doctors_step_is_in_its_order_and_its_exit_class():
    assert D.STEPS[-1] == "watchdog" and D.EXIT_OF["watchdog"] == D.EXIT_WATCHDOG == 10
    assert "10  watchdog" in D.DOCTOR_EXITS


# -- status: the device section ----------------------------------------------------------------
def test_status_shows_the_system_watchdog_in_the_device_section(tmp_path):
    state, run = tmp_path / "state", tmp_path / "run"
    state.mkdir()
    run.mkdir()
    root = _sysfs(tmp_path, **{**PI_ATTRS, "timeout": 12})
    changes = []
    part = DevicePart(DeviceReader(str(state), str(root), str(tmp_path / "proc")),
                      publish=lambda e: None, every_s=60.0, state_dir=str(state),
                      runtime_dir=str(run), cold_start=False, watchdog_s=12,
                      on_change=lambda: changes.append(1))
    assert part.snapshot()["watchdog"] is None    # not read yet
    part.turn(0.0)
    snap = part.snapshot()["watchdog"]
    assert snap["state"] == "armed" and snap["configured_s"] == 12, snap
    line = [s for s in words.lines(part.snapshot()) if s.startswith("watchdog")]
    assert line == ["watchdog    the system's: armed: systemd pets /dev/watchdog0: Broadcom "
                    "BCM2835 Watchdog timer (timeout 12 s, running) every 6 s; the board "
                    "resets 12 s after the last"], line
    (root / "class/watchdog/watchdog0/state").write_text("inactive\n")   # systemd let it go
    n = len(changes)
    part.turn(61.0)
    assert part.snapshot()["watchdog"]["state"] == "not-armed" and len(changes) > n
    assert words.lines({"watchdog": {"said": 3}}) == []   # another build's odd file
