"""The cluster rows at 40 screens (issue #54): a node SIGKILLed, a node frozen
(SIGSTOP), a rolling deploy; in each, 40 edge-agent screens (devtools/storm_client.py:
the agent's real link and events path, many screens in one process) and 40 stock
python-socketio players (devtools/stock_client.py --count) on the same two-node
cluster (devtools/cluster.py) in the same run.

Kill and freeze: for each screen the node served, the time from the fault to its first
connection accepted by the other node, and the device events raised on those screens
right after the fault that no live node stored. Deploy: node A SIGTERMed with a drain
window, restarted once it has stopped, then node B; links lost, each screen's widest
gap between heartbeats any node received, the events raised on a node's screens right
after its SIGTERM that no node stored (and any stored by two), where the screens are
at the end."""
from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from devtools.bench.rolling_deploy import widest_gaps
from devtools.cluster import Cluster
from devtools.harness import REPO, agent_config, terminate, wait_for
from devtools.netns import NetNS

KINDS = ("edge-agent", "stock")
# device ids: storm_client's prefix, stock_client's --device-id (its players are ID-0000 on)
PREFIX = {"edge-agent": "edge", "stock": "stock"}
LABELS = {"edge-agent": "edge-agent",
          "stock": "stock python-socketio client"}
HB, ACK = 2.0, 1.0
CHECK_INTER_S, FALL, RISE = 0.5, 2, 2
WINDOW_S = 4.0
REBALANCE_SETTLE_S = 4.0   # fleet-server --rebalance-settle: a node back is counted after it


def kind_of(device: str) -> str | None:
    head = device.split("-", 1)[0]
    return next((k for k, p in PREFIX.items() if p == head), None)


def _devices(node) -> dict:
    return node.admin("/admin/devices")


def _online(node) -> list[str]:
    return sorted(k for k, v in _devices(node).items() if v["online"] and v["sockets"])


class Fleet:
    """Both kinds' screens on one cluster, each kind in one process: started one kind
    after the other (started together, round robin would put each kind on one node),
    so each kind is spread over both nodes."""

    def __init__(self, cluster: Cluster, work: Path, screens: int, backoff_base_s: float = 0.5):
        self.cluster, self.work, self.screens = cluster, work, screens
        self.raise_file = work / "raise"
        self.logs = {kind: work / f"{kind}.log" for kind in KINDS}
        self.procs: dict[str, subprocess.Popen] = {}
        self.cfg = agent_config(cluster.nodes[0], work,
                                server={"url": cluster.url, "connect_timeout_s": 4.0},
                                link={"heartbeat_interval_s": HB, "ack_timeout_s": ACK,
                                      "stable_after_s": 60.0,
                                      "backoff": {"base_s": backoff_base_s, "cap_s": 4.0}},
                                log={"level": "info"})

    def command(self, kind: str) -> list[str]:
        if kind == "edge-agent":
            return [sys.executable, "-m", "devtools.storm_client", "--config", str(self.cfg),
                    "--first", "0", "--count", str(self.screens), "--ramp-s", str(HB),
                    "--prefix", f"{PREFIX[kind]}-", "--log-level", "info",
                    "--raise-file", str(self.raise_file)]
        # the app's heartbeat at edge-agent's interval, so that the gaps compare
        return [sys.executable, "-m", "devtools.stock_client", "--url", self.cluster.url,
                "--device-id", PREFIX[kind], "--count", str(self.screens), "--ramp-s", str(HB),
                "--heartbeat", str(HB), "--raise-file", str(self.raise_file)]

    def start(self) -> "Fleet":
        for n, kind in enumerate(KINDS, 1):
            self.procs[kind] = subprocess.Popen(
                self.command(kind), cwd=REPO, stdout=open(self.logs[kind], "ab"),
                stderr=subprocess.STDOUT)
            wait_for(lambda: len({k for node in self.cluster.nodes for k in _online(node)})
                     >= n * self.screens, 90, interval=0.25, what=f"{n * self.screens} screens online")
        return self

    def raise_on(self, devices) -> None:
        """One device event on each of ``devices``, from their own processes."""
        self.raise_file.write_text("".join(f"{d}\n" for d in devices))
        for proc in self.procs.values():
            proc.send_signal(signal.SIGUSR1)

    def losses(self, since: float) -> dict:
        """kind -> links lost from ``since`` on: edge-agent's "link lost", the stock
        players' disconnects."""
        found = {"edge-agent": self.logs["edge-agent"].read_text(errors="replace").count("link lost")}
        stock = 0
        for line in self.logs["stock"].read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                stock += e.get("event") == "disconnect" and e.get("t", 0) >= since
        found["stock"] = stock
        return found

    def stop(self) -> None:
        for proc in self.procs.values():
            terminate(proc, 5)


