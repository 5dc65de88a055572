"""The screentinker profile against the real ScreenTinker servers, each generation.

ScreenTinker's own servers (Node, socket.io 4, better-sqlite3; github.com/screentinker/
screentinker, prepared outside this repository, see devtools/screentinker_peer.py) run
in the test's network namespace: 1.2 (April 2026), which ACKs nothing, so liveness and
delivery rest on its Engine.IO pings, and 1.9 (August 2026), which ACKs heartbeats,
throttles, and sends a dashboard command only to a device that declared the capability.
Every test runs against each generation unless it is about one of them. Every claim
the profile makes is checked where the server keeps it: its sqlite database, its
uploads directory, its dashboard socket. The tests shorten the ping interval to 2 s
(devtools/node/socketio_timing.js); one test keeps each server's defaults. A
generation that cannot run here fails its tests with the reason; none is skipped.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time

import pytest
import socketio

from agent import __version__ as agent_version
from devtools import screentinker_peer as peer
from devtools.harness import REPO, FakeSystemd, agent_config, wait_for
from tests.test_inventory import edid

pytestmark = pytest.mark.netns

PING_S = 2.0
HB, ACK = 2.0, 1.0
NO_IDENTITY = {"device_id": None, "token": None}
JPEG = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 64 + b"\xff\xd9"


@pytest.fixture(params=peer.GENERATIONS, ids=lambda g: f"st{g}")
def generation(request) -> str:
    why = peer.unavailable(request.param)
    if why:
        pytest.fail(f"the real ScreenTinker {request.param} server cannot run here: {why}",
                    pytrace=False)
    return request.param


only_19 = pytest.mark.parametrize("generation", ["1.9"], indirect=True, ids=["st1.9"])
only_12 = pytest.mark.parametrize("generation", ["1.2"], indirect=True, ids=["st1.2"])


@pytest.fixture
def st(netns, tmp_path, generation):
    server = peer.ScreenTinkerServer(tmp_path, generation, ping_interval_s=PING_S,
                                     ping_timeout_s=PING_S)
    server.start()
    yield server
    server.stop()


def st_config(st, tmp_path, **sections):
    class Url:
        url = st.url
        devices = {}
    return agent_config(Url, tmp_path, server={"profile": "screentinker"}, identity=NO_IDENTITY,
                        uploads={"base_s": 1.0, "cap_s": 2.0}, **sections)


def code_of(agent) -> str | None:
    return (agent.status().get("pairing") or {}).get("code")


def credentials(tmp_path) -> dict:
    return json.loads((tmp_path / "state" / "credentials.json").read_text())


def cli(agent_python, cfg, *args, payload: bytes | None = None):
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    return subprocess.run([agent_python, "-m", "agent", *args, "--config", str(cfg)],
                          input=payload, capture_output=True, env=env, cwd=cfg.parent, timeout=30)


def enqueue(agent_python, cfg, kind, payload: bytes):
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    return subprocess.run([agent_python, "-m", "agent", "enqueue", "--config", str(cfg),
                           "--kind", kind, "-"], input=payload, capture_output=True, env=env,
                          cwd=cfg.parent, timeout=30)


def register_and_pair(st, agent, tmp_path) -> str:
    """The screen shows a code; the operator types it into the dashboard."""
    code = wait_for(lambda: code_of(agent), 15, what="a pairing code")
    row = st.wait_row("SELECT * FROM devices WHERE pairing_code = ?", code.replace("-", ""))[0]
    # registered, not yet claimed (its heartbeats already make the row say online)
    assert row["user_id"] is None
    creds = wait_for(lambda: (tmp_path / "state" / "credentials.json").exists() and credentials(tmp_path),
                     10, what="credentials kept at registration")
    assert creds["server_device_id"] == row["id"] and creds["token"] == row["device_token"]
    assert creds["claimed"] is False and creds["pairing_code"] == code.replace("-", "")
    st.pair(code)
    wait_for(lambda: agent.status().get("pairing", {}).get("state") == "paired", 10,
             what="the agent to see device:paired")
    return row["id"]


def test_register_by_code_pair_over_the_api_heartbeats_and_telemetry_land(
        st, generation, spawn_agent, agent_python, tmp_path):
    hdmi = tmp_path / "sys" / "class" / "drm" / "card1-HDMI-A-1"
    hdmi.mkdir(parents=True)
    (hdmi / "status").write_text("connected\n")
    (hdmi / "modes").write_text("1920x1200\n1920x1080\n")
    (hdmi / "edid").write_bytes(edid(b"DELL U2415"))
    agent = spawn_agent(agent_python, st_config(st, tmp_path,
                                                debug={"sysfs_root": str(tmp_path / "sys")}))
    device_id = register_and_pair(st, agent, tmp_path)
    assert os.stat(tmp_path / "state" / "credentials.json").st_mode & 0o777 == 0o600
    creds = credentials(tmp_path)
    assert creds["claimed"] is True and "pairing_code" not in creds
    for text in (agent.log_text(), json.dumps(agent.status())):
        assert creds["token"] not in text, "the token leaked"
    row = st.device(device_id)
    assert row["status"] == "online" and row["user_id"] and row["name"] == "Lobby screen"
    assert row["app_version"] == f"edge-agent {agent_version}" and row["android_version"]  # the OS
    telemetry = st.wait_row("SELECT * FROM device_telemetry WHERE device_id = ? AND "
                            "ram_total_mb IS NOT NULL", device_id)[-1]
    assert telemetry["uptime_seconds"] > 0 and telemetry["storage_total_mb"] > 0
    if generation == "1.9":   # its columns for the inventory's display (1.2 has none)
        shown = st.wait_row("SELECT * FROM device_telemetry WHERE device_id = ? AND "
                            "attached_display IS NOT NULL", device_id)[-1]
        assert shown["attached_display"] == "DELL U2415" and shown["video_mode"] == "1920x1200"
    beat = st.device(device_id)["last_heartbeat"]
    wait_for(lambda: st.device(device_id)["last_heartbeat"] > beat, 3 * HB, interval=0.2,
             what="heartbeats moving last_heartbeat")
    assert len(st.rows("SELECT id FROM devices")) == 1
    assert "ignoring unknown server event" not in agent.log_text()  # playlist-update is the player's


def test_the_code_is_in_the_file_the_journal_and_status_until_claimed_and_status_says_so(
        st, spawn_agent, agent_python, tmp_path):
    """As under the native protocol: the file a player's UI reads, one journal line, and
    `status`, which says unclaimed with exit 4 until the operator enters the code, then
    claimed; the expiry is what the server gives it: none while the screen is connected."""
    cfg = st_config(st, tmp_path)
    agent = spawn_agent(agent_python, cfg)
    code_file = tmp_path / "run" / "pairing-code"
    code = wait_for(lambda: code_file.exists() and code_file.read_text().strip(), 15,
                    what="the pairing code file")
    # the code in the file is one the server holds, unclaimed
    row = st.wait_row("SELECT * FROM devices WHERE pairing_code = ?", code.replace("-", ""))[0]
    assert row["user_id"] is None and code_file.stat().st_mode & 0o777 == 0o644
    where, expiry = ("the ScreenTinker dashboard (Add display)",
                     "no expiry while this screen stays connected")
    assert f"pairing code {code}: enter it on {where} ({expiry})" in agent.log_text()
    r = cli(agent_python, cfg, "status")
    out = r.stdout.decode()
    assert r.returncode == 4, out
    assert f"pairing     unclaimed: code {code} (enter it on {where}; {expiry})" in out, out
    assert "None" not in out
    st.pair(code)
    wait_for(lambda: not code_file.exists(), 10, interval=0.2, what="the file gone once claimed")
    r = wait_for(lambda: (lambda r: r if r.returncode == 0 else None)(cli(agent_python, cfg, "status")),
                 15, interval=0.5, what="status online and claimed")
    assert "pairing     claimed (paired)" in r.stdout.decode(), r.stdout.decode()
    assert agent.log_text().count(f"pairing code {code}:") == 1


def test_proof_of_play_and_screenshots_land_only_after_pairing_and_only_once(
        st, spawn_agent, agent_python, tmp_path):
    cfg = st_config(st, tmp_path)
    agent = spawn_agent(agent_python, cfg)
    code = wait_for(lambda: code_of(agent), 15, what="a pairing code")
    status, content = st.api("POST", "/api/content/remote",
                             {"url": "https://signage.example.invalid/welcome.jpg", "name": "Welcome"})
    assert status == 201
    plays = [{"event": "play_start", "content_id": content["id"], "content_name": "Welcome"},
             {"event": "play_end", "content_id": content["id"], "completed": True}]
    for record in plays:
        r = enqueue(agent_python, cfg, "proof-of-play", json.dumps(record).encode())
        assert r.returncode == 0, r.stderr
    assert enqueue(agent_python, cfg, "screenshot", JPEG).returncode == 0
    # shapes the server would read and drop are refused before they are queued
    r = enqueue(agent_python, cfg, "proof-of-play", json.dumps({"events": plays}).encode())
    assert r.returncode == 2 and b"event: must be play_start or play_end" in r.stderr
    r = enqueue(agent_python, cfg, "screenshot", b"GIF89a" + b"x" * 100)
    assert r.returncode == 2 and b"JPEG or PNG" in r.stderr
    time.sleep(2 * PING_S)
    assert st.rows("SELECT * FROM play_logs") == [] and agent.status()["uploads"]["items"] == 3, \
        "uploads went before the operator paired the screen"

    st.pair(code)
    device_id = credentials(tmp_path)["server_device_id"]
    wait_for(lambda: agent.status()["uploads"]["items"] == 0, 20, interval=0.2,
             what="the queue drained with proof of delivery")
    logs = st.rows("SELECT * FROM play_logs WHERE device_id = ?", device_id)
    assert len(logs) == 1, logs
    assert logs[0]["content_id"] == content["id"] and logs[0]["content_name"] == "Welcome"
    assert logs[0]["ended_at"] is not None and logs[0]["completed"] == 1
    # the server keeps the latest screenshot in memory and writes it when the screen leaves
    agent.stop()
    shot = st.wait_row("SELECT * FROM screenshots WHERE device_id = ?", device_id)[0]
    stored = st.server_dir / "uploads" / "screenshots" / shot["filepath"]
    assert stored.read_bytes() == JPEG
    assert "proof of delivery" not in agent.log_text()  # no timeouts: every item proven


def test_three_plays_queued_offline_are_three_rows_not_one(st, spawn_agent, agent_python, tmp_path):
    """1.9 stores at most one play_start per device every 2 s and drops the rest without
    a word; a backlog sent at once lost all but one. The profile paces them."""
    cfg = st_config(st, tmp_path)
    agent = spawn_agent(agent_python, cfg)
    code = wait_for(lambda: code_of(agent), 15, what="a pairing code")
    for n in range(3):   # three real plays of one clip: three records
        record = {"event": "play_start", "content_name": "Loop clip", "play_id": f"play-{n}"}
        assert enqueue(agent_python, cfg, "proof-of-play", json.dumps(record).encode()).returncode == 0
    st.pair(code)
    device_id = credentials(tmp_path)["server_device_id"]
    wait_for(lambda: agent.status()["uploads"]["items"] == 0, 40, interval=0.2,
             what="the queue drained with proof of delivery")
    logs = st.rows("SELECT * FROM play_logs WHERE device_id = ?", device_id)
    assert len(logs) == 3, logs


def test_pets_go_on_while_the_link_is_up_and_stop_on_a_silent_drop(
        st, netns, spawn_agent, agent_python, tmp_path):
    """1.2 ACKs nothing: its pings prove the link. 1.9 ACKs each heartbeat."""
    systemd = FakeSystemd(tmp_path / "notify.sock", watchdog_s=1.0)
    try:
        agent = spawn_agent(agent_python, st_config(st, tmp_path), env=systemd.env())
        device_id = register_and_pair(st, agent, tmp_path)
        t0 = time.monotonic()
        time.sleep(3 * PING_S + 1)
        pets = [t for t in systemd.times("WATCHDOG=1") if t > t0]
        assert len(pets) >= 2 * PING_S * 3 - 2, f"{len(pets)} pets in {3 * PING_S + 1}s"
        assert agent.link()["connection"] == 1, "the link flapped"

        netns.drop_port(st.port)
        t_drop = time.monotonic()
        time.sleep(PING_S + ACK + 3)
        last_pet = max(systemd.times("WATCHDOG=1"))
        bound = PING_S + ACK + 0.5 + 0.5  # ping due + slack, half a watchdog period
        print(f"\nlast WATCHDOG=1 {last_pet - t_drop:.2f}s after the silent drop (bound {bound:.1f}s)")
        assert last_pet - t_drop <= bound
        netns.restore()
        t_restore = time.monotonic()
        wait_for(lambda: [t for t in systemd.times("WATCHDOG=1") if t > t_restore], 20,
                 what="pets after the link healed")
        assert agent.link()["connection"] >= 2
        assert st.device(device_id)["status"] == "online"
        assert len(st.rows("SELECT id FROM devices")) == 1, "the reconnect made a second device row"
    finally:
        systemd.close()


@only_12
def test_at_1_2s_own_ping_interval_the_kernel_proves_every_heartbeat(
        netns, generation, spawn_agent, agent_python, tmp_path):
    """1.2 ACKs nothing and pings every 25 s: the pets used to follow its pings, 27 s
    apart, so any WatchdogSec under half a minute restarted a healthy screen. The
    kernel's acknowledgement of each heartbeat keeps them a heartbeat apart, and a silent
    drop stops them within a heartbeat plus the ACK timeout, not a ping interval."""
    server = peer.ScreenTinkerServer(tmp_path, generation)  # its own ping interval
    server.start()
    systemd = FakeSystemd(tmp_path / "notify.sock", watchdog_s=1.0)
    try:
        agent = spawn_agent(agent_python, st_config(server, tmp_path), env=systemd.env())
        register_and_pair(server, agent, tmp_path)
        link = agent.wait_live(HB + ACK + 5)
        assert link["proof"] == "tcp-ack+ping", link
        t0 = time.monotonic()
        time.sleep(4 * HB)
        pets = [t for t in systemd.times("WATCHDOG=1") if t > t0]
        gaps = [b - a for a, b in zip([t0, *pets], pets)]
        assert len(pets) >= 6 and max(gaps) < 1.0, gaps
        netns.drop_port(server.port)   # silent, and no way back until the test ends
        t_drop = time.monotonic()
        time.sleep(HB + ACK + 2)
        last_pet = max(systemd.times("WATCHDOG=1"))
        assert "the server's TCP acknowledged no heartbeat" in agent.log_text()
        print(f"\nScreenTinker 1.2 at its 25 s pings: pets {max(gaps):.2f}s apart at most, the "
              f"last {last_pet - t_drop:.2f}s after a silent drop")
        assert last_pet - t_drop <= HB + ACK + 0.5 + 0.3
    finally:
        systemd.close()
        server.stop()


# at each server's defaults, the most a delivery may take to be proven: on 1.2 by its
# second Engine.IO ping (every 25 s), on 1.9 by the next heartbeat's ACK
DEFAULT_PROOF_S = {"1.2": 2 * 25 + 10, "1.9": HB + ACK + 3}


def test_at_the_servers_own_defaults_delivery_is_proven(
        netns, generation, spawn_agent, agent_python, tmp_path):
    server = peer.ScreenTinkerServer(tmp_path, generation)  # its own ping interval
    server.start()
    try:
        cfg = st_config(server, tmp_path)
        agent = spawn_agent(agent_python, cfg)
        device_id = register_and_pair(server, agent, tmp_path)
        agent.wait_live(15)
        record = {"event": "play_start", "content_name": "Default-interval clip"}
        t0 = time.monotonic()
        assert enqueue(agent_python, cfg, "proof-of-play", json.dumps(record).encode()).returncode == 0
        server.wait_row("SELECT * FROM play_logs WHERE device_id = ?", device_id, timeout=10)
        landed = time.monotonic() - t0
        wait_for(lambda: agent.status()["uploads"]["items"] == 0, DEFAULT_PROOF_S[generation] + 5,
                 interval=0.2, what="delivery proven")
        proven = time.monotonic() - t0
        print(f"\nScreenTinker {generation}: play_start in play_logs after {landed:.1f}s, proven "
              f"delivered after {proven:.1f}s (bound {DEFAULT_PROOF_S[generation]}s)")
        assert proven <= DEFAULT_PROOF_S[generation]
        assert len(server.rows("SELECT * FROM play_logs")) == 1
    finally:
        server.stop()


def test_unpair_on_the_screen_re_registers_and_the_server_relinks_the_same_row(
        st, spawn_agent, agent_python, tmp_path):
    cfg = st_config(st, tmp_path)
    agent = spawn_agent(agent_python, cfg)
    device_id = register_and_pair(st, agent, tmp_path)
    old_token = credentials(tmp_path)["token"]
    r = cli(agent_python, cfg, "unpair")
    assert r.returncode == 0, r.stderr
    # ScreenTinker knows the screen by its fingerprint: a new token, the same device row
    wait_for(lambda: (tmp_path / "state" / "credentials.json").exists()
             and credentials(tmp_path)["token"] != old_token
             and credentials(tmp_path).get("claimed"), 20, interval=0.2,
             what="re-registered and relinked")
    assert credentials(tmp_path)["server_device_id"] == device_id
    assert [r["id"] for r in st.rows("SELECT id FROM devices")] == [device_id]
    assert st.device(device_id)["device_token"] == credentials(tmp_path)["token"]
    agent.wait_live(15)


def test_a_screen_deleted_on_the_dashboard_shows_a_new_code_after_the_server_restarts(
        st, spawn_agent, agent_python, tmp_path):
    agent = spawn_agent(agent_python, st_config(st, tmp_path))
    device_id = register_and_pair(st, agent, tmp_path)
    old_code = code_of(agent)
    status, _ = st.api("DELETE", f"/api/devices/{device_id}")
    assert status == 200
    st.kill()   # and it comes back: the agent registers again with its token...
    st.start()  # ...which names a device the server no longer has: device:unpaired
    new_code = wait_for(lambda: code_of(agent) if code_of(agent) not in (None, old_code) else None,
                        30, interval=0.2, what="a new pairing code")
    row = st.wait_row("SELECT * FROM devices WHERE pairing_code = ?", new_code.replace("-", ""))[0]
    assert row["user_id"] is None and row["id"] != device_id
    assert "the server no longer knows this device" in agent.log_text()


@only_12
def test_commands_from_the_dashboard_are_refused_out_loud(st, spawn_agent, agent_python, tmp_path):
    """1.2 sends every dashboard command: the agent refuses what it does not allow."""
    agent = spawn_agent(agent_python, st_config(st, tmp_path))
    device_id = register_and_pair(st, agent, tmp_path)
    agent.wait_live(15)
    dashboard = socketio.Client(reconnection=False)
    dashboard.connect(st.url, namespaces=["/dashboard"], transports=["websocket"],
                      auth={"token": st.operator_token()})
    try:
        dashboard.emit("dashboard:device-command", {"device_id": device_id, "type": "reboot",
                                                    "payload": {}}, namespace="/dashboard")
        dashboard.emit("dashboard:request-screenshot", {"device_id": device_id},
                       namespace="/dashboard")
        refused = wait_for(lambda: len(agent.status().get("commands", [])) >= 2 and
                           agent.status()["commands"], 10, what="both requests refused")
    finally:
        dashboard.disconnect()
    assert [c["command"] for c in refused] == ["reboot", "screenshot"]
    assert all(c["result"].startswith("refused: ") for c in refused)
    # the result is in the status file a moment before its line is in the log
    said = ("(reboot): error: 'reboot' is not allowed on this screen",
            "(screenshot): error: 'screenshot' is not allowed on this screen")

    def both_said():
        text = agent.log_text()
        return text if all(s in text for s in said) else None
    log = wait_for(both_said, 10, interval=0.2, what="both refusals in the log")
    assert all(s in log for s in said), log[-2000:]
    assert agent.link()["connection"] == 1


def dashboard_of(st) -> socketio.Client:
    dashboard = socketio.Client(reconnection=False)
    dashboard.connect(st.url, namespaces=["/dashboard"], transports=["websocket"],
                      auth={"token": st.operator_token()})
    return dashboard


@only_19
def test_dashboard_commands_that_allow_permits_reach_the_screen_and_the_server_refuses_the_rest(
        st, spawn_agent, agent_python, tmp_path):
    """1.9 sends a command only to a device that declared its capability: the agent
    declares, in the server's words, exactly what [commands] allow lets it do."""
    shot, dark = tmp_path / "shot.jpg", tmp_path / "display-off"
    shot.write_bytes(JPEG)
    agent = spawn_agent(agent_python, st_config(st, tmp_path, commands={
        "allow": ["diagnostics", "logs", "display", "screenshot"],
        "display_off_command": f"touch {dark}", "screenshot_command": f"cat {shot}"}))
    device_id = register_and_pair(st, agent, tmp_path)
    agent.wait_live(15)
    declared = wait_for(lambda: st.device(device_id)["capabilities"], 10,
                        what="capabilities stored at the re-register with the token")
    assert json.loads(declared) == ["display.power", "remote.screenshot"]
    dashboard = dashboard_of(st)
    screenshots = []
    dashboard.on("dashboard:screenshot-ready", screenshots.append, namespace="/dashboard")
    try:
        def command(kind):
            return dashboard.call("dashboard:device-command", {"device_id": device_id, "type": kind,
                                                               "payload": {}},
                                  namespace="/dashboard", timeout=10)
        assert command("reboot") == {"delivered": False, "reason": "unsupported",
                                     "capability": "system.reboot"}
        assert command("screen_off") == {"delivered": True}
        assert dashboard.call("dashboard:request-screenshot", {"device_id": device_id},
                              namespace="/dashboard", timeout=10) == {"delivered": True}
        wait_for(dark.exists, 10, what="the display_off command run")
        ready = wait_for(lambda: screenshots, 20, interval=0.2,
                         what="the screenshot on the dashboard")
    finally:
        dashboard.disconnect()
    assert ready[0]["device_id"] == device_id
    assert base64.b64decode(ready[0]["image_data"].split(",", 1)[1]) == JPEG
    done = wait_for(lambda: len(agent.status().get("commands", [])) >= 2
                    and agent.status()["commands"], 10, what="both commands reported")
    assert sorted(c["command"] for c in done) == ["display", "screenshot"]
    assert not any(c["result"].startswith("refused") for c in done), done
    assert "reboot" not in agent.log_text()


