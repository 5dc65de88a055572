"""Real processes for end-to-end tests: the reference fleet server and the agent."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from agent.runtime.watchdog_gate import WatchdogGate
from devtools import netns

REPO = Path(__file__).resolve().parent.parent


def wait_for(predicate, timeout: float, interval: float = 0.02, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def terminate(proc: subprocess.Popen | None, timeout: float = 10.0) -> int | None:
    """SIGTERM, then SIGKILL if it has not gone within ``timeout``; its exit status."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode if proc is not None else None


class FleetServerProcess:
    def __init__(self, workdir: Path, *args: str, devices: dict[str, str] | None = None):
        self.workdir = workdir
        self.args = list(args)
        self.devices = devices or {"screen-1": "s3cret-token"}
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> "FleetServerProcess":
        port_file = self.workdir / f"server-port-{self.starts}"
        cmd = [sys.executable, "-m", "fleet_server", "--port", str(self.port),
               "--port-file", str(port_file), *self.args]
        for d, t in self.devices.items():
            cmd += ["--device", f"{d}:{t}"]
        self.log = open(self.workdir / "server.log", "ab")
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT)
        self.starts += 1
        wait_for(port_file.exists, 15, what="fleet server to listen")
        self.port = int(port_file.read_text())
        # written once it listens: a client may connect before wait_for's next look
        self.listening_at = port_file.stat().st_mtime
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        terminate(self.proc)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def admin(self, path: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())

    def device(self, device_id: str = "screen-1") -> dict:
        return self.admin("/admin/devices").get(device_id, {})

    def pair(self, code: str) -> subprocess.CompletedProcess:
        """What an operator types after reading the code off the screen."""
        return subprocess.run([str(REPO / "scripts" / "fleet-server"), "pair", code, "--url", self.url],
                              capture_output=True, text=True, timeout=30,
                              env={**os.environ, "EDGE_AGENT_PYTHON": sys.executable})


def agent_config(server: FleetServerProcess, workdir: Path, /, **sections) -> Path:
    doc = {
        # the protocol these tests were written for; "profile": None asks for the default
        # ("auto": the server's answers tell, tests/test_server_kind_real.py)
        "server": {"url": server.url, "connect_timeout_s": 2.0, "profile": "edge-agent"},
        "identity": {"device_id": "screen-1", "token": server.devices.get("screen-1", "x"),
                     "state_dir": str(workdir / "state")},
        "runtime": {"dir": str(workdir / "run")},
        "link": {"heartbeat_interval_s": 2.0, "ack_timeout_s": 1.0, "stable_after_s": 30.0,
                 "backoff": {"base_s": 0.5, "cap_s": 2.0},
                 "keepalive": {"idle_s": 7, "interval_s": 3, "count": 4, "user_timeout_s": 6.5}},
        "log": {"level": "info"},
    }
    for name, values in sections.items():
        node = doc
        for part in name.split("__"):
            node = node.setdefault(part, {})
        node.update(values)
    path = workdir / "agent.toml"
    path.write_text(_toml(doc))
    return path


def _toml(doc: dict, prefix: str = "") -> str:
    out = ""
    # None leaves a key out: how a test asks for a default (e.g. no token: enroll)
    plain = {k: v for k, v in doc.items() if not isinstance(v, dict) and v is not None}
    if plain:
        if prefix:
            out += f"[{prefix}]\n"
        for k, v in plain.items():
            out += f"{k} = {json.dumps(v)}\n"
    for k, v in doc.items():
        if isinstance(v, dict):
            out += _toml(v, f"{prefix}.{k}" if prefix else k)
    return out


class AgentProcess:
    def __init__(self, python: str, config: Path, workdir: Path, env: dict | None = None,
                 command: list[str] | None = None):
        self.python = python
        # an installed agent (/usr/bin/edge-agent) runs as it is, not from this checkout
        self.command = command
        self.extra_env = env or {}
        self.config = config
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None
        self.status_path = workdir / "run" / "status.json"

    def start(self) -> "AgentProcess":
        env = {k: v for k, v in os.environ.items() if not k.startswith("EDGE_AGENT_")}
        if self.command is None:
            env["PYTHONPATH"] = str(REPO)
        else:
            env.pop("PYTHONPATH", None)
        env.pop("NOTIFY_SOCKET", None)
        env.update(self.extra_env)
        self.log_path = self.workdir / "agent.log"
        self.log = open(self.log_path, "ab")
        cmd = self.command or [self.python, "-m", "agent"]
        self.proc = subprocess.Popen([*cmd, "run", "--config", str(self.config)],
                                     cwd=self.workdir, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def status(self) -> dict:
        try:
            return json.loads(self.status_path.read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def link(self) -> dict:
        return self.status().get("link", {})

    def wait_live(self, timeout: float = 10.0, connection: int | None = None) -> dict:
        def live():
            link = self.link()
            if link.get("state") == "online" and link.get("proven_live") and (
                    connection is None or link.get("connection") == connection):
                return link
            return None
        return wait_for(live, timeout, what=f"agent online and ACKed (connection {connection})")

    def sockets(self, server_port: int) -> list[dict]:
        return [s for s in netns.tcp_sockets(self.pid, server_port)
                if s["state"] not in ("TIME_WAIT", "CLOSE")]

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 10.0) -> int | None:
        return terminate(self.proc, timeout)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class SocketSampler:
    """Samples the agent's sockets to the server in the background: the max ever held."""

    def __init__(self, agent: AgentProcess, server_port_fn, interval: float = 0.01):
        self.agent, self.port_fn, self.interval = agent, server_port_fn, interval
        self.max_seen = 0
        self.worst: list[dict] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)

    def _run(self):
        while not self._stop.is_set():
            held = self.agent.sockets(self.port_fn())
            if len(held) > self.max_seen:
                self.worst = held  # what they were, for the assertion message
            self.max_seen = max(self.max_seen, len(held))
            self.samples += 1
            self._stop.wait(self.interval)


class FakeSystemd:
    """An AF_UNIX datagram socket standing in for systemd's notify socket."""

    def __init__(self, path, watchdog_s: float | None = None):
        self.path = str(path)
        self.watchdog_s = watchdog_s
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            for line in data.decode().split("\n"):
                self.messages.append((time.monotonic(), line))

    def times(self, line):
        return [t for t, m in self.messages if m == line]

    def statuses(self):
        return [m[7:] for _, m in self.messages if m.startswith("STATUS=")]

    def env(self):
        env = {"NOTIFY_SOCKET": self.path}
        if self.watchdog_s:
            env["WATCHDOG_USEC"] = str(int(self.watchdog_s * 1e6))
        return env

    def close(self):
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


class TurnRecorder(WatchdogGate):
    """A watchdog gate that tells a test each turn and each idle wait of a loop."""

    def __init__(self, on_turn=lambda: None, on_idle=lambda: None):
        super().__init__()
        self._on_turn, self._on_idle = on_turn, on_idle

    def tick(self, name: str, now: float) -> None:
        super().tick(name, now)
        self._on_turn()

    def idle(self, name: str) -> None:
        super().idle(name)
        self._on_idle()