def _cluster(work: Path, *server_args: str, balance: str = "roundrobin") -> Cluster:
    """Sticky: the stock client starts on HTTP long-polling, whose requests must all
    reach the node that holds the session (edge-agent dials the websocket at once)."""
    return Cluster(work / "cluster", *server_args, check_inter_s=CHECK_INTER_S, fall=FALL,
                   rise=RISE, redispatch=True, sticky=True, balance=balance)


def _on_cluster(cluster: Cluster, result, work: Path, screens: int, body) -> None:
    """``body(fleet)`` once the cluster and both fleets are up (in the caller's network
    namespace); all stopped whatever happened. A failure goes into ``result.error``:
    the other rows go on."""
    fleet = None
    try:
        cluster.start()
        fleet = Fleet(cluster, work, screens).start()
        time.sleep(2 * HB)   # heartbeats learnt, each connect's handshake
        body(fleet)
    except Exception as e:
        result.error = f"{type(e).__name__}: {e}"[-300:]
    finally:
        if fleet is not None:
            fleet.stop()
        cluster.stop()


def _events_since(table: dict, device: str, since: float) -> set:
    return {(e.get("id"), e.get("ts")) for e in table.get(device, {}).get("events", [])
            if isinstance(e.get("ts"), (int, float)) and e["ts"] >= since}


# -- a node killed, a node frozen ---------------------------------------------------

@dataclass
class Outage:
    fault: str                  # "kill" (SIGKILL) or "freeze" (SIGSTOP)
    # kind -> {device: seconds from the fault to its first connect on the other node,
    # None: not back by the end}, for each screen the node served
    back_s: dict = field(default_factory=dict)
    raised: dict = field(default_factory=dict)   # kind -> events raised after the fault
    stored: dict = field(default_factory=dict)   # kind -> of those, stored by the other node
    error: str = ""


def outage(fault: str, work: Path, screens: int = 40, settle_s: float = 75.0) -> Outage:
    """``settle_s``: how long the screens have to reach the other node (the stock
    client on a frozen node waits for the server's pings: 25 + 20 s)."""
    work.mkdir(parents=True, exist_ok=True)
    o = Outage(fault)
    with NetNS():
        cluster = _cluster(work)

        def body(fleet):
            served = _online(cluster.nodes[0])
            at = time.time()
            if fault == "kill":
                cluster.nodes[0].kill()
            else:
                cluster.freeze(0)
            fleet.raise_on(served)
            other = cluster.nodes[1]

            def back(devs):
                return {k: (round(min(after) - at, 2) if (after := [
                    c for c in devs.get(k, {}).get("connect_times", []) if c > at]) else None)
                    for k in served}
            deadline = time.monotonic() + settle_s
            found = back(_devices(other))
            while None in found.values() and time.monotonic() < deadline:
                time.sleep(0.25)
                found = back(_devices(other))
            # what is held is sent once the new link is proven: a heartbeat and its ACK
            until = min(deadline, time.monotonic() + 2 * HB + ACK)
            while True:
                devs = _devices(other)
                stored = {k: len(_events_since(devs, k, at)) for k in served}
                if all(stored.values()) or time.monotonic() >= until:
                    break
                time.sleep(0.25)
            found = back(devs)
            for kind in KINDS:
                mine = [k for k in served if kind_of(k) == kind]
                o.back_s[kind] = {k: found[k] for k in mine}
                o.raised[kind] = len(mine)
                o.stored[kind] = sum(min(1, stored[k]) for k in mine)
        _on_cluster(cluster, o, work, screens, body)
    return o


