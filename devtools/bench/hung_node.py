"""A fleet node that hangs behind the load balancer (issue #36): N agents racing a
connect with no answer by one second dial, and N that never do (the behaviour before),
side by side on the same two-node cluster (devtools/cluster.py) in the same run. One
node is frozen with SIGSTOP; for each agent it served, the time from the freeze to its
first connection accepted by the healthy node. And the only server frozen for everyone,
the storm a device cannot tell from a hung node: the dials each kind makes there."""
from __future__ import annotations

import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from devtools.cluster import Cluster
from devtools.harness import REPO, FleetServerProcess, agent_config, terminate, wait_for
from devtools.netns import NetNS

MODES = {"race": (), "no-race": ("--no-race",)}
LABELS = {"race": "edge-agent: up to four dials, three at once, one each max(0.5 s, 3x the learnt handshake)",
          "no-race": "edge-agent without the race (before): the bound's 4 s floor"}


@dataclass
class Trial:
    freeze_at: float = 0.0
    # mode -> seconds from the freeze to the healthy node's accepting each agent the
    # frozen node served (None: not back by the end)
    back_s: dict = field(default_factory=dict)
    # mode -> agents whose new connection found the frozen node (a race begun, or a
    # connect abandoned for no answer)
    landed: dict = field(default_factory=dict)
    error: str = ""


def _devices(node) -> dict:
    return node.admin("/admin/devices")


def trial(work: Path, agents: int = 10, hb: float = 2.0, ack: float = 1.0,
          backoff_base_s: float = 0.5, check_inter_s: float = 1.0, fall: int = 2,
          take_out_after_s: float | None = None, settle_s: float = 15.0,
          modes: tuple = tuple(MODES)) -> Trial:
    """One freeze, ``agents`` of each of ``modes`` at once. Runs in a network namespace
    of its own. ``take_out_after_s``: no health check; the balancer takes the frozen
    node out this long after the freeze."""
    work.mkdir(parents=True, exist_ok=True)
    t = Trial()
    with NetNS():
        cluster = Cluster(work / "cluster", fall=fall, check_inter_s=(
            None if take_out_after_s is not None else check_inter_s)).start()
        taker = None
        procs = []
        try:
            node = cluster.nodes[0]
            cfg = agent_config(node, work, server={"url": cluster.url, "connect_timeout_s": 10.0},
                               link={"heartbeat_interval_s": hb, "ack_timeout_s": ack,
                                     "stable_after_s": 60.0,
                                     "backoff": {"base_s": backoff_base_s, "cap_s": 4.0}},
                               log={"level": "info"})
            log = open(work / "clients.log", "ab")

            def online(count):
                seen = {k for n in cluster.nodes for k, d in _devices(n).items() if d["online"]}
                return len(seen) >= count
            # one kind after the other: started together, round robin would put every
            # agent of one kind on the same node
            for started, mode in enumerate(modes, 1):
                extra = MODES[mode]
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "devtools.storm_client", "--config", str(cfg),
                     "--first", "0", "--count", str(agents), "--ramp-s", str(hb),
                     "--prefix", f"{mode}-", "--log-level", "info", *extra],
                    cwd=REPO, stdout=log, stderr=subprocess.STDOUT))
                wait_for(lambda: online(started * agents), 60, interval=0.25,
                         what=f"{started * agents} agents online")
            # several heartbeats learnt on every link, and each connect's handshake
            time.sleep(2 * hb)
            served = [k for k, d in _devices(cluster.nodes[0]).items() if d["online"]]
            t.freeze_at = time.time()
            cluster.freeze(0)
            if take_out_after_s is not None:
                taker = threading.Timer(take_out_after_s, cluster.take_out, (0,))
                taker.start()
            healthy = cluster.nodes[1]

            def back():
                devs = _devices(healthy)
                found = {}
                for k in served:
                    after = [c for c in devs.get(k, {}).get("connect_times", [])
                             if c > t.freeze_at]
                    found[k] = round(min(after) - t.freeze_at, 2) if after else None
                return found
            deadline = time.monotonic() + settle_s
            found = back()
            while None in found.values() and time.monotonic() < deadline:
                time.sleep(0.25)
                found = back()
            for mode in modes:
                t.back_s[mode] = {k: v for k, v in sorted(found.items())
                                  if k.rsplit("-", 1)[0] == mode}
            t.landed = _landed(work / "clients.log", t.freeze_at)
        except Exception as e:
            t.error = str(e)[:300]
        finally:
            if taker is not None:
                taker.cancel()
            for p in procs:
                terminate(p, 5)
            cluster.stop()
    return t