@only_19
def test_the_dashboards_screen_buttons_reach_the_screens_own_commands(
        st, spawn_agent, agent_python, tmp_path):
    """1.9's sliders and power buttons (set_volume, set_brightness with {level: percent
    / 100}, launch, shutdown): declared only where the screen has the means, and run
    as the agent's brightness, restart-player and poweroff with the dashboard's level.
    This screen has a backlight (a sysfs tree of files) and a player unit, and no sound
    server: 1.9 refuses the volume slider itself; a screen that did not allow poweroff
    refuses the shutdown, saying why."""
    light = tmp_path / "sys" / "class" / "backlight" / "rpi_backlight"
    light.mkdir(parents=True)
    (light / "max_brightness").write_text("255\n")
    (light / "brightness").write_text("255\n")
    os.link(light / "brightness", light / "actual_brightness")   # the kernel's echo
    agent = spawn_agent(agent_python, st_config(
        st, tmp_path, commands={"allow": ["diagnostics", "volume", "brightness",
                                          "restart-player", "reboot"]},
        screen={"player_unit": "kiosk.service", "picture_every_s": 0},
        debug={"sysfs_root": str(tmp_path / "sys")}))
    device_id = register_and_pair(st, agent, tmp_path)
    agent.wait_live(15)
    declared = wait_for(lambda: st.device(device_id)["capabilities"], 10,
                        what="capabilities stored at the re-register with the token")
    assert json.loads(declared) == ["display.brightness", "system.reboot",
                                    "system.restart_player"]
    dashboard = dashboard_of(st)
    try:
        def press(kind, payload):
            return dashboard.call("dashboard:device-command", {
                "device_id": device_id, "type": kind, "payload": payload},
                namespace="/dashboard", timeout=10)
        assert press("set_volume", {"level": 0.4}) == {
            "delivered": False, "reason": "unsupported", "capability": "audio.volume"}
        for kind, payload in (("set_brightness", {"level": 0.25}), ("launch", {}),
                              ("shutdown", {})):
            assert press(kind, payload) == {"delivered": True}, kind
    finally:
        dashboard.disconnect()
    done = wait_for(lambda: len(agent.status().get("commands", [])) >= 3
                    and agent.status()["commands"], 15, what="the three commands answered")
    by_name = {c["command"]: c["result"] for c in done}
    assert set(by_name) == {"brightness", "restart-player", "poweroff"}, done
    assert by_name["poweroff"].startswith("refused: ") and "not allowed" in by_name["poweroff"]
    # the level read back from the backlight; the player's restart run (no systemd here
    # to do it: its failure in words, never refused as malformed)
    assert "read back 25%" in by_name["brightness"], by_name["brightness"]
    assert (light / "brightness").read_text().strip() == str(round(0.25 * 255))
    assert not by_name["restart-player"].startswith("refused"), by_name["restart-player"]
    assert "running 'brightness' {'level': 0.25}" in agent.log_text()


