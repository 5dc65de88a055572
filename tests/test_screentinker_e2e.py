"""The screentinker profile against the reference server's ScreenTinker emulation."""
import hashlib
import json
import subprocess
import time

import pytest

from devtools.harness import REPO, agent_config, wait_for

pytestmark = pytest.mark.netns

HB, ACK = 2.0, 1.0
NO_IDENTITY = {"device_id": None, "token": None}


def st_agent(fleet, spawn_agent, agent_python, tmp_path, *server_args, **sections):
    server = fleet("--profile", "screentinker", *server_args, devices={})
    cfg = agent_config(server, tmp_path, server={"profile": "screentinker"},
                       identity=NO_IDENTITY, **sections)
    return server, spawn_agent(agent_python, cfg)


def code_of(agent):
    return (agent.status().get("pairing") or {}).get("code")


def paired(server, agent):
    code = wait_for(lambda: code_of(agent), 15, what="a pairing code")
    assert code.replace("-", "") in server.admin("/admin/screentinker")["pending"] or wait_for(
        lambda: code.replace("-", "") in server.admin("/admin/screentinker")["pending"], 5,
        what="the code registered at the server")
    r = server.admin("/api/v1/pair", {"code": code})
    assert r["ok"]
    agent.wait_live(15)
    return r["device_id"]


