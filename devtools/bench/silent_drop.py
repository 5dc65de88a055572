"""Silent drop: the live connection of a client is cut with an nftables DROP (both
directions; new connections pass) at a random phase of its heartbeat cycle, inside a
private network namespace per trial. Recovery is the time from the drop to the first
heartbeat the server receives on a new connection. Baselines are the stock
python-socketio client against servers with Engine.IO ping 25 s/20 s and 30 s/30 s.
Trials run concurrently (each in its own namespace): the clock, not the CPU, is what
they spend.
"""
from __future__ import annotations

import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from devtools.harness import FleetServerProcess, wait_for
from devtools.netns import NetNS, tcp_sockets

from devtools.bench.common import ACK_DEFAULT, HB_DEFAULT, StockProcess, edge_agent


@dataclass
class Trial:
    client: str
    server_ping: tuple[float, float]
    phase_s: float
    recovery_s: float | None = None
    sockets_max: int = 0
    error: str = ""


@dataclass
class Kind:
    name: str
    label: str
    ping: tuple[float, float]
    trials: list = field(default_factory=list)


def run_trial(kind: Kind, index: int, workroot: Path, rng: random.Random) -> Trial:
    work = workroot / f"{kind.name}-{index}"
    work.mkdir(parents=True)
    phase = rng.uniform(0, HB_DEFAULT)
    trial = Trial(kind.name, kind.ping, round(phase, 2))
    device_id = "screen-1"
    with NetNS() as ns:
        server = FleetServerProcess(work, "--ping-interval", str(kind.ping[0]), "--ping-timeout",
                                    str(kind.ping[1]), "--accept-any").start()
        client = None
        try:
            if kind.name == "edge-agent":
                client = edge_agent(server, work)
            else:
                client = StockProcess(server.url, work)
            wait_for(lambda: server.device(device_id).get("first_heartbeat_times"), 30,
                     what="first heartbeat")
            t_first = server.device(device_id)["first_heartbeat_times"][0]
            # the drop lands `phase` seconds into a heartbeat cycle
            time.sleep(max(0.0, t_first + phase - time.time()))
            flows = [s for s in tcp_sockets(client.pid, server.port) if s["state"] == "ESTABLISHED"]
            if not flows:
                raise RuntimeError("no live flow to drop")
            for flow in flows:
                ns.drop_flow(flow["local_port"], server.port)
            t_drop = time.time()

            dropped = {f["local_port"] for f in flows}

            def recovered():
                # sockets held besides the dropped one(s), which the kernel may still list
                held = [s for s in tcp_sockets(client.pid, server.port)
                        if s["state"] not in ("TIME_WAIT", "CLOSE") and s["local_port"] not in dropped]
                trial.sockets_max = max(trial.sockets_max, len(held))
                times = [t for t in server.device(device_id).get("first_heartbeat_times", [])
                         if t > t_drop]
                return times[0] if times else None

            t_back = wait_for(recovered, 120, interval=0.05, what="recovery")
            trial.recovery_s = round(t_back - t_drop, 2)
        except Exception as e:
            trial.error = str(e)[:200]
        finally:
            if client is not None:
                client.stop()
            server.kill()
    return trial


def silent_drop(trials: int, quick: bool, workroot: Path, seed: int) -> list[Kind]:
    kinds = [Kind("edge-agent", f"edge-agent (heartbeat {HB_DEFAULT:g} s, ack {ACK_DEFAULT:g} s)",
                  (25.0, 20.0)),
             Kind("stock-25-20", "stock python-socketio, server ping 25 s/20 s", (25.0, 20.0))]
    if not quick:
        kinds.append(Kind("stock-30-30", "stock python-socketio, server ping 30 s/30 s", (30.0, 30.0)))
    rng = random.Random(seed)
    jobs = [(k, i, random.Random(rng.random())) for k in kinds for i in range(trials)]
    results: dict[tuple, Trial] = {}
    sem = threading.Semaphore(12)

    def work(kind, index, r):
        with sem:
            results[(kind.name, index)] = run_trial(kind, index, workroot, r)

    threads = [threading.Thread(target=work, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in kinds:
        k.trials = [results[(k.name, i)] for i in range(trials)]
    return kinds


def summarize(kind: Kind) -> dict:
    values = [t.recovery_s for t in kind.trials if t.recovery_s is not None]
    return {"median": round(statistics.median(values), 2) if values else None,
            "max": max(values) if values else None, "ok": len(values),
            "failed": len(kind.trials) - len(values),
            "sockets_max": max((t.sockets_max for t in kind.trials), default=0)}


