"""Fleet reconnect storm: N agents (the real link, many per process) behind one
loopback address, the server killed and restarted after a short outage. Compared with
the same N on a fixed 30 s reconnect delay without jitter, as many players ship, and
with the server telling its devices a reconnect window (server:reconnect-window)."""
from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from devtools.harness import REPO, FleetServerProcess, agent_config, wait_for
from devtools.netns import NetNS

EDGE_AGENT = {"backoff": {"base_s": 1.0, "cap_s": 60.0, "jitter": "full"}}
WINDOW_S = 30.0
# mode -> (the agents' [link] settings, the server's arguments)
MODES = {
    "edge-agent": (EDGE_AGENT, ()),
    "edge-agent-window": (EDGE_AGENT, ("--reconnect-window", str(WINDOW_S))),
    "fixed-30s": ({"backoff": {"base_s": 30.0, "cap_s": 30.0, "jitter": "none"}}, ()),
}
LABELS = {"edge-agent": "edge-agent (1 s doubling to 60 s, full jitter)",
          "edge-agent-window": f"edge-agent, the server's reconnect window {WINDOW_S:g} s",
          "fixed-30s": "fixed 30 s, no jitter"}
PER_PROCESS = 50


@dataclass
class Storm:
    mode: str
    agents: int
    downtime_s: float
    peak_per_s: int = 0
    to_99_s: float | None = None
    to_100_s: float | None = None
    back: int = 0
    refused: int = 0
    quarantined: int = 0
    per_second: list = field(default_factory=list)
    error: str = ""


def _online(server) -> dict:
    return {k: v for k, v in server.admin("/admin/devices").items() if k.startswith("storm-")}


def run(mode: str, n: int, downtime_s: float, work: Path) -> Storm:
    work.mkdir(parents=True)
    r = Storm(mode, n, downtime_s)
    with NetNS():
        link, server_args = MODES[mode]
        server = FleetServerProcess(work, "--accept-any", *server_args).start()
        procs = []
        try:
            cfg = agent_config(server, work, server={"connect_timeout_s": 10.0},
                               link={"heartbeat_interval_s": 15.0, "ack_timeout_s": 5.0,
                                     "stable_after_s": 60.0, **link},
                               log={"level": "error"})
            log = open(work / "clients.log", "ab")
            for first in range(0, n, PER_PROCESS):
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "devtools.storm_client", "--config", str(cfg),
                     "--first", str(first), "--count", str(min(PER_PROCESS, n - first)),
                     "--ramp-s", "10"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT))
            wait_for(lambda: sum(1 for d in _online(server).values() if d["online"]) >= n,
                     120, interval=1.0, what=f"{n} agents online")
            time.sleep(3.0)
            server.kill()
            time.sleep(downtime_s)
            server.start()
            t_up = time.time()
            deadline = t_up + 120
            while time.time() < deadline:
                devs = _online(server)
                if sum(1 for d in devs.values() if d["online"]) >= n:
                    break
                time.sleep(1.0)
            devs = _online(server)
            firsts = sorted(min(d["connect_times"]) - t_up for d in devs.values() if d["connect_times"])
            all_connects = [t - t_up for d in devs.values() for t in d["connect_times"]]
            bins = Counter(int(t) for t in all_connects)
            r.per_second = [bins.get(s, 0) for s in range(0, int(max(all_connects, default=0)) + 1)]
            r.peak_per_s = max(bins.values(), default=0)
            r.back = len(firsts)
            if len(firsts) >= n:
                r.to_100_s = round(firsts[n - 1], 2)
            if len(firsts) >= int(0.99 * n):
                r.to_99_s = round(firsts[int(0.99 * n) - 1], 2)
            r.refused = sum(d.get("refused", 0) for d in devs.values())
            r.quarantined = len(server.admin("/admin/limiter").get("quarantined", []))
        except Exception as e:
            r.error = str(e)[:200]
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
            server.kill()
    return r