# -- a rolling deploy -------------------------------------------------------------

@dataclass
class Deploy:
    losses: dict = field(default_factory=dict)        # kind -> links lost
    widest_gap_s: dict = field(default_factory=dict)  # kind -> {device: widest heartbeat gap}
    raised: dict = field(default_factory=dict)        # kind -> events raised at the SIGTERMs
    stored: dict = field(default_factory=dict)        # kind -> of those, stored by any node
    twice: dict = field(default_factory=dict)         # kind -> of those, stored by two nodes
    two_sessions: dict = field(default_factory=dict)  # kind -> devices a node held twice at once
    split: dict = field(default_factory=dict)         # kind -> screens on A and B at the end
    stopped_s: list = field(default_factory=list)     # each node's stop after its SIGTERM
    error: str = ""


def deploy(work: Path, screens: int = 40, window_s: float = WINDOW_S) -> Deploy:
    work.mkdir(parents=True, exist_ok=True)
    d = Deploy()
    with NetNS():
        # the nodes rebalance after the deploy (fleet-server --rebalance): leastconn
        cluster = _cluster(work, "--drain-window", str(window_s), "--rebalance", str(window_s),
                           "--rebalance-settle", str(REBALANCE_SETTLE_S), balance="leastconn")
        for n, node in enumerate(cluster.nodes):
            node.args += ["--record", str(work / f"node-{n}-run-0.json")]
        records, raised = [], Counter()

        def body(fleet):
            first_term = time.time()
            for n in (0, 1):
                node = cluster.nodes[n]
                held = _online(node)
                m0 = time.monotonic()
                node.proc.send_signal(signal.SIGTERM)
                fleet.raise_on(held)
                raised.update(held)
                node.proc.wait(window_s + 15)
                d.stopped_s.append(round(time.monotonic() - m0, 2))
                records.append(json.loads(Path(node.args[-1]).read_text()))
                node.args[-1] = str(work / f"node-{n}-run-1.json")
                node.start()
                time.sleep((RISE + 1) * CHECK_INTER_S + 0.5)   # the balancer takes it back
            # the restarted node is counted after the settle; the moves take the window
            time.sleep(REBALANCE_SETTLE_S + window_s + HB + ACK)
            final = [_devices(node) for node in cluster.nodes]
            tables = records + final
            gaps = widest_gaps(tables, first_term - HB)
            for kind in KINDS:
                mine = [k for k in raised if kind_of(k) == kind]
                copies = [len(_events_since(t, k, first_term)) for k in mine for t in tables]
                distinct = [len(set().union(*(_events_since(t, k, first_term) for t in tables)))
                            for k in mine]
                d.raised[kind] = sum(raised[k] for k in mine)
                d.stored[kind] = sum(distinct)
                d.twice[kind] = sum(copies) - sum(distinct)
                d.widest_gap_s[kind] = {k: g for k, g in sorted(gaps.items()) if kind_of(k) == kind}
                d.two_sessions[kind] = sorted({k for t in tables for k, v in t.items()
                                               if kind_of(k) == kind and v["max_concurrent"] > 1})
                d.split[kind] = tuple(sum(1 for k, v in f.items() if kind_of(k) == kind
                                          and v["online"] and v["sockets"]) for f in final)
            d.losses = fleet.losses(first_term)
        _on_cluster(cluster, d, work, screens, body)
    return d


# -- the section ------------------------------------------------------------------

@dataclass
class Rows:
    kill: Outage
    freeze: Outage
    deploy: Deploy
    seconds: float = 0.0


