"""The screentinker profile against the reference server's ScreenTinker emulation.

The emulation (fleet_server/screentinker.py) does with each message what the real
server does (tests/test_screentinker_real.py holds the profile to the real one); it is
here for speed, and for the newer contract (heartbeat-ack, device:throttled) that the
released server lacks.
"""
import hashlib
import json
import subprocess
import time

import pytest

from devtools.harness import REPO, agent_config, wait_for

pytestmark = pytest.mark.netns

HB, ACK = 2.0, 1.0
NO_IDENTITY = {"device_id": None, "token": None}
JPEG = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 40


def st_agent(fleet, spawn_agent, agent_python, tmp_path, *server_args, **sections):
    server = fleet("--profile", "screentinker", *server_args, devices={"unused": "x" * 20})
    cfg = agent_config(server, tmp_path, server={"profile": "screentinker"},
                       identity=NO_IDENTITY, **sections)
    return server, spawn_agent(agent_python, cfg)


def code_of(agent):
    return (agent.status().get("pairing") or {}).get("code")


def tables(server):
    return server.admin("/admin/screentinker")


def paired(server, agent):
    code = wait_for(lambda: code_of(agent), 15, what="a pairing code")
    wait_for(lambda: code.replace("-", "") in tables(server)["pending"], 5,
             what="the code registered at the server")
    r = server.admin("/api/v1/pair", {"code": code})
    assert r["ok"]
    wait_for(lambda: agent.status().get("pairing", {}).get("state") == "paired", 10,
             what="device:paired heard")
    agent.wait_live(15)
    return r["device_id"]


def enqueue(agent_python, cfg, kind, payload: bytes):
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    return subprocess.run([agent_python, "-m", "agent", "enqueue", "--config", str(cfg),
                           "--kind", kind, "-"], input=payload, capture_output=True, env=env,
                          cwd=cfg.parent, timeout=30)


