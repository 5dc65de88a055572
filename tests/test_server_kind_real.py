"""#50: only the url set, the agent finds out what it speaks to, from the real servers'
own answers: ScreenTinker 1.2 and 1.9 (GET /api/version) and this project's reference
fleet server (POST /api/v1/enroll without a device id: 400). It says which and why,
keeps it across restarts, and an explicit profile still wins (#49: doctor then fails)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from devtools import screentinker_peer as peer
from devtools.harness import REPO, agent_config, wait_for
from tests.test_screentinker_real import PING_S, generation, only_19  # noqa: F401

pytestmark = pytest.mark.netns

NO_IDENTITY = {"device_id": None, "token": None}


@pytest.fixture
def st(netns, tmp_path, generation):  # noqa: F811
    server = peer.ScreenTinkerServer(tmp_path, generation, ping_interval_s=PING_S,
                                     ping_timeout_s=PING_S)
    server.start()
    yield server
    server.stop()


def url_only(at, tmp_path, /, profile=None):
    """agent.toml with no profile (None): what the README's install block writes."""
    class Url:
        url = at.url
        devices = {}
    return agent_config(Url, tmp_path, identity=NO_IDENTITY, server={"profile": profile})


def run_cli(agent_python, cfg, *args) -> subprocess.CompletedProcess:
    return subprocess.run([agent_python, "-m", "agent", *args, "--config", str(cfg)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def started_with_only_the_url(at, spawn_agent, agent_python, tmp_path, what: str):
    """An agent with no profile, its config, its pairing code and its profile's status."""
    cfg = url_only(at, tmp_path)
    agent = spawn_agent(agent_python, cfg)
    code = wait_for(lambda: (agent.status().get("pairing") or {}).get("code"), 30,
                    what=f"a pairing code from {what}")
    return agent, cfg, code, agent.status()["profile"]


def record(tmp_path) -> dict:
    return json.loads((tmp_path / "state" / "server-kind.json").read_text())


def test_a_screen_with_only_the_url_pairs_with_screentinker_and_keeps_what_it_found(
        st, spawn_agent, agent_python, tmp_path):
    agent, cfg, code, profile = started_with_only_the_url(st, spawn_agent, agent_python,
                                                          tmp_path, "the ScreenTinker profile")
    assert profile["profile"] == "screentinker" and profile["how"] == "recorded", profile
    assert f"ScreenTinker {'1.2.0' if st.generation == '1.2' else '1.9'}" in profile["why"]
    kept = record(tmp_path)
    assert kept["url"] == st.url and kept["profile"] == "screentinker", kept
    log = agent.log_text()
    assert "server profile screentinker: detected" in log and "restarting with it" in log, log
    st.wait_row("SELECT * FROM devices WHERE pairing_code = ?", code.replace("-", ""))
    st.pair(code)
    wait_for(lambda: agent.status().get("pairing", {}).get("state") == "paired", 15,
             what="the agent to see device:paired")
    said = run_cli(agent_python, cfg, "status").stdout
    assert "profile     screentinker (detected at an earlier start: ScreenTinker" in said, said
    # a restart asks nothing: the record stands for this url, written once
    stamp = os.stat(tmp_path / "state" / "server-kind.json").st_mtime_ns
    agent.stop()
    again = spawn_agent(agent_python, cfg)
    wait_for(lambda: again.status().get("pairing", {}).get("state") == "paired", 20,
             what="the restarted agent paired, at once with the recorded profile")
    assert os.stat(tmp_path / "state" / "server-kind.json").st_mtime_ns == stamp
    checked = run_cli(agent_python, cfg, "check-config").stdout
    assert "profile   auto (built-in default): screentinker, detected" in checked, checked
    doctor = run_cli(agent_python, cfg, "doctor", "--json")
    steps = {s["name"]: s for s in json.loads(doctor.stdout)["steps"]}
    assert steps["profile"]["verdict"] == "ok" and "auto: screentinker" in steps["profile"]["said"]


def test_a_screen_with_only_the_url_enrolls_with_the_reference_server(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    server = fleet(devices={})
    agent, _, code, profile = started_with_only_the_url(server, spawn_agent, agent_python,
                                                        tmp_path, "the edge-agent enrollment")
    assert profile["profile"] == "edge-agent" and profile["how"] == "detected", profile
    assert "400" in profile["why"]
    assert record(tmp_path)["profile"] == "edge-agent"
    assert "restarting" not in agent.log_text()   # built right the first time
    assert server.pair(code).returncode == 0
    agent.wait_live(20)


@only_19
def test_an_explicit_profile_still_wins_and_the_doctor_fails_when_it_is_the_wrong_one(
        st, spawn_agent, agent_python, tmp_path):
    cfg = url_only(st, tmp_path, "edge-agent")
    agent = spawn_agent(agent_python, cfg)
    wait_for(lambda: (agent.status().get("pairing") or {}).get("error"), 20,
             what="the enrollment's answer")
    assert agent.status()["profile"]["how"] == "configured"
    assert not (tmp_path / "state" / "server-kind.json").exists()
    said = run_cli(agent_python, cfg, "status").stdout
    assert "answered 404 to edge-agent's enrollment" in said and "[server] profile" in said, said
    assert "next try    in 0 s (attempt 0)" not in said, said
    doctor = run_cli(agent_python, cfg, "doctor", "--json")
    report = json.loads(doctor.stdout)
    steps = {s["name"]: s for s in report["steps"]}
    assert doctor.returncode == 6, doctor.stdout
    assert steps["profile"]["verdict"] == "fail", steps["profile"]
    assert "ScreenTinker 1.9.33" in steps["profile"]["said"], steps["profile"]
    assert 'profile = "screentinker"' in steps["profile"]["todo"], steps["profile"]