def compare(work: Path, screens: int = 40) -> Rows:
    """One after the other: 80 clients and a cluster each, on a machine of two cores."""
    t0 = time.monotonic()
    rows = Rows(outage("kill", work / "kill", screens), outage("freeze", work / "freeze", screens),
                deploy(work / "deploy", screens))
    rows.seconds = round(time.monotonic() - t0, 1)
    return rows


def _times(back: dict) -> tuple:
    done = [v for v in back.values() if v is not None]
    return (len(done), len(back), round(statistics.median(done), 2) if done else None,
            max(done) if done else None)


def section(rows: Rows) -> list[str]:
    lines = ["## The cluster at 40 screens: a node killed, a node frozen, a rolling deploy", "",
             "Two reference fleet servers (python-socketio's Redis adapter between them) behind",
             f"haproxy (round robin, HTTP health check every {CHECK_INTER_S:g} s, out after {FALL}, "
             "a refused connect redispatched);",
             "40 edge-agent screens (the agent's real link and events outbox) and 40 stock",
             "python-socketio players (library defaults, the app's heartbeat fire-and-forget)",
             f"on the same cluster in the same run, each kind spread over both nodes; heartbeat "
             f"{HB:g} s for both, edge-agent's ACK {ACK:g} s.",
             "Back: from the fault to each screen of that node connecting to the other node.",
             "Events lost: one device event raised on each of that node's screens right after",
             "the fault, not stored by a live node.", "",
             "| fault | client | back | median s | max s | events lost |",
             "|---|---|---|---|---|---|"]
    errors = []
    for name, o, text in (("kill", rows.kill, "node A SIGKILLed"),
                          ("freeze", rows.freeze, "node A frozen (SIGSTOP)")):
        for kind in KINDS:
            if kind not in o.back_s:
                continue
            back, total, median, worst = _times(o.back_s[kind])
            lines.append(f"| {text} | {LABELS[kind]} | {back}/{total} | {median} | {worst} | "
                         f"{o.raised[kind] - o.stored[kind]}/{o.raised[kind]} |")
        if o.error:
            errors.append(f"- {name}: {o.error}")
    d = rows.deploy
    lines += ["", f"Rolling deploy: node A SIGTERMed with a {WINDOW_S:g} s drain window "
              "(server:drain; the stock client",
              "does not know it and is cut at its end), restarted once it has stopped, then node B;",
              f"the nodes rebalance (`--rebalance {WINDOW_S:g}`, settle {REBALANCE_SETTLE_S:g} s, "
              "haproxy leastconn for this row): the split is read once node B has been back",
              "for the settle, the window and a heartbeat.",
              "One event raised on each screen of a node right after its SIGTERM. Widest gap:",
              "between two heartbeats any node received from one screen, the worst screen.", "",
              "| client | links lost | widest heartbeat gap s | events lost | stored twice "
              "| two sessions at once | at the end A/B |",
              "|---|---|---|---|---|---|---|"]
    for kind in KINDS:
        if kind not in d.raised:
            continue
        gaps = [g for g in d.widest_gap_s.get(kind, {}).values() if g is not None]
        lines.append(f"| {LABELS[kind]} | {d.losses.get(kind)} | {max(gaps) if gaps else None} | "
                     f"{d.raised[kind] - d.stored[kind]}/{d.raised[kind]} | {d.twice[kind]} | "
                     f"{len(d.two_sessions[kind])} | {'/'.join(map(str, d.split[kind]))} |")
    if d.error:
        errors.append(f"- deploy: {d.error}")
    lines += ["", f"The three rows took {rows.seconds:g} s; nodes stopped {d.stopped_s} s "
              "after their SIGTERMs."]
    return lines + (["", "Errors:", *errors] if errors else [])


if __name__ == "__main__":
    import dataclasses
    import os
    res = compare(Path(os.environ.get("TMPDIR", "/tmp")) / f"edge-agent-cluster-{os.getpid()}",
                  int(sys.argv[1]) if len(sys.argv) > 1 else 40)
    print("\n".join(section(res)))
    print(json.dumps(dataclasses.asdict(res)))
