"""A two-node fleet behind a load balancer, from real parts: two reference fleet
servers sharing their Socket.IO emits through Redis (python-socketio's Redis adapter,
Debian's redis-server) and haproxy (Debian's) in front of them, balancing round robin
with an HTTP health check on /healthz, as a fleet is commonly run (or leastconn: a new
connection to the node holding the fewest, what rebalancing needs). Loopback only; the
caller owns the network namespace.

A node is frozen with SIGSTOP (a VM paused, a process stuck): its kernel still
completes the TCP handshakes for its listening socket, so to the balancer's TCP layer
it looks alive until the health check, which wants an HTTP answer, fails it.
"""
from __future__ import annotations

import shutil
import signal
import socket
import subprocess
from pathlib import Path

from devtools.harness import FleetServerProcess, terminate, wait_for
from devtools.site import free_port, listening


class Cluster:
    """``check_inter_s`` x ``fall``: about how long a frozen node keeps getting new
    connections before the balancer takes it out. ``check_inter_s=None``: no health
    check; take_out() is its verdict, at a moment the caller chooses."""

    def __init__(self, work: Path, *server_args: str, nodes: int = 2,
                 check_inter_s: float | None = 1.0, fall: int = 2, rise: int = 2,
                 redis: bool = True, redispatch: bool = False,
                 balance: str = "roundrobin", sticky: bool = False):
        """``redispatch``: a connect a node refuses (a draining node closed its listener)
        goes to the other node, as a balancer set up for rolling deploys does.
        ``balance``: haproxy's algorithm; ``leastconn`` sends a new connection to the
        node with the fewest open, so a screen a node asks to move lands on the lighter
        node (fleet-server --rebalance). ``sticky``: a cookie keeps a session's requests
        on its node, as Socket.IO's HTTP long-polling needs behind a balancer (a
        websocket-only client sends none)."""
        assert balance in ("roundrobin", "leastconn"), balance
        for tool in ("haproxy", "redis-server") if redis else ("haproxy",):
            assert shutil.which(tool), f"{tool} is needed (scripts/_env.sh installs it)"
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.redis_port = free_port() if redis else None
        self.redis: subprocess.Popen | None = None
        shared = ("--redis", f"redis://127.0.0.1:{self.redis_port}/0") if redis else ()
        self.nodes: list[FleetServerProcess] = []
        for n in range(nodes):
            node_dir = work / f"node-{n}"
            node_dir.mkdir(exist_ok=True)
            self.nodes.append(FleetServerProcess(node_dir, "--accept-any", *shared,
                                                 *server_args))
        self.check = (check_inter_s, fall, rise)
        self.redispatch = redispatch
        self.balance = balance
        self.sticky = sticky
        self.port = 0
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Cluster":
        if self.redis_port is not None:
            # in memory only, nothing written: the nodes' pub/sub, no more
            self.redis = subprocess.Popen(
                ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", str(self.work)],
                stdout=open(self.work / "redis.log", "ab"), stderr=subprocess.STDOUT)
            wait_for(lambda: listening(self.redis_port), 10, what="redis-server to listen")
        for node in self.nodes:
            node.start()
        self.port = free_port()
        inter_s, fall, rise = self.check
        inter_ms = int((inter_s or 1.0) * 1000)
        check = f" check inter {inter_ms} fall {fall} rise {rise}" if inter_s else ""
        cookie = (lambda n: f" cookie node{n}") if self.sticky else (lambda n: "")
        servers = "\n".join(f"    server node{n} 127.0.0.1:{node.port}{check}{cookie(n)}"
                            for n, node in enumerate(self.nodes))
        redispatch = "    option redispatch\n    retries 2\n" if self.redispatch else ""
        persist = "    cookie SERVERID insert indirect nocache\n" if self.sticky else ""
        self.admin_socket = self.work / "haproxy.sock"
        cfg = self.work / "haproxy.cfg"
        cfg.write_text(f"""global
    maxconn 4096
    stats socket {self.admin_socket} level admin
defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    # a websocket, once upgraded, is a tunnel: its own idle bound
    timeout tunnel 1h
    timeout check {max(100, inter_ms // 2)}ms
frontend fleet
    bind 127.0.0.1:{self.port}
    default_backend nodes
backend nodes
    balance {self.balance}
    option httpchk GET /healthz
{redispatch}{persist}{servers}
""")
        self.log = open(self.work / "haproxy.log", "ab")
        self.proc = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        wait_for(lambda: listening(self.port), 10, what="haproxy to listen")
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def freeze(self, n: int) -> None:
        self.nodes[n].proc.send_signal(signal.SIGSTOP)

    def thaw(self, n: int) -> None:
        self.nodes[n].proc.send_signal(signal.SIGCONT)

    def take_out(self, n: int) -> None:
        """The balancer sends no new connection to node ``n`` (what a failed health
        check does), through its admin socket."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(self.admin_socket))
            s.sendall(f"disable server nodes/node{n}\n".encode())
            s.recv(4096)

    def stop(self) -> None:
        for n in range(len(self.nodes)):
            if self.nodes[n].proc is not None and self.nodes[n].proc.poll() is None:
                self.thaw(n)   # a stopped process cannot act on SIGTERM
        terminate(self.proc, 5)
        for node in self.nodes:
            node.stop()
        terminate(self.redis, 5)
