"""The upload queue against the real reference server, and killed with -9 mid-flight."""
import random
import subprocess
import time

import pytest

from devtools.harness import REPO, agent_config, wait_for
from devtools.queue_churn import Churn

pytestmark = pytest.mark.netns


def test_kill_9_mid_upload_and_mid_enqueue_loses_nothing_and_stores_nothing_twice(
        netns, fleet, tmp_path):
    server = fleet()
    churn = Churn(tmp_path / "queue", server, tmp_path / "enqueued.log", REPO)
    rng = random.Random(7)
    for round_no in range(50):
        churn.killed_after(round_no, rng.uniform(0.1, 0.6))
    names, hashes = churn.assert_delivered(at_least=500)
    print(f"\n{len(names)} items enqueued across 50 kill -9s, {len(hashes)} stored once each, "
          f"{server.device()['upload_repeats']} retries deduplicated by Idempotency-Key")


def test_enqueue_cli_and_one_failing_item_does_not_hold_up_the_rest(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    server = fleet()
    cfg = agent_config(server, tmp_path, uploads={"base_s": 1.0, "cap_s": 4.0})
    agent = spawn_agent(agent_python, cfg)
    agent.wait_live(15)
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    for i in range(5):
        payload = f"screenshot-{i}" + ("-FAIL500" if i == 2 else "")
        r = subprocess.run([agent_python, "-m", "agent", "enqueue", "--config", str(cfg),
                            "--kind", "screenshot", "-"], input=payload.encode(),
                           capture_output=True, env=env, cwd=tmp_path, timeout=30)
        assert r.returncode == 0, r.stderr
    wait_for(lambda: server.device()["uploads"] == 4, 5, what="the four good items")
    # the failing one goes on being retried with backoff, never in a tight loop
    time.sleep(6)
    attempts = len(server.device()["upload_requests"]) - 4
    assert 2 <= attempts <= 5, f"{attempts} attempts for the failing item in ~6 s"
    assert agent.status()["uploads"]["items"] == 1
