"""The fault matrix: edge-agent and the stock client through the same real faults, each
trial in its own network namespace, against a server pinging at 25 s/20 s.

Per fault: when it began, when the client noticed (its own log), when heartbeats
reached the server again, heartbeat seqs the server never got, device events raised
during the fault that never arrived, and the most sockets the client held at once.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from devtools.harness import REPO, FleetServerProcess, wait_for
from devtools.netns import NetNS
from devtools.reaping_proxy import reap_times

from devtools.bench.common import DEVICE, HB_DEFAULT, StockProcess, agent_log_times, edge_agent, held

FAULTS = {
    "outage-30s": "everything to and from the server dropped for 30 s, then restored",
    "rst-storm": "every packet to the server answered with a TCP RST for 20 s",
    "server-kill": "server SIGKILLed, restarted 5 s later on the same port",
    "idle-reap": "a proxy silently stops forwarding a flow idle for 10 s",
    "slow-acks": "the server answers every heartbeat 4 s late, for 45 s",
}
CLIENTS = ("edge-agent", "stock")


@dataclass
class FaultRun:
    fault: str
    client: str
    trial: int
    t_fault: float = 0.0
    t_end: float = 0.0
    noticed_s: float | None = None
    recovery_s: float | None = None
    heartbeats_lost: int = 0
    events_raised: int = 0
    events_lost: int = 0
    sockets_max: int = 0
    reconnects: int = 0
    connect_attempts: int | None = None
    error: str = ""


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _write(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value + "\n")


def _syn_count(ns: NetNS) -> int:
    out = subprocess.run(["nft", "list", "chain", "inet", ns.TABLE, "input"],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "syn" in line and "counter packets" in line:
            return int(line.split("counter packets")[1].split()[0])
    return 0


def run(fault: str, client_kind: str, trial: int, work: Path, rng: random.Random) -> FaultRun:
    work.mkdir(parents=True)
    r = FaultRun(fault, client_kind, trial)
    with NetNS() as ns:
        args = ["--accept-any"] + (["--ack-delay", "4"] if fault == "slow-acks" else [])
        server = FleetServerProcess(work, *args).start()
        port, url, proxy = server.port, server.url, None
        client = None
        try:
            if fault == "idle-reap":
                pf = work / "proxy-port"
                proxy_log = open(work / "proxy.log", "ab")
                proxy = subprocess.Popen([sys.executable, "-m", "devtools.reaping_proxy",
                                          "--target", str(server.port), "--idle-s", "10",
                                          "--port-file", str(pf)], cwd=REPO, stdout=proxy_log)
                wait_for(lambda: pf.exists() and pf.read_text(), 10, what="proxy")
                port = int(pf.read_text())
                url = f"http://127.0.0.1:{port}"
            _ip("link", "add", "eth-test", "type", "veth", "peer", "name", "eth-peer")
            _ip("link", "set", "eth-test", "up")
            _ip("link", "set", "eth-peer", "up")
            hdmi = work / "sys" / "class/drm/card1-HDMI-A-1/status"
            _write(hdmi, "connected")
            if client_kind == "edge-agent":
                client = edge_agent(server, work, url=url, events={"settle_s": 0.2},
                                    debug={"sysfs_root": str(work / "sys")})

                def raise_event():
                    _write(hdmi, "disconnected" if r.events_raised % 2 == 0 else "connected")
                    _ip("link", "set", "eth-peer", "down")  # the uevent; not a network-up
            else:
                client = StockProcess(url, work)

                def raise_event():
                    os.kill(client.pid, signal.SIGUSR1)
            wait_for(lambda: server.device(DEVICE).get("first_heartbeat_times"), 30,
                     what="first heartbeat")
            time.sleep(rng.uniform(0, HB_DEFAULT))  # a random phase of the heartbeat cycle
            stop = threading.Event()

            def sample():
                while not stop.is_set():
                    r.sockets_max = max(r.sockets_max, held(client.pid, port))
                    stop.wait(0.05)
            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            seqs_before = 0
            r.t_fault = time.time()
            if fault == "outage-30s":
                ns.drop_port(port)
                time.sleep(1.0); raise_event(); r.events_raised += 1
                time.sleep(29.0)
                ns.restore()
            elif fault == "rst-storm":
                ns.nft(f"add rule inet {ns.TABLE} input tcp dport {port} tcp flags syn counter\n"
                       f"add rule inet {ns.TABLE} input tcp dport {port} reject with tcp reset\n"
                       f"add rule inet {ns.TABLE} input tcp sport {port} reject with tcp reset\n")
                time.sleep(1.0); raise_event(); r.events_raised += 1
                time.sleep(19.0)
                r.connect_attempts = _syn_count(ns)
                ns.restore()
            elif fault == "server-kill":
                seqs_before = server.device(DEVICE).get("seqs_received", 0)
                server.kill()
                time.sleep(1.0); raise_event(); r.events_raised += 1
                time.sleep(4.0)
                server.start()
            elif fault == "idle-reap":
                # the heartbeat every 15 s leaves 10 s idle gaps: the box reaps the flow
                r.t_fault = wait_for(lambda: reap_times(work / "proxy.log"), 60, interval=0.05,
                                     what="a reap")[0]
                time.sleep(1.0); raise_event(); r.events_raised += 1
            elif fault == "slow-acks":
                time.sleep(1.0); raise_event(); r.events_raised += 1
                time.sleep(44.0)
            r.t_end = time.time() if fault != "idle-reap" else r.t_fault
            if fault != "slow-acks":
                if fault == "idle-reap":
                    back = lambda: [t for t in server.device(DEVICE).get("first_heartbeat_times", [])
                                    if t > r.t_end]
                else:
                    back = lambda: [t for t in server.device(DEVICE).get("heartbeat_times", [])
                                    if t > r.t_end]
                t_back = wait_for(back, 150, interval=0.05, what="recovery")[0]
                r.recovery_s = round(t_back - r.t_end, 2)
            # time for held events to drain, then count what arrived
            deadline = time.time() + 2 * HB_DEFAULT
            while time.time() < deadline:
                got = [e for e in server.device(DEVICE).get("events", [])
                       if str(e.get("type", "")).startswith("display.")]
                if len(got) >= r.events_raised:
                    break
                time.sleep(0.2)
            r.events_lost = max(0, r.events_raised - len(got))
            dev = server.device(DEVICE)
            r.heartbeats_lost = max(0, (dev.get("last_seq") or 0) - dev.get("seqs_received", 0)
                                    - seqs_before)
            r.reconnects = max(0, dev.get("connects", 1) - 1) if fault != "server-kill" else dev.get("connects", 1) - 1
            stop.set()
            sampler.join(2)
            if client_kind == "edge-agent":
                times = agent_log_times(client, "link lost", r.t_fault)
                noticed = times[0] if times else None
            else:
                noticed = client.noticed_after(r.t_fault)
            r.noticed_s = round(noticed - r.t_fault, 2) if noticed else None
        except Exception as e:
            r.error = str(e)[:200]
        finally:
            if client is not None:
                client.stop()
            if proxy is not None:
                proxy.kill()
            server.kill()
    return r


def matrix(trials: int, workroot: Path, seed: int, parallel: int = 10) -> list[FaultRun]:
    rng = random.Random(seed)
    jobs = [(f, c, i, random.Random(rng.random())) for f in FAULTS for c in CLIENTS
            for i in range(trials)]
    results: list[FaultRun] = []
    sem = threading.Semaphore(parallel)

    def work(f, c, i, jrng):
        with sem:
            results.append(run(f, c, i, workroot / f"fault-{f}-{c}-{i}", jrng))

    threads = [threading.Thread(target=work, args=j) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    order = {f: n for n, f in enumerate(FAULTS)}
    return sorted(results, key=lambda r: (order[r.fault], r.client, r.trial))