def test_the_code_is_in_the_file_the_journal_and_status_until_claimed(
        fleet, spawn_agent, agent_python, tmp_path):
    """The emulation, as the real servers (tests/test_screentinker_real.py): the code in
    the player's file, one journal line and status (exit 4) until claimed, no expiry."""
    server, agent = st_agent(fleet, spawn_agent, agent_python, tmp_path)
    code_file = tmp_path / "run" / "pairing-code"
    code = wait_for(lambda: code_file.exists() and code_file.read_text().strip(), 15,
                    what="the pairing code file")
    assert code.replace("-", "") in tables(server)["pending"]
    assert (f"pairing code {code}: enter it on the ScreenTinker dashboard (Add display) "
            f"(no expiry while this screen stays connected)") in agent.log_text()
    cfg = tmp_path / "agent.toml"
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([agent_python, "-m", "agent", "status", "--json", "--config", str(cfg)],
                       capture_output=True, text=True, env=env, timeout=30)
    doc = json.loads(r.stdout)
    assert r.returncode == 4 and doc["claimed"] is False, r.stdout
    assert doc["pairing"]["expires_in_s"] is None and doc["pairing"]["code"] == code
    paired(server, agent)
    assert not code_file.exists()
    r = subprocess.run([agent_python, "-m", "agent", "status", "--config", str(cfg)],
                       capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0 and "pairing     claimed (paired)" in r.stdout, r.stdout
    assert agent.log_text().count(f"pairing code {code}:") == 1


def test_registered_then_claimed_then_reconnects_register_with_the_token_without_a_storm(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    server, agent = st_agent(fleet, spawn_agent, agent_python, tmp_path)
    device_id = paired(server, agent)
    creds = json.loads((tmp_path / "state" / "credentials.json").read_text())
    assert creds["server_device_id"] == device_id and creds["claimed"] is True
    # registered with the code, then once more with the token after device:paired
    assert tables(server)["registers"].get(device_id) == 1
    t0 = time.time()
    server.admin("/admin/throttle", {"device_id": device_id, "retry_after_s": 3})
    back = wait_for(lambda: [t for t in server.device(device_id)["connect_times"] if t > t0], 10,
                    what="reconnect after device:throttled")
    assert back[0] - t0 >= 3.0, "connected again inside the throttle hold"
    for _ in range(2):
        server.admin("/admin/throttle", {"device_id": device_id, "retry_after_s": 1})
        time.sleep(2.5)
    agent.wait_live(10)
    registers = tables(server)["registers"][device_id]
    # each accepted register counts as a connect at the server, the first (by code) too
    assert registers == server.device(device_id)["connects"] - 1, "one register per connect"
    assert agent.status()["device_id"] == device_id
    assert len(tables(server)["devices"]) == 2  # ours and the pre-provisioned one


def test_deleted_on_the_dashboard_means_a_new_code_on_the_next_register(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    server, agent = st_agent(fleet, spawn_agent, agent_python, tmp_path)
    device_id = paired(server, agent)
    old_code = code_of(agent)
    server.admin("/admin/revoke", {"device_id": device_id})
    server.admin("/admin/throttle", {"device_id": device_id, "retry_after_s": 1})  # a reconnect
    new = wait_for(lambda: code_of(agent) if code_of(agent) not in (None, old_code) else None, 15,
                   what="a new pairing code")
    wait_for(lambda: new.replace("-", "") in tables(server)["pending"], 5, what="registered anew")
    assert "the server no longer knows this device" in agent.log_text()
    creds = tmp_path / "state" / "credentials.json"
    wait_for(creds.exists, 5, what="the new registration's credentials")  # it answers after
    assert json.loads(creds.read_text())["claimed"] is False


def test_silent_drop_heals_within_the_same_bound_when_the_server_acks(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    server, agent = st_agent(fleet, spawn_agent, agent_python, tmp_path)
    device_id = paired(server, agent)
    link = agent.wait_live(10)
    port = int(link["local_addr"].rsplit(":", 1)[1])
    time.sleep(0.5)
    netns.drop_flow(port, server.port)
    t_drop = time.time()
    new = wait_for(lambda: [t for t in server.device(device_id)["connect_times"] if t > t_drop],
                   HB + ACK + 5, what="a new connection")
    assert new[0] - t_drop < HB + ACK + 1.0
    agent.wait_live(5)
    reports = wait_for(lambda: server.device(device_id)["reports"], 3 * HB, what="connectivity report")
    # the server's own words: a JSON true means the screen's own link went down, which it
    # did not; a restart of a process is not a boot either
    assert reports[-1]["link_lost"] is False and reports[-1]["cold_start"] is False
    assert reports[-1]["offline_ms"] >= 0


def test_the_released_server_without_heartbeat_ack_never_makes_the_agent_flap(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    server, agent = st_agent(fleet, spawn_agent, agent_python, tmp_path, "--ack-mode", "none",
                             "--ping-interval", "2", "--ping-timeout", "2")
    device_id = paired(server, agent)
    time.sleep(4 * HB)
    assert agent.link()["connection"] == 1, "no ACKs must not mean reconnects"
    assert agent.link()["proven_live"], "its pings prove the link"
    assert server.device(device_id)["heartbeats"] >= 3
    port = int(agent.link()["local_addr"].rsplit(":", 1)[1])
    netns.drop_flow(port, server.port)
    wait_for(lambda: agent.link().get("connection") not in (None, 1), 15,
             what="a reconnect after silence")
    # noticed by the silence watchdog, or sooner by the kernel's word on the heartbeat
    assert "nothing received for" in agent.log_text() or \
        "acknowledged no heartbeat" in agent.log_text()


def test_uploads_wait_for_the_claim_and_arrive_as_the_server_reads_them(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    server, agent = st_agent(fleet, spawn_agent, agent_python, tmp_path,
                             uploads={"base_s": 1.0, "cap_s": 2.0})
    cfg = tmp_path / "agent.toml"
    code = wait_for(lambda: code_of(agent), 15, what="a pairing code")
    server.admin("/admin/screentinker", {"content_id": "c-1"})
    for kind, record in (("screenshot", JPEG),
                         ("proof-of-play", {"event": "play_start", "content_id": "c-1",
                                            "content_name": "Welcome"}),
                         ("proof-of-play", {"event": "play_end", "content_id": "c-1",
                                            "completed": True})):
        payload = record if isinstance(record, bytes) else json.dumps(record).encode()
        r = enqueue(agent_python, cfg, kind, payload)
        assert r.returncode == 0, r.stderr
    r = enqueue(agent_python, cfg, "log", b"a log")
    assert r.returncode == 2 and "carries no log uploads" in r.stderr.decode()
    time.sleep(2 * HB)
    assert agent.status()["uploads"]["items"] == 3, "sent before the operator claimed it"
    wait_for(lambda: code.replace("-", "") in tables(server)["pending"], 5, what="registered")
    device_id = server.admin("/api/v1/pair", {"code": code})["device_id"]
    wait_for(lambda: agent.status()["uploads"]["items"] == 0, 15, what="the queue drained")
    t = tables(server)
    assert t["screenshots"][device_id] == hashlib.sha256(JPEG).hexdigest()
    assert [(p["content_id"], p["completed"]) for p in t["play_logs"]] == [("c-1", True)]


def test_delivery_is_proven_by_a_later_heartbeat_ack_and_a_silent_drop_loses_nothing(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    """Uploads are never ACKed: delivery is proven by the ACK of a later heartbeat on the
    same connection. An upload emitted into a silently dropped link is never taken as sent."""
    hb, ack = 4.0, 2.0  # the drop goes unnoticed for >= 2 s: the upload meets a dead link
    server, agent = st_agent(fleet, spawn_agent, agent_python, tmp_path,
                             uploads={"base_s": 1.0, "cap_s": 2.0},
                             link={"heartbeat_interval_s": hb, "ack_timeout_s": ack})
    cfg = tmp_path / "agent.toml"
    device_id = paired(server, agent)
    assert enqueue(agent_python, cfg, "screenshot", JPEG).returncode == 0
    wait_for(lambda: agent.status()["uploads"]["items"] == 0, 3 * (hb + ack) + 5,
             what="delivery proven by a heartbeat ack")
    assert tables(server)["screenshots"][device_id] == hashlib.sha256(JPEG).hexdigest()
    port = int(agent.link()["local_addr"].rsplit(":", 1)[1])
    netns.drop_flow(port, server.port)
    second = JPEG + b"second"
    assert enqueue(agent_python, cfg, "screenshot", second).returncode == 0
    wait_for(lambda: agent.link().get("connection") not in (None, 1), hb + ack + 5,
             what="a reconnect after the silent drop")
    wait_for(lambda: agent.status()["uploads"]["items"] == 0, 4 * (hb + ack) + 10,
             what="the second screenshot delivered on the new connection")
    assert "link lost before delivery was proven" in agent.log_text(), \
        "the second screenshot never met the dead link: the test proved nothing"
    assert tables(server)["screenshots"][device_id] == hashlib.sha256(second).hexdigest()


def test_commands_not_allowed_are_refused_out_loud_not_dropped(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    # 1.2 sends the dashboard's every command
    server, agent = st_agent(fleet, spawn_agent, agent_python, tmp_path, "--ack-mode", "none")
    device_id = paired(server, agent)
    for command in ("reboot", "screen_off", "screenshot"):
        assert server.admin("/admin/screentinker", {"device_id": device_id, "command": command}) \
            == {"delivered": True}
    refused = wait_for(lambda: len(agent.status().get("commands", [])) >= 3
                       and agent.status()["commands"], 10, what="three refusals")
    # its command types mapped onto the agent's; none of them allowed by default. In any
    # order: python-engineio 4.3 (bookworm) runs each message's handler on a thread of its own
    assert sorted(c["command"] for c in refused) == ["display", "reboot", "screenshot"]
    assert all(c["result"].startswith("refused: ") and "not allowed" in c["result"]
               for c in refused)


def test_the_server_sends_a_command_only_for_a_capability_the_allow_list_declares(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    # 1.9 gates each command on the screen's declared capabilities
    dark = tmp_path / "display-off"
    server, agent = st_agent(fleet, spawn_agent, agent_python, tmp_path, commands={
        "allow": ["diagnostics", "logs", "display"], "display_off_command": f"touch {dark}"})
    device_id = paired(server, agent)
    assert tables(server)["devices"][device_id]["capabilities"] == ["display.power"]
    for command, capability in (("reboot", "system.reboot"), ("screenshot", "remote.screenshot")):
        assert server.admin("/admin/screentinker", {"device_id": device_id, "command": command}) \
            == {"delivered": False, "reason": "unsupported", "capability": capability}
    assert server.admin("/admin/screentinker", {"device_id": device_id, "command": "screen_off"}) \
        == {"delivered": True}
    wait_for(dark.exists, 10, what="the display_off command run")
    done = wait_for(lambda: agent.status().get("commands"), 10, what="the command reported")
    assert [(c["command"], c["result"].startswith("refused")) for c in done] == [("display", False)]


def test_the_dashboards_terminal_reaches_the_agent_only_where_the_shell_is_allowed(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    """1.9's shell {cmd} runs one line as the agent's user and its device:shell-result
    reaches the dashboard's terminal; set_time is sent only with system.time declared."""
    server, agent = st_agent(fleet, spawn_agent, agent_python, tmp_path, commands={
        "allow": ["diagnostics", "logs", "shell"], "timeout_s": 5})
    device_id = paired(server, agent)
    assert tables(server)["devices"][device_id]["capabilities"] == ["system.shell"]
    assert server.admin("/admin/screentinker", {"device_id": device_id, "command": "set_time",
                                                "payload": {"millis": 1800000000000}}) \
        == {"delivered": False, "reason": "unsupported", "capability": "system.time"}
    assert server.admin("/admin/screentinker", {"device_id": device_id, "command": "shell",
                                                "payload": {"cmd": "echo $((6 * 7)); exit 3"}}) \
        == {"delivered": True}
    [result] = wait_for(lambda: tables(server)["shell_results"], 10, what="the shell's result")
    assert result == {"device_id": device_id, "cmd": "echo $((6 * 7)); exit 3",
                      "output": "42\n", "exit": 3}
    [done] = wait_for(lambda: agent.status().get("commands"), 10, what="the command reported")
    assert done["command"] == "shell" and done["result"] == "failed: 42\n"