@only_19
def test_the_dashboards_terminal_runs_a_line_as_the_agents_user_and_shows_its_result(
        st, spawn_agent, agent_python, tmp_path):
    """1.9's terminal (shell {cmd}, gated on system.shell) runs one line as the agent's
    user and 1.9 relays the device:shell-result to the dashboard (dashboard:shell-result
    {device_id, cmd, output, exit}); set_timezone is sent (system.time declared) and
    refused with words for a zone this screen lacks, set_time refused while the screen
    cannot tell that NTP leaves its clock alone."""
    agent = spawn_agent(agent_python, st_config(st, tmp_path, commands={
        "allow": ["diagnostics", "logs", "shell", "set-time", "set-timezone"],
        "timeout_s": 5}))
    device_id = register_and_pair(st, agent, tmp_path)
    agent.wait_live(15)
    declared = wait_for(lambda: st.device(device_id)["capabilities"], 10,
                        what="capabilities stored at the re-register with the token")
    assert json.loads(declared) == ["system.shell", "system.time"]
    dashboard = dashboard_of(st)
    results = []
    dashboard.on("dashboard:shell-result", results.append, namespace="/dashboard")
    try:
        def press(kind, payload):
            return dashboard.call("dashboard:device-command", {
                "device_id": device_id, "type": kind, "payload": payload},
                namespace="/dashboard", timeout=10)
        assert press("shell", {"cmd": "id -u; echo oops >&2; exit 3"}) == {"delivered": True}
        [result] = wait_for(lambda: results, 15, what="dashboard:shell-result")
        assert result == {"device_id": device_id, "cmd": "id -u; echo oops >&2; exit 3",
                          "output": f"{os.getuid()}\noops\n", "exit": 3}, result
        assert press("set_timezone", {"timezone": "Europe/Nowhere"}) == {"delivered": True}
        assert press("set_time", {"millis": 1800000000000}) == {"delivered": True}
    finally:
        dashboard.disconnect()
    done = wait_for(lambda: len(agent.status().get("commands", [])) >= 3
                    and agent.status()["commands"], 15, what="the three commands answered")
    by_name = {c["command"]: c["result"] for c in done}
    assert by_name["set-timezone"].startswith("failed: no such time zone here"), by_name
    assert by_name["set-time"].startswith("failed: set-time refused: "), by_name
    assert "shell line from the fleet: 'id -u; echo oops >&2; exit 3': exit 3" \
        in agent.log_text()


