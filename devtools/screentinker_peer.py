"""The real ScreenTinker servers (Node, socket.io 4, better-sqlite3), each generation a
fleet may run, for the profile's tests.

Their code is never in this repository. It comes from a read-only folder beside it
(``../shared/peers/screentinker-<generation>/``, with its package-lock and commit), and
``python -m devtools.screentinker_peer prepare`` (run by scripts/test and .ci/run)
copies each to a cache outside the repository, named after its lock and commit, and
installs its Node dependencies there, once. Each test gets a private copy of a
prepared tree's source (its own sqlite database, uploads and JWT secret) with the
tree's ``node_modules`` linked in, and runs it inside the test's network namespace.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from devtools.harness import REPO, terminate, wait_for

# Where the servers come from: a read-only folder beside the repository (CI clones the
# repository next to it), one sub-folder per generation, with package-lock.json and COMMIT.
PEERS_SRC = Path(os.environ.get("EDGE_AGENT_PEERS_SRC", REPO.parent / "shared" / "peers"))
# Where they are prepared (npm ci, native modules built): writable, outside the repository.
PEERS_CACHE = Path(os.environ.get("EDGE_AGENT_PEERS_CACHE", "/var/cache/edge-agent/peers"))
GENERATIONS = ("1.2", "1.9")
TIMING_SHIM = REPO / "devtools" / "node" / "socketio_timing.js"
# Loads the native module and opens a database: what the server does first.
_LOADS = "new (require('better-sqlite3'))(':memory:').prepare('select 1').get()"


def source(generation: str) -> Path:
    return PEERS_SRC / f"screentinker-{generation}"


def prepared_dir(generation: str) -> Path:
    """The prepared copy of one generation: named after what decides its contents (the
    dependency lock and the upstream commit), so a new server is prepared afresh and an
    unchanged one is reused."""
    src = source(generation)
    digest = hashlib.sha256()
    for name in ("server/package-lock.json", "COMMIT"):
        digest.update((src / name).read_bytes())
    return PEERS_CACHE / f"screentinker-{generation}-{digest.hexdigest()[:12]}"


def unavailable(generation: str) -> str | None:
    """Why this generation's real server cannot run here, in one line; None when it can."""
    if shutil.which("node") is None:
        return "node is not installed (scripts/test installs it)"
    src = source(generation)
    if not (src / "server" / "server.js").is_file():
        return f"no ScreenTinker {generation} server at {src} (EDGE_AGENT_PEERS_SRC)"
    try:
        root = prepared_dir(generation)
    except OSError as e:
        return f"ScreenTinker {generation} at {src}: {e.strerror}: {e.filename}"
    if not (root / ".prepared").is_file():
        return (f"ScreenTinker {generation} is not prepared at {root}: run scripts/test, or "
                f"python -m devtools.screentinker_peer prepare")
    return None


def _run(cmd: list[str], cwd: Path, what: str) -> None:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=_npm_env())
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise PrepareError(f"{what} failed (exit {r.returncode}): {tail[0][:300]}")


def _npm_env() -> dict:
    env = {**os.environ, "npm_config_audit": "false", "npm_config_fund": "false",
           "npm_config_update_notifier": "false", "npm_config_loglevel": "error"}
    # node-gyp would download Node's headers; the installed node ships them
    if Path("/usr/include/node/common.gypi").is_file():
        env["npm_config_nodedir"] = "/usr"
    return env


def _node_needed(lock: Path) -> tuple[tuple[int, ...], str]:
    """The oldest Node every package the server runs with accepts (``>=X.Y.Z`` engines of
    its non-dev, non-optional packages in the lock), and the package that needs it."""
    need, who = (0,), "nothing"
    for name, pkg in json.loads(lock.read_text()).get("packages", {}).items():
        engines = pkg.get("engines")
        if pkg.get("dev") or pkg.get("optional") or not isinstance(engines, dict):
            continue
        m = re.fullmatch(r">=\s*(\d+(?:\.\d+)*)", str(engines.get("node", "")).strip())
        if m and tuple(map(int, m[1].split("."))) > need:
            need, who = tuple(map(int, m[1].split("."))), name.rsplit("node_modules/", 1)[-1]
    return need, who


def _node_version() -> tuple[int, ...]:
    out = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout
    return tuple(int(x) for x in re.findall(r"\d+", out)[:3]) or (0,)


def _loads(server: Path) -> bool:
    return subprocess.run(["node", "-e", _LOADS], cwd=server, capture_output=True).returncode == 0


class PrepareError(Exception):
    pass


