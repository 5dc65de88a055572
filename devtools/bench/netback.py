"""Network back: from restoring the path (with the carrier-up a cable or Wi-Fi gives)
to heartbeats at the server, with the udev/rtnetlink wake-up and without it."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from devtools.harness import FleetServerProcess, wait_for
from devtools.netns import NetNS

from devtools.bench.common import DEVICE, edge_agent
from devtools.bench.faults import _ip


@dataclass
class NetBack:
    mode: str          # wake | no-wake
    trial: int
    outage_s: float
    attempts: int = 0
    back_s: float | None = None
    error: str = ""


def run(mode: str, trial: int, outage_s: float, work: Path) -> NetBack:
    work.mkdir(parents=True)
    r = NetBack(mode, trial, outage_s)
    with NetNS() as ns:
        server = FleetServerProcess(work, "--accept-any").start()
        agent = None
        try:
            _ip("link", "add", "eth-test", "type", "veth", "peer", "name", "eth-peer")
            _ip("link", "set", "eth-test", "up")
            agent = edge_agent(server, work, events={"enabled": mode == "wake"})
            wait_for(lambda: server.device(DEVICE).get("first_heartbeat_times"), 30,
                     what="first heartbeat")
            ns.drop_port(server.port)
            time.sleep(outage_s)
            r.attempts = agent.link().get("attempts", 0)
            ns.restore()
            _ip("link", "set", "eth-peer", "up")  # carrier up: the network is back
            t_up = time.time()
            back = wait_for(lambda: [t for t in server.device(DEVICE).get("heartbeat_times", [])
                                     if t > t_up], 120, interval=0.05, what="back online")
            r.back_s = round(back[0] - t_up, 2)
        except Exception as e:
            r.error = str(e)[:200]
        finally:
            if agent is not None:
                agent.stop(2)
            server.kill()
    return r


def compare(trials: int, outage_s: float, workroot: Path) -> list[NetBack]:
    results: list[NetBack] = []
    jobs = [(m, i) for m in ("wake", "no-wake") for i in range(trials)]
    threads = [threading.Thread(target=lambda m=m, i=i: results.append(
        run(m, i, outage_s, workroot / f"netback-{m}-{i}"))) for m, i in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(results, key=lambda r: (r.mode, r.trial))
