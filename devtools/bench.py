"""scripts/bench: edge-agent against baselines, measured side by side in one run.

Silent drop: the live connection of a client is cut with an nftables DROP (both
directions; new connections pass) at a random phase of its heartbeat cycle, inside a
private network namespace per trial. Recovery is the time from the drop to the first
heartbeat the server receives on a new connection. Baselines are the stock
python-socketio client against servers with Engine.IO ping 25 s/20 s and 30 s/30 s.
Trials run concurrently (each in its own namespace): the clock, not the CPU, is what
they spend.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from devtools.harness import REPO, AgentProcess, FleetServerProcess, agent_config, wait_for
from devtools.netns import NetNS, tcp_sockets

HB_DEFAULT, ACK_DEFAULT = 15.0, 5.0


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


class StockProcess:
    def __init__(self, url: str, workdir: Path, device_id: str):
        self.log_path = workdir / "stock.log"
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "devtools.stock_client", "--url", url, "--device-id",
             device_id, "--token", "t"], cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(5)


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
                cfg = agent_config(server, work, server={"connect_timeout_s": 10.0},
                                   link={"heartbeat_interval_s": HB_DEFAULT,
                                         "ack_timeout_s": ACK_DEFAULT, "stable_after_s": 60.0,
                                         "backoff": {"base_s": 1.0, "cap_s": 60.0},
                                         "keepalive": {"idle_s": 15, "interval_s": 5,
                                                       "count": 3, "user_timeout_s": 20.0}})
                client = AgentProcess(sys.executable, cfg, work).start()
            else:
                client = StockProcess(server.url, work, device_id)
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


def _write_bytes() -> int:
    with open("/proc/thread-self/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    return 0


def upload_queue(items: int, workroot: Path) -> dict:
    """Items per second to the local reference server, and bytes written per item
    (the kernel's count of bytes this thread sent to the block layer, fsyncs included)."""
    from agent.uploads.schedule import UploadPolicy
    from agent.uploads.sender import UploadSender
    from agent.uploads.store import QueueStore
    from agent.uploads.worker import UploadWorker
    work = workroot / "uploads"
    work.mkdir(parents=True)
    with NetNS():
        server = FleetServerProcess(work, "--accept-any").start()
        try:
            policy = UploadPolicy()
            store = QueueStore(str(work / "queue.db"), policy)
            payload = os.urandom(2048)
            os.sync()
            before = _write_bytes()
            for i in range(items):
                store.enqueue("log", payload + i.to_bytes(4, "big"))
            os.sync()
            enqueue_bytes = _write_bytes() - before
            worker = UploadWorker(store, UploadSender(server.url, ("screen-1", "t")), policy)
            before, t0 = _write_bytes(), time.monotonic()
            while store.stats()["items"]:
                if worker._work_once() > 0 and store.stats()["items"]:
                    time.sleep(0.01)
            elapsed = time.monotonic() - t0
            os.sync()
            send_bytes = _write_bytes() - before
            stored = server.device("screen-1").get("uploads")
        finally:
            server.kill()
    return {"items": items, "stored": stored, "items_per_s": round(items / elapsed, 1),
            "enqueue_bytes_per_item": round(enqueue_bytes / items),
            "send_bytes_per_item": round(send_bytes / items), "payload_bytes": 2052}


def summarize(kind: Kind) -> dict:
    values = [t.recovery_s for t in kind.trials if t.recovery_s is not None]
    return {"median": statistics.median(values) if values else None,
            "max": max(values) if values else None, "ok": len(values),
            "failed": len(kind.trials) - len(values),
            "sockets_max": max((t.sockets_max for t in kind.trials), default=0)}


def report(kinds: list[Kind], out: Path, quick: bool, elapsed: float,
           uploads: dict | None = None) -> tuple[str, dict]:
    ours = summarize(kinds[0])
    target = HB_DEFAULT + ACK_DEFAULT + 2.0
    lines = [f"# edge-agent benchmark{' (quick)' if quick else ''}", "",
             f"Run {time.strftime('%Y-%m-%d %H:%M:%S %Z')} in {elapsed:.0f} s on "
             f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
             f"python-socketio {_version('python-socketio')}, python-engineio "
             f"{_version('python-engineio')}.", "",
             "## Silent drop: detection and recovery", "",
             "Time from an nftables DROP of the live connection (both directions, no FIN, no RST;",
             "new connections pass) to the first heartbeat the server receives on a new",
             "connection. The drop lands at a random phase of the 15 s heartbeat cycle.", "",
             "| client | trials | median s | max s | x slower than edge-agent (median) | sockets held at once |",
             "|---|---|---|---|---|---|"]
    ratios = {}
    for k in kinds:
        s = summarize(k)
        ratio = (s["median"] / ours["median"]) if s["median"] and ours["median"] else None
        ratios[k.name] = ratio
        lines.append(f"| {k.label} | {s['ok']}/{len(k.trials)} | {s['median']} | {s['max']} | "
                     f"{ratio:.1f}x |" if ratio else f"| {k.label} | {s['ok']}/{len(k.trials)} | "
                     f"{s['median']} | {s['max']} | - |")
        lines[-1] += f" {s['sockets_max']} |"
    lines += ["", f"Target for edge-agent with its defaults: at most {target:g} s "
              f"(heartbeat + ACK timeout + 2 s): max measured {ours['max']} s.", "",
              "Per trial (phase = seconds into the heartbeat cycle at the drop):", "",
              "| client | phase s | recovery s | error |", "|---|---|---|---|"]
    for k in kinds:
        for t in k.trials:
            lines.append(f"| {k.name} | {t.phase_s} | {t.recovery_s} | {t.error} |")
    if uploads:
        lines += ["", "## Upload queue", "",
                  f"{uploads['items']} items of {uploads['payload_bytes']} bytes, queued in sqlite "
                  "(WAL, synchronous=FULL) then sent one request each to the reference server "
                  "on loopback.", "",
                  "| items/s | bytes written per enqueue | bytes written per confirmed send | stored at server |",
                  "|---|---|---|---|",
                  f"| {uploads['items_per_s']} | {uploads['enqueue_bytes_per_item']} | "
                  f"{uploads['send_bytes_per_item']} | {uploads['stored']}/{uploads['items']} |"]
    text = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    name = f"{time.strftime('%Y%m%d-%H%M%S')}{'-quick' if quick else ''}"
    (out / f"{name}.md").write_text(text)
    (out / f"{name}.json").write_text(json.dumps(
        {k.name: [vars(t) for t in k.trials] for k in kinds}, indent=1, default=list))
    return text, {"ours": ours, "ratios": ratios, "target": target, "path": str(out / f"{name}.md")}


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:
        return "?"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="reduced matrix for CI (under 3 min)")
    p.add_argument("--trials", type=int, default=None)
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    p.add_argument("--seed", type=int, default=int(time.time()))
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("bench: needs root (private network namespaces and nftables)", file=sys.stderr)
        return 1
    trials = args.trials or (3 if args.quick else 10)
    t0 = time.monotonic()
    workroot = Path(os.environ.get("TMPDIR", "/tmp")) / f"edge-agent-bench-{os.getpid()}"
    kinds = silent_drop(trials, args.quick, workroot, args.seed)
    uploads = upload_queue(200 if args.quick else 1000, workroot)
    text, summary = report(kinds, Path(args.out), args.quick, time.monotonic() - t0, uploads)
    print(text)
    print(f"report: {summary['path']}")
    ours = summary["ours"]
    stock = summarize(kinds[1])
    if ours["failed"] or ours["median"] is None:
        print("bench: FAIL: edge-agent did not recover in every trial", file=sys.stderr)
        return 1
    if stock["median"] is not None and ours["median"] >= stock["median"]:
        print("bench: FAIL: edge-agent is not faster than the stock client on a silent drop",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
