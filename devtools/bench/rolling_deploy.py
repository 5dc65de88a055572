"""A rolling deploy of a two-node fleet (issue #54): N screens (the agent's real link,
devtools/storm_client.py) behind haproxy (devtools/cluster.py, a refused connect
redispatched), node 0 SIGTERMed with a drain window, restarted once it has stopped,
then node 1 the same. For each node's screens, when each reached the other node; for
each screen the widest gap between heartbeats any node received; whether any node ever
held two sessions of one screen; the links the screens lost; and where they are at the
end."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from devtools.cluster import Cluster
from devtools.harness import REPO, agent_config, terminate, wait_for
from devtools.netns import NetNS


@dataclass
class Deploy:
    # node -> {device: seconds from the node's SIGTERM to its first connect on the other}
    moved_s: dict = field(default_factory=dict)
    stopped_s: list = field(default_factory=list)   # each node's stop after its SIGTERM
    widest_gap_s: dict = field(default_factory=dict)  # device -> widest heartbeat gap
    two_sessions: list = field(default_factory=list)  # devices a node held twice at once
    losses: int = 0            # links lost ("link lost" in the screens' log)
    failed_moves: int = 0      # new connections that did not prove themselves
    split: tuple = ()          # screens on each node at the end
    balanced_s: float | None = None   # from node 1's restart to within 60/40 (rebalance)
    rebalanced_s: list = field(default_factory=list)  # each move's arrival, from that restart
    error: str = ""


def _devices(node) -> dict:
    return node.admin("/admin/devices")


def _live(node) -> int:
    return sum(1 for v in _devices(node).values() if v["online"] and v["sockets"])


def widest_gaps(tables: list[dict], since: float) -> dict:
    """device -> the widest gap between the heartbeats any of ``tables`` received from
    ``since`` on (None: fewer than two)."""
    found = {}
    for k in {k for table in tables for k in table}:
        beats = sorted(t for table in tables for t in table.get(k, {}).get("heartbeat_times", [])
                       if t >= since)
        gaps = [b - a for a, b in zip(beats, beats[1:])]
        found[k] = round(max(gaps), 2) if gaps else None
    return found


def trial(work: Path, agents: int = 40, hb: float = 2.0, ack: float = 1.0,
          window_s: float = 4.0, check_inter_s: float = 0.5, fall: int = 2,
          rise: int = 2, drain: bool = True, rebalance_s: float = 0.0,
          settle_s: float = 4.0, balance: str | None = None) -> Deploy:
    """``drain=False``: screens that ignore server:drain (the behaviour before it).
    ``rebalance_s``: the nodes rebalance within this window, trusting a node back after
    ``settle_s`` (longer than a deploy's step here: no move before node 1 drains), and
    haproxy balances leastconn (``balance`` another); 0: round robin, no rebalance."""
    work.mkdir(parents=True, exist_ok=True)
    d = Deploy()
    with NetNS():
        rebalance = ("--rebalance", str(rebalance_s), "--rebalance-settle",
                     str(settle_s)) if rebalance_s else ()
        cluster = Cluster(work / "cluster", "--drain-window", str(window_s), *rebalance,
                          check_inter_s=check_inter_s, fall=fall, rise=rise, redispatch=True,
                          balance=balance or ("leastconn" if rebalance_s else "roundrobin"))
        records = []
        for n, node in enumerate(cluster.nodes):
            node.args += ["--record", str(work / f"node-{n}-run-0.json")]
        proc = None
        try:
            cluster.start()
            cfg = agent_config(cluster.nodes[0], work,
                               server={"url": cluster.url, "connect_timeout_s": 4.0},
                               link={"heartbeat_interval_s": hb, "ack_timeout_s": ack,
                                     "stable_after_s": 60.0,
                                     "backoff": {"base_s": 0.5, "cap_s": 4.0}},
                               log={"level": "info"})
            log_path = work / "clients.log"
            proc = subprocess.Popen(
                [sys.executable, "-m", "devtools.storm_client", "--config", str(cfg),
                 "--first", "0", "--count", str(agents), "--ramp-s", str(hb),
                 "--prefix", "screen-", "--log-level", "info",
                 *(() if drain else ("--no-drain",))],
                cwd=REPO, stdout=open(log_path, "ab"), stderr=subprocess.STDOUT)

            def online() -> bool:
                seen = {k for n in cluster.nodes for k, v in _devices(n).items() if v["online"]}
                return len(seen) >= agents
            wait_for(online, 60, interval=0.25, what=f"{agents} screens online")
            time.sleep(2 * hb)
            first_term = time.time()
            for n in (0, 1):
                node, other = cluster.nodes[n], cluster.nodes[1 - n]
                held = [k for k, v in _devices(node).items() if v["online"]]
                t0, m0 = time.time(), time.monotonic()
                node.proc.send_signal(signal.SIGTERM)
                node.proc.wait(window_s + 15)
                d.stopped_s.append(round(time.monotonic() - m0, 2))
                records.append(json.loads(Path(node.args[-1]).read_text()))
                devs = _devices(other)
                d.moved_s[n] = {k: (round(min(after) - t0, 2) if (after := [
                    c for c in devs.get(k, {}).get("connect_times", []) if c > t0]) else None)
                    for k in sorted(held)}
                node.args[-1] = str(work / f"node-{n}-run-1.json")
                node.start()
                back, back_wall = time.monotonic(), time.time()
                time.sleep((rise + 1) * check_inter_s + 0.5)   # the balancer takes it back
            if rebalance_s:
                def within_60_40() -> bool:
                    counts = [_live(node) for node in cluster.nodes]
                    return sum(counts) == agents and max(counts) <= 0.6 * agents
                try:
                    wait_for(within_60_40, settle_s + rebalance_s + 2 * hb + 4, interval=0.2,
                             what="the screens within 60/40")
                    d.balanced_s = round(time.monotonic() - back, 2)
                except AssertionError:
                    pass   # the split says where they are
            time.sleep(hb + ack)
            final = [_devices(node) for node in cluster.nodes]
            d.split = tuple(sum(1 for v in f.values() if v["online"] and v["sockets"])
                            for f in final)
            # node 1 came back empty: every screen on it at the end is a move
            d.rebalanced_s = sorted(round(min(v["connect_times"]) - back_wall, 2)
                                    for v in final[1].values() if v["sockets"])
            for table in records + final:
                for k, v in table.items():
                    if v["max_concurrent"] > 1:
                        d.two_sessions.append(k)
            d.widest_gap_s = widest_gaps(records + final, first_term - hb)
            terminate(proc, 5)
            proc = None
            text = log_path.read_text(errors="replace")
            d.losses = text.count("link lost")
            d.failed_moves = text.count("drain: the new connection")
        except Exception as e:
            d.error = str(e)[:300]
        finally:
            if proc is not None:
                terminate(proc, 5)
            cluster.stop()
    return d


MODES = {"drain": True, "no-drain": False}
LABELS = {"drain": "edge-agent: make before break on server:drain",
          "no-drain": "edge-agent ignoring server:drain (before): cut at the drain's end"}


def compare(work: Path, agents: int = 40) -> dict:
    return {mode: trial(work / mode, agents=agents, drain=drain, rebalance_s=4.0)
            for mode, drain in MODES.items()}


def section(result: dict) -> list[str]:
    lines = ["## Rolling deploy of the cluster", "",
             "Two reference fleet servers (Redis adapter, `--rebalance 4`, settle 4 s) behind",
             "haproxy (least connections, health check every 0.5 s, a refused connect",
             "redispatched), 40 screens, heartbeat 2 s, ACK 1 s. Node A is SIGTERMed with a",
             "4 s drain window and restarted once it has stopped, then node B. Moved: from a",
             "node's SIGTERM to each of its screens' first connection on the other node; within",
             "60/40: from node B's restart.", "",
             "| screens | links lost | widest heartbeat gap s | moved median s | moved span s "
             "| two sessions | nodes stopped after s | at the end A/B | within 60/40 after s |",
             "|---|---|---|---|---|---|---|---|---|"]
    errors = []
    for mode, d in result.items():
        moved = sorted(s for per in d.moved_s.values() for s in per.values() if s is not None)
        gaps = [g for g in d.widest_gap_s.values() if g is not None]
        lines.append(
            f"| {LABELS[mode]} | {d.losses} | {max(gaps) if gaps else None} | "
            f"{moved[len(moved) // 2] if moved else None} | "
            f"{f'{moved[0]}-{moved[-1]}' if moved else None} | {len(d.two_sessions)} | "
            f"{d.stopped_s} | {'/'.join(map(str, d.split))} | {d.balanced_s} |")
        if d.error:
            errors.append(f"- {mode}: {d.error}")
    return lines + (["", "Errors:", *errors] if errors else [])
