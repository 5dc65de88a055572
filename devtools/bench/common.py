"""What every benchmark shares: the clients under test and reading their logs."""
from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from devtools.harness import REPO, AgentProcess, agent_config

HB_DEFAULT, ACK_DEFAULT = 15.0, 5.0
DEVICE = "screen-1"


class StockProcess:
    """The stock python-socketio client (devtools/stock_client.py)."""

    def __init__(self, url: str, workdir: Path, *extra: str, device_id: str = DEVICE):
        self.log_path = workdir / "stock.log"
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "devtools.stock_client", "--url", url, "--device-id",
             device_id, "--token", "t", *extra], cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(5)

    def lines(self) -> list[dict]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

    def noticed_after(self, t: float) -> float | None:
        times = [e["t"] for e in self.lines() if e["event"] == "disconnect" and e["t"] >= t]
        return times[0] if times else None


def edge_agent(server, workdir: Path, url: str | None = None, **sections) -> AgentProcess:
    """edge-agent with its shipped link defaults (heartbeat 15 s, ACK 5 s, backoff 1-60 s)."""
    link = {"heartbeat_interval_s": HB_DEFAULT, "ack_timeout_s": ACK_DEFAULT,
            "stable_after_s": 60.0, "backoff": {"base_s": 1.0, "cap_s": 60.0},
            "keepalive": {"idle_s": 15, "interval_s": 5, "count": 3, "user_timeout_s": 20.0}}
    link.update(sections.pop("link", {}))
    server_sec = {"connect_timeout_s": 10.0, **({"url": url} if url else {})}
    cfg = agent_config(server, workdir, server=server_sec, link=link, **sections)
    return AgentProcess(sys.executable, cfg, workdir).start()


def agent_log_times(agent: AgentProcess, needle: str, after: float) -> list[float]:
    """Wall times of the agent's log lines containing ``needle``, from ``after`` on."""
    out = []
    for line in agent.log_text().splitlines():
        if needle in line:
            try:
                t = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            except ValueError:
                continue
            if t >= after - 0.01:
                out.append(t)
    return out


def held(pid: int, port: int, dead: set | None = None) -> int:
    """Sockets the process holds to ``port`` (those the kernel is tearing down aside)."""
    from devtools.netns import tcp_sockets
    return len([s for s in tcp_sockets(pid, port) if s["state"] not in ("TIME_WAIT", "CLOSE")
                and (dead is None or s["local_port"] not in dead)])