def test_pairing_by_code_then_reconnects_register_with_the_token_without_a_storm(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    server, agent = st_agent(fleet, spawn_agent, agent_python, tmp_path)
    device_id = paired(server, agent)
    creds = json.loads((tmp_path / "state" / "credentials.json").read_text())
    assert creds["server_device_id"] == device_id
    registers = server.admin("/admin/screentinker")["registers"]
    assert registers.get(device_id) == 1  # the one refresh register after device:paired
    t0 = time.time()
    server.admin("/admin/throttle", {"device_id": device_id, "retry_after_s": 3})
    back = wait_for(lambda: [t for t in server.device(device_id)["connect_times"] if t > t0], 10,
                    what="reconnect after device:throttled")
    assert back[0] - t0 >= 3.0, "connected again inside the throttle hold"
    for _ in range(2):  # the server sends device:paired on every reconnect
        server.admin("/admin/throttle", {"device_id": device_id, "retry_after_s": 1})
        time.sleep(2.5)
    agent.wait_live(10)
    registers = server.admin("/admin/screentinker")["registers"]
    connects = server.device(device_id)["connects"]
    assert registers[device_id] == connects, "one register per connect, none in answer to device:paired"
    assert agent.status()["device_id"] == device_id


def test_unpaired_gives_one_re_register_after_the_settle_window(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    server, agent = st_agent(fleet, spawn_agent, agent_python, tmp_path)
    device_id = paired(server, agent)
    old_code = code_of(agent)
    server.admin("/admin/behaviour", {"st_settle_s": 3.0})
    t0 = time.time()
    server.admin("/admin/revoke", {"device_id": device_id})
    new = wait_for(lambda: [c for c in server.admin("/admin/screentinker")["pending"]
                            if c != (old_code or "").replace("-", "")], 10,
                   what="a register with a new pairing code")
    assert time.time() - t0 >= 3.0 - 0.2, "re-registered inside the settle window"
    time.sleep(3)
    assert len(server.admin("/admin/screentinker")["pending"]) == 1, "exactly one re-register"
    assert not (tmp_path / "state" / "credentials.json").exists()
    assert code_of(agent).replace("-", "") == new[0]


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
    assert reports[-1]["link_lost"] == "ack-timeout" and reports[-1]["offline_ms"] >= 0


def test_an_old_server_without_heartbeat_ack_never_makes_the_agent_flap(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    server, agent = st_agent(fleet, spawn_agent, agent_python, tmp_path, "--ack-mode", "none",
                             "--ping-interval", "2", "--ping-timeout", "2")
    code = wait_for(lambda: code_of(agent), 15, what="a pairing code")
    wait_for(lambda: code.replace("-", "") in server.admin("/admin/screentinker")["pending"], 5,
             what="registered")
    device_id = server.admin("/api/v1/pair", {"code": code})["device_id"]
    wait_for(lambda: agent.link().get("state") == "online", 10, what="online")
    time.sleep(4 * HB)
    assert agent.link()["connection"] == 1, "no ACKs must not mean reconnects"
    assert server.device(device_id)["heartbeats"] >= 3
    # a silent drop is still caught, by inbound silence (server pings every 2 s)
    port = int(agent.link()["local_addr"].rsplit(":", 1)[1])
    netns.drop_flow(port, server.port)
    wait_for(lambda: agent.link().get("connection") not in (None, 1), 15,
             what="a reconnect after silence")
    assert "nothing received for" in agent.log_text()


def enqueue(agent_python, cfg, kind, payload: bytes):
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    return subprocess.run([agent_python, "-m", "agent", "enqueue", "--config", str(cfg),
                           "--kind", kind, "-"], input=payload, capture_output=True, env=env,
                          cwd=cfg.parent, timeout=30)


PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40


def test_screenshots_and_proof_of_play_go_through_the_queue_only_once_registered(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    server, agent = st_agent(fleet, spawn_agent, agent_python, tmp_path)
    cfg = tmp_path / "agent.toml"
    code = wait_for(lambda: code_of(agent), 15, what="a pairing code")
    for kind, payload in (("screenshot", PNG),
                          ("proof-of-play", json.dumps({"media": "a.mp4", "ms": 5000}).encode()),
                          ("proof-of-play", json.dumps({"media": "b.mp4", "ms": 7000}).encode())):
        r = enqueue(agent_python, cfg, kind, payload)
        assert r.returncode == 0, r.stderr
    r = enqueue(agent_python, cfg, "log", b"a log")
    assert r.returncode == 2 and "carries no log uploads" in r.stderr.decode()
    time.sleep(2 * HB)
    assert agent.status()["uploads"]["items"] == 3, "sent before the device was paired"
    wait_for(lambda: code.replace("-", "") in server.admin("/admin/screentinker")["pending"], 5,
             what="registered")
    device_id = server.admin("/api/v1/pair", {"code": code})["device_id"]
    wait_for(lambda: agent.status()["uploads"]["items"] == 0, 15, what="the queue drained")
    stored = server.admin(f"/admin/uploads/{device_id}")
    assert sorted(kind for kind, _ in stored.values()) == ["proof-of-play", "proof-of-play",
                                                          "screenshot"]
    assert hashlib.sha256(PNG).hexdigest() in {h for _, h in stored.values()}, \
        "the screenshot arrived altered"
    assert server.device(device_id)["upload_repeats"] == 0


def test_a_server_that_acks_only_heartbeats_still_gets_every_upload_and_a_silent_drop_loses_none(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    """No ACK for uploads: delivery is proven by the ACK of a later heartbeat on the same
    connection. An upload emitted into a silently dropped link is never taken as sent."""
    hb, ack = 4.0, 2.0  # the drop goes unnoticed for >= 2 s: the upload meets a dead link
    server, agent = st_agent(fleet, spawn_agent, agent_python, tmp_path,
                             uploads={"base_s": 1.0, "cap_s": 2.0},
                             link={"heartbeat_interval_s": hb, "ack_timeout_s": ack})
    cfg = tmp_path / "agent.toml"
    server.admin("/admin/behaviour", {"st_upload_ack": "none"})
    device_id = paired(server, agent)
    assert enqueue(agent_python, cfg, "screenshot", PNG).returncode == 0
    wait_for(lambda: agent.status()["uploads"]["items"] == 0, 3 * (hb + ack) + 5,
             what="delivery proven by a heartbeat ack")
    assert len(server.admin(f"/admin/uploads/{device_id}")) == 1
    port = int(agent.link()["local_addr"].rsplit(":", 1)[1])
    netns.drop_flow(port, server.port)
    assert enqueue(agent_python, cfg, "screenshot", PNG[::-1]).returncode == 0
    wait_for(lambda: agent.link().get("connection") not in (None, 1), hb + ack + 5,
             what="a reconnect after the silent drop")
    assert agent.status()["uploads"]["items"] <= 1
    wait_for(lambda: agent.status()["uploads"]["items"] == 0, 4 * (hb + ack) + 10,
             what="the second screenshot delivered on the new connection")
    assert "link lost before delivery was proven" in agent.log_text(), \
        "the second screenshot never met the dead link: the test proved nothing"
    stored = server.admin(f"/admin/uploads/{device_id}")
    assert len(stored) == 2 and server.device(device_id)["upload_repeats"] == 0