def _landed(log: Path, after: float) -> dict:
    """mode -> device ids whose connect found the frozen node, from the clients' log."""
    found: dict = {mode: set() for mode in MODES}
    for line in log.read_text(errors="replace").splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 4 or not ("racing a second dial" in parts[3]
                                  or "failed (no-answer" in parts[3]):
            continue
        try:
            at = datetime.strptime(f"{parts[0]} {parts[1]}", "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        mode = parts[2].rsplit("-", 1)[0]
        if at >= after and mode in found:
            found[mode].add(parts[2])
    return {mode: sorted(ids) for mode, ids in found.items()}


def summarize(trials: list[Trial], mode: str) -> dict:
    values = [v for t in trials for v in t.back_s.get(mode, {}).values()]
    done = [v for v in values if v is not None]
    return {"agents": len(values), "back": len(done),
            "median": round(statistics.median(done), 2) if done else None,
            "max": max(done) if done else None,
            "over_4s": sum(1 for v in done if v > 4.0)}


@dataclass
class Result:
    trials: list
    frozen: "FrozenStorm"


def compare(trials: int, work: Path) -> Result:
    return Result([trial(work / f"hung-{n}") for n in range(trials)],
                  frozen_storm(work / "frozen"))


def section(result: Result) -> list[str]:
    trials = result.trials
    lines = ["## Hung fleet node behind a load balancer", "",
             "Two reference fleet servers (python-socketio's Redis adapter between them) behind",
             "haproxy (round robin, HTTP health check on /healthz every 1 s, out after 2",
             "failures); 10 agents of each kind connect",
             "through it, heartbeat 2 s, ACK 1 s, backoff from 0.5 s. One node is frozen",
             "(SIGSTOP): its kernel still completes TCP handshakes. Time from the freeze to",
             "the healthy node's accepting each agent the frozen node served.", "",
             "| agents | trials | served by the frozen node | median s | max s | back after more than 4 s |",
             "|---|---|---|---|---|---|"]
    for mode in MODES:
        s = summarize(trials, mode)
        lines.append(f"| {LABELS[mode]} | {len(trials)} | {s['back']}/{s['agents']} | "
                     f"{s['median']} | {s['max']} | {s['over_4s']} |")
    errors = [f"- trial {n}: {t.error}" for n, t in enumerate(trials) if t.error]
    f = result.frozen
    lines += ["", f"The one storm a device cannot tell from a hung node: the only server frozen "
              f"for everyone ({f.freeze_s:g} s; {f.agents} agents of each kind, each kind on a "
              f"server of its own), then thawed. Dials: TCP SYNs the server's port saw, "
              f"retransmissions included.", "",
              "| agents | dials while frozen | dials in all | Socket.IO connects/s at the thaw, peak | all back after the thaw s |",
              "|---|---|---|---|---|"]
    for mode in MODES:
        lines.append(f"| {LABELS[mode]} | {f.dials_frozen.get(mode)} | {f.dials_total.get(mode)} | "
                     f"{f.peak_per_s.get(mode)} | {f.to_100_s.get(mode)} |")
    if f.error:
        errors.append(f"- frozen server: {f.error}")
    return lines + (["", "Errors:", *errors] if errors else [])


# -- the whole server frozen: a storm the race must not feed ---------------------------

@dataclass
class FrozenStorm:
    """The only server frozen for everyone, then thawed: per kind, the dials (TCP SYNs)
    its agents sent while it was frozen and after, and the peak of Socket.IO connects
    per second once it was thawed."""
    agents: int = 0
    freeze_s: float = 0.0
    dials_frozen: dict = field(default_factory=dict)
    dials_total: dict = field(default_factory=dict)
    peak_per_s: dict = field(default_factory=dict)
    to_100_s: dict = field(default_factory=dict)
    error: str = ""


def _syn_counters(ns: NetNS, ports: dict) -> None:
    ns.nft("".join(f"add rule inet {ns.TABLE} input tcp dport {port} "
                   f"tcp flags & (syn | ack) == syn counter comment \"{mode}\"\n"
                   for mode, port in ports.items()))


def _syns(ns: NetNS) -> dict:
    out = subprocess.run(["nft", "list", "chain", "inet", ns.TABLE, "input"],
                         capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        if "counter packets" in line and "comment" in line:
            packets = int(line.split("counter packets", 1)[1].split()[0])
            found[line.rsplit('"', 2)[-2]] = packets
    return found


def frozen_storm(work: Path, agents: int = 50, freeze_s: float = 10.0, hb: float = 2.0,
                 ack: float = 1.0) -> FrozenStorm:
    """Each kind on a server of its own, both frozen at once: a silent loss for every
    agent (so nothing but the slow handshakes keeps the race from firing)."""
    work.mkdir(parents=True, exist_ok=True)
    r = FrozenStorm(agents, freeze_s)
    with NetNS() as ns:
        servers, procs = {}, []
        try:
            log = open(work / "clients.log", "ab")
            for mode, extra in MODES.items():
                (work / mode).mkdir(exist_ok=True)
                server = servers[mode] = FleetServerProcess(work / mode, "--accept-any").start()
                cfg = agent_config(server, work / mode, server={"connect_timeout_s": 10.0},
                                   link={"heartbeat_interval_s": hb, "ack_timeout_s": ack,
                                         "stable_after_s": 60.0,
                                         "backoff": {"base_s": 1.0, "cap_s": 60.0}},
                                   log={"level": "error"})
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "devtools.storm_client", "--config", str(cfg),
                     "--first", "0", "--count", str(agents), "--ramp-s", str(hb),
                     "--prefix", f"{mode}-", *extra],
                    cwd=REPO, stdout=log, stderr=subprocess.STDOUT))
            for mode, server in servers.items():
                wait_for(lambda: sum(1 for d in _devices(server).values() if d["online"])
                         >= agents, 60, interval=0.5, what=f"{agents} {mode} agents online")
            time.sleep(2 * hb)
            _syn_counters(ns, {mode: s.port for mode, s in servers.items()})
            t_freeze = time.time()
            for server in servers.values():
                server.proc.send_signal(signal.SIGSTOP)
            time.sleep(freeze_s)
            r.dials_frozen = _syns(ns)
            for server in servers.values():
                server.proc.send_signal(signal.SIGCONT)
            t_up = time.time()
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                if all(sum(1 for d in _devices(s).values()
                           if any(c > t_freeze for c in d["connect_times"])) >= agents
                       for s in servers.values()):
                    break
                time.sleep(1.0)
            r.dials_total = _syns(ns)
            for mode, server in servers.items():
                devs = _devices(server)
                firsts = sorted(min(c for c in d["connect_times"] if c > t_freeze) - t_up
                                for d in devs.values()
                                if any(c > t_freeze for c in d["connect_times"]))
                after = [c - t_up for d in devs.values() for c in d["connect_times"]
                         if c > t_freeze]
                bins = Counter(int(max(0.0, c)) for c in after)
                r.peak_per_s[mode] = max(bins.values(), default=0)
                r.to_100_s[mode] = round(firsts[-1], 2) if len(firsts) >= agents else None
        except Exception as e:
            r.error = str(e)[:300]
        finally:
            for server in servers.values():
                if server.proc is not None and server.proc.poll() is None:
                    server.proc.send_signal(signal.SIGCONT)
            for p in procs:
                terminate(p, 5)
            for server in servers.values():
                server.stop()
    return r


if __name__ == "__main__":
    import dataclasses
    import json
    import os
    res = compare(int(sys.argv[1]) if len(sys.argv) > 1 else 1,
                  Path(os.environ.get("TMPDIR", "/tmp")) / f"edge-agent-hung-{os.getpid()}")
    print("\n".join(section(res)))
    print(json.dumps(dataclasses.asdict(res)))
