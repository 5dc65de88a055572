"""The adaptive heartbeat behind a box that reaps idle flows, side by side with a fixed
one: edge-agent with its shipped defaults (heartbeat 15 s, ACK 5 s) behind the reaping
proxy (10 s), with [link] adapt_heartbeat on and off, each in its own namespace."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from devtools.harness import REPO, FleetServerProcess, wait_for
from devtools.netns import NetNS
from devtools.reaping_proxy import reap_times

from devtools.bench.common import DEVICE, edge_agent

REAP_IDLE_S = 10.0


@dataclass
class ReapRun:
    adaptive: bool
    seconds: float = 0.0
    reaps: int = 0
    reaps_after_learning: int | None = None
    learnt_interval_s: float | None = None
    online_fraction: float = 0.0
    error: str = ""


def run(adaptive: bool, seconds: float, work: Path) -> ReapRun:
    work.mkdir(parents=True)
    r = ReapRun(adaptive, seconds)
    with NetNS():
        server = FleetServerProcess(work, "--accept-any").start()
        pf = work / "proxy-port"
        reaper = subprocess.Popen([sys.executable, "-m", "devtools.reaping_proxy", "--target",
                                   str(server.port), "--idle-s", str(REAP_IDLE_S),
                                   "--port-file", str(pf)], cwd=REPO,
                                  stdout=open(work / "reaper.log", "ab"))
        agent = None
        try:
            wait_for(lambda: pf.exists() and pf.read_text(), 10, what="the reaping proxy")
            agent = edge_agent(server, work, url=f"http://127.0.0.1:{int(pf.read_text())}",
                               link={"adapt_heartbeat": adaptive})
            start = wait_for(lambda: server.device(DEVICE).get("connect_times"), 30,
                             what="the first connect")[0]
            learnt_at = None
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                interval = agent.link().get("heartbeat_interval_s")
                if learnt_at is None and interval is not None and interval < 15.0:
                    learnt_at, r.learnt_interval_s = time.time(), interval
                time.sleep(0.25)
            stop = time.time()
            reaps = reap_times(work / "reaper.log")
            r.reaps = len(reaps)
            if learnt_at is not None:
                r.reaps_after_learning = len([t for t in reaps if t > learnt_at])
            # the flow is dead from a reap to the next connect: the server hears nothing
            connects = server.device(DEVICE).get("connect_times", [])
            dead = sum(min([c for c in connects if c > t] + [stop]) - t for t in reaps)
            r.online_fraction = round(1 - dead / max(1e-9, stop - start), 3)
        except Exception as e:
            r.error = str(e)[:200]
        finally:
            if agent is not None:
                agent.stop()
            reaper.kill()
            reaper.wait(5)
            server.kill()
    return r


def compare(seconds: float, work: Path) -> list[ReapRun]:
    results: dict[bool, ReapRun] = {}

    def one(adaptive: bool) -> None:
        results[adaptive] = run(adaptive, seconds, work / f"idle-reap-{'adaptive' if adaptive else 'fixed'}")
    threads = [threading.Thread(target=one, args=(a,)) for a in (True, False)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [results[True], results[False]]


def section(runs: list[ReapRun]) -> list[str]:
    ours, fixed = runs
    lines = ["## 7. A box that reaps idle flows: the adaptive heartbeat", "",
             f"edge-agent with its defaults (heartbeat 15 s, ACK timeout 5 s) behind a proxy that",
             f"silently stops forwarding a flow idle for {REAP_IDLE_S:g} s "
             "(devtools/reaping_proxy.py), for",
             f"{ours.seconds:.0f} s, with `[link] adapt_heartbeat` on (learns the limit) and off",
             "(today's fixed heartbeat). Online: the share of the run from the first connect",
             "during which the server could hear the device (from each reap to the next connect",
             "it cannot).", "",
             "| heartbeat | reaps | reaps after learning | learnt interval s | online | error |",
             "|---|---|---|---|---|---|"]
    for r, name in ((ours, "adaptive"), (fixed, "fixed 15 s")):
        lines.append(f"| {name} | {r.reaps} | {'-' if r.reaps_after_learning is None else r.reaps_after_learning} "
                     f"| {r.learnt_interval_s or '-'} | {r.online_fraction:.0%} | {r.error} |")
    learning = ours.reaps - (ours.reaps_after_learning or 0)
    met = ours.reaps_after_learning == 0 and learning <= 3
    lines += ["", f"Target: at most 3 reaps while learning and none after: {learning} and "
              f"{ours.reaps_after_learning} ({'met' if met else 'NOT met'})."]
    return lines
