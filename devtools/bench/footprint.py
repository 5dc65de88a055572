"""Footprint of one agent idle online, beside a bare python-socketio client doing only
the ACKed heartbeat (same server, same 15 s heartbeat, measured over the same window)."""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from devtools.harness import FleetServerProcess, wait_for
from devtools.netns import NetNS

from devtools.bench.common import DEVICE, StockProcess, edge_agent


def _sample(pid: int) -> dict:
    """CPU from each thread's schedstat (nanoseconds on the CPU): /proc/PID/stat counts
    10 ms ticks, too coarse for an idle process over minutes (0.05 s is 5 ticks)."""
    cpu = 0.0
    rss = vol = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                cpu += int(f.read().split()[0]) / 1e9
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        vol += int(line.split()[1])
        except FileNotFoundError:
            pass
    write = 0
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                write = int(line.split()[1])
    return {"cpu_s": cpu, "rss": rss, "vol": vol, "write_bytes": write,
            "threads": len(os.listdir(f"/proc/{pid}/task"))}


@dataclass
class Footprint:
    client: str
    window_s: float
    rss_mb: float = 0.0
    cpu_s: float = 0.0
    wakeups_per_min: float = 0.0
    write_bytes: int = 0
    heartbeats: int = 0
    threads: int = 0

    @property
    def bytes_per_heartbeat(self) -> float:
        return self.write_bytes / self.heartbeats if self.heartbeats else 0.0


def measure(window_s: float, work: Path, warmup_s: float = 20.0) -> list[Footprint]:
    work.mkdir(parents=True)
    runtime = Path("/dev/shm") / f"edge-agent-bench-{os.getpid()}"  # /run is tmpfs on a Pi
    with NetNS():
        server = FleetServerProcess(work, "--accept-any").start()
        agent = bare = None
        try:
            (work / "agent").mkdir()
            (work / "bare").mkdir()
            agent = edge_agent(server, work / "agent", runtime={"dir": str(runtime)})
            bare = StockProcess(server.url, work / "bare", "--acked", device_id="bare-1")
            for dev in (DEVICE, "bare-1"):
                wait_for(lambda: server.device(dev).get("first_heartbeat_times"), 30,
                         what=f"{dev} online")
            time.sleep(warmup_s)
            os.sync()
            hb0 = {d: server.device(d)["heartbeats"] for d in (DEVICE, "bare-1")}
            s0 = {"edge-agent": _sample(agent.pid), "bare": _sample(bare.pid)}
            time.sleep(window_s)
            os.sync()
            s1 = {"edge-agent": _sample(agent.pid), "bare": _sample(bare.pid)}
            hb1 = {d: server.device(d)["heartbeats"] for d in (DEVICE, "bare-1")}
            out = []
            for name, dev in (("edge-agent", DEVICE), ("bare", "bare-1")):
                a, b = s0[name], s1[name]
                out.append(Footprint(name, window_s, rss_mb=round(b["rss"] / 2**20, 1),
                                     cpu_s=round(b["cpu_s"] - a["cpu_s"], 3),
                                     wakeups_per_min=round((b["vol"] - a["vol"]) / window_s * 60, 1),
                                     write_bytes=b["write_bytes"] - a["write_bytes"],
                                     heartbeats=hb1[dev] - hb0[dev], threads=b["threads"]))
            return out
        finally:
            for c in (agent, bare):
                if c is not None:
                    c.stop()
            server.kill()
            shutil.rmtree(runtime, ignore_errors=True)
