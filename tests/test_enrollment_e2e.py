"""From a fresh agent to a paired, online screen, on loopback, against the reference server."""
import json
import os
import re
import subprocess
import sys
import time

import pytest
import requests
import socketio

from devtools.harness import REPO, agent_config, wait_for

pytestmark = pytest.mark.netns

NO_IDENTITY = {"device_id": None, "token": None}


def pairing_code(agent):
    return (agent.status().get("pairing") or {}).get("code")


def pair(server, code):
    return server.pair(code)


def test_code_shown_then_paired_then_online_then_revoked_and_re_enrolled(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    server = fleet(devices={})
    cfg = agent_config(server, tmp_path, identity=NO_IDENTITY)
    agent = spawn_agent(agent_python, cfg)
    code = wait_for(lambda: pairing_code(agent), 15, what="a pairing code")
    assert (tmp_path / "run" / "pairing-code").read_text().strip() == code
    assert f"pairing code {code}" in agent.log_text()
    # the enroller may show the code a moment before the link thread's first status
    wait_for(lambda: agent.link().get("state") == "unpaired", 5, what="the link unpaired")
    status = subprocess.run([agent_python, "-m", "agent", "status", "--config", str(cfg)],
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    # unclaimed, with the code and its deadline: exit 4, apart from a degraded screen's 1
    assert status.returncode == 4, status.stdout
    assert re.search(rf"pairing     unclaimed: code {code} \(enter it on the fleet server; "
                     rf"expires in \d+ min\)", status.stdout), status.stdout
    time.sleep(6)
    assert pairing_code(agent) == code, "the same code stays until used or expired"

    r = pair(server, code)
    assert r.returncode == 0, r.stderr
    agent.wait_live(15, connection=1)
    creds = tmp_path / "state" / "credentials.json"
    assert oct(os.stat(creds).st_mode & 0o777) == "0o600"
    token = json.loads(creds.read_text())["token"]
    device_id = agent.status()["device_id"]
    assert (tmp_path / "state" / "device_id").read_text().strip() == device_id
    for text in (agent.log_text(), json.dumps(agent.status())):
        assert token not in text, "the token leaked"

    server.admin("/admin/revoke", {"device_id": device_id})
    new_code = wait_for(lambda: pairing_code(agent) if pairing_code(agent) not in (None, code) else None,
                        20, what="a new code after revocation")
    assert not creds.exists()
    assert pair(server, new_code).returncode == 0
    agent.wait_live(15)
    assert agent.status()["device_id"] == device_id, "the identity survives re-pairing"
    refused = server.device(device_id)["refused"]
    assert refused <= 3, f"{refused} refused connects: the agent looped on a revoked token"


def test_fifty_devices_behind_one_address_enroll_and_connect(netns, fleet):
    server = fleet(devices={})
    clients = []
    try:
        for i in range(50):
            device_id = f"site-a-{i:02d}"
            r = requests.post(server.url + "/api/v1/enroll", json={"device_id": device_id}, timeout=5)
            assert r.status_code == 200
            enr = r.json()
            p = requests.post(server.url + "/api/v1/pair", json={"code": enr["pairing_code"]},
                              headers={"X-Operator": f"installer-{i % 5}"}, timeout=5)
            assert p.status_code == 200, p.text
            poll = requests.get(f"{server.url}/api/v1/enroll/{device_id}", timeout=5,
                                headers={"Authorization": "Bearer " + enr["poll_secret"]}).json()
            sio = socketio.Client(reconnection=False)
            sio.connect(server.url, auth={"device_id": device_id, "token": poll["token"]},
                        transports=["websocket"], wait_timeout=5)
            clients.append(sio)
        devices = server.admin("/admin/devices")
        assert sum(1 for d in devices.values() if d["online"]) == 50
        assert sum(d["refused"] for d in devices.values()) == 0
    finally:
        for c in clients:
            c.disconnect()


def test_pairing_attempts_are_limited_per_operator(netns, fleet):
    server = fleet(devices={})
    codes = [f"{n:06d}" for n in range(7)]
    answers = [requests.post(server.url + "/api/v1/pair", json={"code": c},
                             headers={"X-Operator": "mallory"}, timeout=5).status_code for c in codes]
    assert answers[:5] == [404] * 5 and answers[5:] == [429, 429]
    other = requests.post(server.url + "/api/v1/pair", json={"code": "000000"},
                          headers={"X-Operator": "alice"}, timeout=5)
    assert other.status_code == 404  # another operator is not locked out


def test_a_paired_device_is_throttled_softly_an_unknown_flapper_is_quarantined(netns, fleet):
    server = fleet(devices={"screen-1": "s3cret-token"})
    throttles = []
    accepted = 0
    for _ in range(100):
        sio = socketio.Client(reconnection=False)
        sio.on("server:throttle", lambda data: throttles.append(data))
        sio.connect(server.url, auth={"device_id": "screen-1", "token": "s3cret-token"},
                    transports=["websocket"], wait_timeout=5)
        accepted += 1
        time.sleep(0.02)
        sio.disconnect()
    assert accepted == 100, "a paired device must never be refused"
    assert len(throttles) >= 50 and throttles[0] == {"retry_after_s": 30.0}
    refusals = []
    for _ in range(100):
        sio = socketio.Client(reconnection=False)
        sio.on("connect_error", lambda data: refusals.append(data))
        try:
            sio.connect(server.url, auth={"device_id": "stranger", "token": "guess"},
                        transports=["websocket"], wait_timeout=5)
        except socketio.exceptions.ConnectionError:
            pass
    assert "stranger" in server.admin("/admin/limiter")["quarantined"]
    assert "screen-1" not in server.admin("/admin/limiter")["quarantined"]
    assert any("quarantined" in str(r) for r in refusals)


def test_a_server_outage_is_not_a_refusal_the_paired_device_keeps_its_token(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    """Regression: python-socketio reports a failed TCP connect through connect_error
    too; that must never make an enrolled device drop its credentials."""
    server = fleet(devices={})
    agent, _, creds, before = _paired(server, spawn_agent, agent_python, tmp_path)
    port = server.port
    server.kill()
    wait_for(lambda: (agent.link().get("attempts") or 0) >= 3, 20, what="failed attempts")
    assert creds.read_text() == before
    assert pairing_code(agent) is None
    # the server comes back with its memory (a real one has a database)
    server.port = port
    server.devices = {agent.status()["device_id"]: json.loads(before)["token"]}
    server.start()
    agent.wait_live(15)
    assert creds.read_text() == before


def test_a_connect_refused_for_now_is_no_refusal_of_the_token_the_device_waits_and_keeps_it(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    """A server that refuses a connect for now (a node rebalancing its fleet, one that
    sheds load: ``ConnectionRefusedError(message, {"retry_after_s": N})``) has not refused
    the credentials: the paired device keeps its token, waits what it was told, and is
    back on the same token once the server takes it (it used to drop the token and pair
    again: a fleet server's rebalance would have unpaired the screens it moved)."""
    server = fleet(devices={})
    again, creds, before = _paired_then_refused_for_now(
        server, spawn_agent, agent_python, tmp_path, 2.0)
    def refused(n):
        link = again.link()
        return link.get("reason") == "throttle" and (link.get("attempts") or 0) >= n
    wait_for(lambda: refused(1), 15, what="a connect refused for now")
    first = time.monotonic()
    wait_for(lambda: refused(3), 15, what="three connects refused for now")
    # the server's 2 s between tries, not the backoff's fraction of a second
    assert time.monotonic() - first >= 3.5
    assert "(throttle: busy), retrying in 2.0s" in again.log_text()
    assert creds.read_text() == before and pairing_code(again) is None
    server.admin("/admin/behaviour", {"refuse_for_now_s": 0.0})
    again.wait_live(15)
    assert creds.read_text() == before
    assert server.device(again.status()["device_id"])["refused"] == 0


def test_a_connect_refused_for_now_with_a_bad_retry_after_keeps_the_token_too(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    """A buggy server's retry_after_s (NaN here, on the real wire) still says "for now":
    the paired device keeps its token and holds the least (1 s, then its backoff); it
    used to read it as a refusal of the credentials and drop the token, so every screen
    of that server waited for a person to pair it again."""
    server = fleet(devices={})
    again, creds, before = _paired_then_refused_for_now(
        server, spawn_agent, agent_python, tmp_path, "NaN")
    wait_for(lambda: (again.link().get("reason") == "throttle"
                      and (again.link().get("attempts") or 0) >= 2), 15,
             what="two connects refused for now")
    assert creds.exists() and creds.read_text() == before and pairing_code(again) is None
    server.admin("/admin/behaviour", {"refuse_for_now_s": 0.0})
    again.wait_live(15)
    assert creds.read_text() == before


def _paired(server, spawn_agent, agent_python, tmp_path):
    """An agent with no identity, paired with ``server`` and live: (the agent, its
    config, its credentials file, their text)."""
    cfg = agent_config(server, tmp_path, identity=NO_IDENTITY)
    agent = spawn_agent(agent_python, cfg)
    code = wait_for(lambda: pairing_code(agent), 15, what="a pairing code")
    assert pair(server, code).returncode == 0
    agent.wait_live(15, connection=1)
    creds = tmp_path / "state" / "credentials.json"
    return agent, cfg, creds, creds.read_text()


def _paired_then_refused_for_now(server, spawn_agent, agent_python, tmp_path, retry_after):
    """An agent paired, stopped, and started again once the server refuses every connect
    for now with ``retry_after``: (the agent, its credentials file, their text)."""
    agent, cfg, creds, before = _paired(server, spawn_agent, agent_python, tmp_path)
    agent.stop()
    server.admin("/admin/behaviour", {"refuse_for_now_s": retry_after})
    return spawn_agent(agent_python, cfg), creds, before