@only_19
def test_the_dashboards_debug_switch_is_an_hour_of_debug_logging_then_the_file_again(
        st, spawn_agent, agent_python, tmp_path):
    """1.9's set_debug, as settings from the fleet: applied by a restart (systemd's;
    here the test's), proven by the link, and switched off the same way."""
    config = st_config(st, tmp_path, commands={"allow": ["diagnostics", "logs", "configure"]})
    agent = spawn_agent(agent_python, config)
    device_id = register_and_pair(st, agent, tmp_path)
    agent.wait_live(15)
    dashboard = dashboard_of(st)

    def debug(enabled):
        return dashboard.call("dashboard:device-command", {
            "device_id": device_id, "type": "set_debug", "payload": {"enabled": enabled}},
            namespace="/dashboard", timeout=10)
    try:
        assert debug(True) == {"delivered": True}
        assert agent.proc.wait(15) == 0
        agent = spawn_agent(agent_python, config)
        agent.wait_live(15)
        settings = wait_for(lambda: agent.status().get("settings", {}).get("state") == "kept"
                            and agent.status()["settings"], 15, what="the revision kept")
        level = settings["fleet"]["log.level"]
        assert level["value"] == "debug" and 3500 < level["expires_in_s"] <= 3600
        assert " DEBUG " in agent.log_text()
        assert credentials(tmp_path)["token"] not in agent.log_text(), "debug leaked the token"
        assert debug(False) == {"delivered": True}
        assert agent.proc.wait(15) == 0
        agent = spawn_agent(agent_python, config)
        agent.wait_live(15)
        settings = agent.status()["settings"]
        assert settings["revision"] == 2 and settings["fleet"] == {}
        assert settings["origins"]["log.level"] == "file"
    finally:
        dashboard.disconnect()


