"""A real agent against servers that answer everything wrong (#49): 404, 500, and 200 with
garbage, to every path, for a minute. Whatever a server answers, the agent's requests
stay within what its backoff's cap allows: no path retries at once."""
from __future__ import annotations

import contextlib
import os
import subprocess
import time

import pytest

from devtools.harness import REPO, AgentProcess, agent_config, wait_for
from devtools.hostile_http import answering_server

NO_IDENTITY = {"device_id": None, "token": None}
WATCH_S = 60.0
# Enrollment backs off from 2 s doubling to 120 s, full jitter (identity/enrollment.py),
# as the server-kind probe does (link/server_kind.py): about 7 requests in the first
# minute each, expected; at once, a 404 made 15,000 to 23,000 a minute.
MOST_IN_A_MINUTE = 40

ANSWERS = {"404": (404, b'{"error": "Not found"}'), "500": (500, b"oops"),
           "garbage": (200, b"<html>\x00\xff not json")}


def status_text(agent_python, cfg) -> str:
    return subprocess.run([agent_python, "-m", "agent", "status", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PYTHONPATH": str(REPO)}).stdout


@pytest.mark.parametrize("profile", [None, "edge-agent"], ids=["auto", "edge-agent"])
def test_a_minute_against_servers_that_answer_everything_wrong_stays_within_the_backoff(
        agent_python, tmp_path, profile):
    seen = {name: [] for name in ANSWERS}
    agents = {}
    with contextlib.ExitStack() as stack:
        for name, (status, body) in ANSWERS.items():
            url = stack.enter_context(answering_server(body, {"Content-Type": "application/json"},
                                                       status=status, seen=seen[name]))

            class Server:
                devices = {}
            Server.url = url
            work = tmp_path / name
            work.mkdir()
            cfg = agent_config(Server, work, identity=NO_IDENTITY, server={"profile": profile})
            agent = AgentProcess(agent_python, cfg, work).start()
            stack.callback(agent.stop)
            agents[name] = (agent, cfg)
        started = time.monotonic()
        wait_for(lambda: all(a.status() for a, _ in agents.values()), 15,
                 what="every agent's first status")
        time.sleep(max(0.0, WATCH_S - (time.monotonic() - started)))
        counts = {name: len(s) for name, s in seen.items()}
        texts = {name: status_text(agent_python, cfg) for name, (_, cfg) in agents.items()}
        for name, (agent, _) in agents.items():
            assert agent.alive(), agent.log_text()[-2000:]
    print(f"\n[{profile or 'auto'}] requests in {WATCH_S:.0f} s: {counts}")
    paths = {name: sorted({f"{m} {p.split('?')[0]}" for _, m, p in s}) for name, s in seen.items()}
    assert all(counts.values()), (counts, paths)
    assert max(counts.values()) <= MOST_IN_A_MINUTE, (counts, paths)
    said = texts["404"]
    if profile == "edge-agent":
        assert "answered 404 to edge-agent's enrollment" in said, said
        assert "ScreenTinker" in said and "[server] profile" in said, said
    else:
        assert "not recognised" in said and "404" in said, said
        assert "[server] profile" in said, said
