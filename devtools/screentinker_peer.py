"""The real ScreenTinker server (Node, socket.io 4, better-sqlite3) for the profile's tests.

Its code is never in this repository, nor how to build it. The tests look for a
prepared server tree (``server/`` with its Node dependencies in place) at
``PEER_DIR``, outside the repository, on the machine CI runs on. Each test gets a
private copy of the tree's source (its own sqlite database, uploads and JWT secret)
with the tree's ``node_modules`` linked in, and runs it inside the test's network
namespace.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from devtools.harness import REPO, terminate, wait_for

PEER_DIR = Path(os.environ.get("EDGE_AGENT_SCREENTINKER_DIR",
                               "/var/cache/edge-agent/peers/screentinker/server"))
TIMING_SHIM = REPO / "devtools" / "node" / "socketio_timing.js"


def unavailable() -> str | None:
    """Why the real server cannot run here, in one line; None when it can."""
    if shutil.which("node") is None:
        return "node is not installed"
    if not (PEER_DIR / "server.js").is_file():
        return f"no ScreenTinker server tree at {PEER_DIR} (see README: the real ScreenTinker server)"
    native = PEER_DIR / "node_modules" / "better-sqlite3" / "build" / "Release" / "better_sqlite3.node"
    if not native.is_file():
        return f"{PEER_DIR}: its better-sqlite3 native module is not built"
    return None


def commit() -> str:
    try:
        return (PEER_DIR.parent / "COMMIT").read_text().strip()[:12]
    except OSError:
        return "unknown"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ScreenTinkerServer:
    OPERATOR = {"email": "operator@example.invalid", "password": "correct horse battery 9",
                "name": "Operator"}

    def __init__(self, workdir: Path, ping_interval_s: float | None = None,
                 ping_timeout_s: float | None = None):
        self.workdir = workdir / "screentinker"
        self.server_dir = self.workdir / "server"
        self.ping_interval_s, self.ping_timeout_s = ping_interval_s, ping_timeout_s
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self._token: str | None = None

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> "ScreenTinkerServer":
        if not self.server_dir.exists():
            shutil.copytree(PEER_DIR, self.server_dir, symlinks=True,
                            ignore=shutil.ignore_patterns("node_modules", "*.db", "*.db-*",
                                                          "uploads", "certs"))
            (self.server_dir / "node_modules").symlink_to(PEER_DIR / "node_modules")
            frontend = PEER_DIR.parent / "frontend"
            if frontend.exists():
                (self.workdir / "frontend").symlink_to(frontend)
        self.port = self.port or _free_port()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PORT": str(self.port),
               "HTTPS_PORT": str(_free_port()), "SELF_HOSTED": "true", "NODE_ENV": "production"}
        if self.ping_interval_s:
            env["EDGE_TEST_PING_INTERVAL_MS"] = str(int(self.ping_interval_s * 1000))
        if self.ping_timeout_s:
            env["EDGE_TEST_PING_TIMEOUT_MS"] = str(int(self.ping_timeout_s * 1000))
        self.log = open(self.workdir / "server.log", "ab")
        self.proc = subprocess.Popen(["node", "--require", str(TIMING_SHIM), "server.js"],
                                     cwd=self.server_dir, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        wait_for(self._answers, 30, interval=0.1, what="the ScreenTinker server to listen")
        return self

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"ScreenTinker server exited {self.proc.returncode}:\n"
                                 + self.log_text()[-2000:])
        try:
            with urllib.request.urlopen(self.url + "/api/auth/config", timeout=1):
                return True
        except urllib.error.HTTPError:
            return True  # it answered
        except OSError:
            return False

    def stop(self) -> None:
        terminate(self.proc)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        try:
            return (self.workdir / "server.log").read_text(errors="replace")
        except OSError:
            return ""

    # -- the operator's side: its HTTP API and its database -------------------------
    def api(self, method: str, path: str, body: dict | None = None, auth: bool = True):
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = "Bearer " + self.operator_token()
        req = urllib.request.Request(self.url + path, method=method, headers=headers,
                                     data=json.dumps(body).encode() if body is not None else None)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def operator_token(self) -> str:
        if self._token is None:
            status, body = self.api("POST", "/api/auth/register", self.OPERATOR, auth=False)
            if status != 201:
                status, body = self.api("POST", "/api/auth/login",
                                        {k: self.OPERATOR[k] for k in ("email", "password")},
                                        auth=False)
            assert status in (200, 201), body
            self._token = body["token"]
        return self._token

    def pair(self, code: str, name: str = "Lobby screen") -> dict:
        """What the dashboard's 'Add display' does with the code read off the screen."""
        status, body = self.api("POST", "/api/provision/pair",
                                {"pairing_code": code.replace("-", ""), "name": name})
        assert status == 200, (status, body)
        return body

    def rows(self, sql: str, *args) -> list[dict]:
        db = sqlite3.connect(f"file:{self.server_dir / 'db' / 'remote_display.db'}?mode=ro",
                             uri=True, timeout=5)
        try:
            db.row_factory = sqlite3.Row
            return [dict(r) for r in db.execute(sql, args)]
        finally:
            db.close()

    def device(self, device_id: str) -> dict:
        rows = self.rows("SELECT * FROM devices WHERE id = ?", device_id)
        return rows[0] if rows else {}

    def wait_row(self, sql: str, *args, timeout: float = 20.0) -> list[dict]:
        return wait_for(lambda: self.rows(sql, *args), timeout, interval=0.2, what=sql)