def device_events(st, device_id) -> list[dict]:
    return st.rows("SELECT type, reason, detail FROM device_events WHERE device_id = ? ORDER BY id",
                   device_id)


def reconnect_through_a_silent_drop(st, netns, agent, while_down=lambda: None) -> None:
    connection = agent.wait_live(15)["connection"]
    netns.drop_port(st.port)
    wait_for(lambda: agent.link().get("state") != "online", 15, interval=0.1,
             what="the agent to see the silent drop")
    while_down()
    netns.restore()
    wait_for(lambda: (agent.link().get("connection") or 0) > connection, 20, interval=0.2,
             what="a new connection")
    agent.wait_live(15)


@only_19
def test_a_restart_of_the_agent_is_not_a_reboot_but_a_new_boot_is(
        st, netns, spawn_agent, agent_python, tmp_path):
    agent = spawn_agent(agent_python, st_config(st, tmp_path))
    device_id = register_and_pair(st, agent, tmp_path)
    agent.wait_live(15)
    agent.stop()
    # the service stopped and started, the machine did not: systemd's stop removes the
    # runtime directory (RuntimeDirectory=), the mark of the boot is not there
    shutil.rmtree(tmp_path / "run")
    agent.start()
    reconnect_through_a_silent_drop(st, netns, agent)
    events = wait_for(lambda: device_events(st, device_id), 10, interval=0.2,
                      what="the connectivity report filed")
    assert [e["type"] for e in events] == ["network"], events
    assert events[0]["detail"].startswith("Local network up but server unreachable")

    agent.stop()
    # what a boot leaves: a mark of the last start that names another boot
    (tmp_path / "state" / "last-start-boot-id").write_text("0d9c2b6e-previous-boot\n")
    agent.start()
    agent.wait_live(15)
    events = wait_for(lambda: device_events(st, device_id)[1:], 10, interval=0.2,
                      what="the boot reported")
    assert events == [{"type": "reboot", "reason": "reboot",
                       "detail": "Device restarted (power/reboot)"}]


@only_19
def test_the_screens_own_link_lost_and_back_is_filed_as_a_lost_link(
        st, netns, spawn_agent, agent_python, tmp_path):
    subprocess.run(["ip", "link", "add", "eth-edge", "type", "veth", "peer", "name", "eth-switch"],
                   check=True)
    for end in ("eth-edge", "eth-switch"):
        subprocess.run(["ip", "link", "set", end, "up"], check=True)
    agent = spawn_agent(agent_python, st_config(st, tmp_path))
    device_id = register_and_pair(st, agent, tmp_path)

    def cable_out_and_in():  # the switch's end goes dark: the screen's loses its carrier
        subprocess.run(["ip", "link", "set", "eth-switch", "down"], check=True)
        time.sleep(1.0)
        subprocess.run(["ip", "link", "set", "eth-switch", "up"], check=True)
    reconnect_through_a_silent_drop(st, netns, agent, while_down=cable_out_and_in)
    events = wait_for(lambda: device_events(st, device_id), 10, interval=0.2,
                      what="the connectivity report filed")
    assert events == [{"type": "network", "reason": "network",
                       "detail": "Wi\u2011Fi/Ethernet link lost"}], events