def prepare(generation: str) -> tuple[Path, bool]:
    """Make one generation runnable in the cache, idempotently: (its dir, whether work was
    done). The source folder is read-only in CI, so it is copied first."""
    root = prepared_dir(generation)
    server = root / "server"
    if (root / ".prepared").is_file():
        if _loads(server):
            return root, False
        # node changed under a prepared tree: its native module is for another ABI
        _run(["npm", "rebuild", "better-sqlite3"], server,
             f"npm rebuild better-sqlite3 ({generation})")
        if not _loads(server):
            raise PrepareError(f"{server}: better-sqlite3 does not load after npm rebuild")
        return root, True
    if root.resolve().is_relative_to(REPO):
        raise PrepareError(f"{root} is inside the repository: their code stays out of it "
                           "(EDGE_AGENT_PEERS_CACHE)")
    need, who = _node_needed(source(generation) / "server" / "package-lock.json")
    if _node_version() < need:
        raise PrepareError(f"needs Node >= {'.'.join(map(str, need))} ({who}), this node is "
                           f"{'.'.join(map(str, _node_version()))}: install a newer nodejs")
    work = root.with_name(root.name + ".partial")  # under the lock: left by a failed run
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(source(generation), work, symlinks=True)
    for path in [work, *work.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o200)
    _run(["npm", "ci", "--omit=dev"], work / "server", f"npm ci in ScreenTinker {generation}")
    if not _loads(work / "server"):
        _run(["npm", "rebuild", "better-sqlite3"], work / "server",
             f"npm rebuild better-sqlite3 ({generation})")
        if not _loads(work / "server"):
            raise PrepareError(f"ScreenTinker {generation}: better-sqlite3 does not load "
                               "after npm rebuild")
    (work / ".prepared").write_text(f"{generation}\n")
    shutil.rmtree(root, ignore_errors=True)
    work.rename(root)
    for stale in PEERS_CACHE.glob(f"screentinker-{generation}-*"):
        if stale != root:  # an earlier lock or commit of this generation: 100+ MB each
            shutil.rmtree(stale, ignore_errors=True)
    return root, True


def prepare_all(generations=GENERATIONS) -> int:
    """The CLI: prepare every generation, side by side (each is mostly one compiler
    process), one line each when work was done; exit 1 with one line per failure."""
    PEERS_CACHE.mkdir(parents=True, exist_ok=True)
    with open(PEERS_CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second run beside this one waits, then reuses
        t0 = time.monotonic()

        def one(generation: str) -> str | None:
            try:
                root, worked = prepare(generation)
            except (PrepareError, OSError) as e:
                return f"ScreenTinker {generation}: {e}"
            if worked:
                print(f"prepared ScreenTinker {generation} in {root} "
                      f"({time.monotonic() - t0:.0f}s)", file=sys.stderr)
            return None
        with ThreadPoolExecutor(len(generations)) as pool:
            errors = [e for e in pool.map(one, generations) if e]
    for error in errors:
        print(error, file=sys.stderr)
    return 1 if errors else 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ScreenTinkerServer:
    OPERATOR = {"email": "operator@example.invalid", "password": "correct horse battery 9",
                "name": "Operator"}

    def __init__(self, workdir: Path, generation: str, ping_interval_s: float | None = None,
                 ping_timeout_s: float | None = None):
        self.generation = generation
        self.root = prepared_dir(generation)
        self.workdir = workdir / f"screentinker-{generation}"
        self.server_dir = self.workdir / "server"
        self.ping_interval_s, self.ping_timeout_s = ping_interval_s, ping_timeout_s
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self._token: str | None = None

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> "ScreenTinkerServer":
        fresh = not self.workdir.exists()
        if fresh:
            # its own database, uploads and JWT secret; the dependencies and the static
            # front end are shared, read-only
            shutil.copytree(self.root, self.workdir, symlinks=True,
                            ignore=shutil.ignore_patterns("node_modules", "*.db", "*.db-*",
                                                          "uploads", "certs", "frontend"))
            (self.server_dir / "node_modules").symlink_to(self.root / "server" / "node_modules")
            if (self.root / "frontend").exists():
                (self.workdir / "frontend").symlink_to(self.root / "frontend")
        self._boot()
        if fresh and self.generation != "1.2":
            # 1.9 copies its open database during its first boot's migrations, which drops
            # its file locks: a reader from outside could then delete the WAL it writes to.
            # A second boot opens the migrated file properly (see shared/peers/README.md).
            self.stop()
            self._boot()
        return self

    def _boot(self) -> None:
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


if __name__ == "__main__":
    if sys.argv[1:] != ["prepare"]:
        sys.exit("usage: python -m devtools.screentinker_peer prepare")
    sys.exit(prepare_all())
