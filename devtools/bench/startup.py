"""Startup: what `edge-agent run` costs before it is of use, beside a bare python-socketio
client on the same machine in the same run (issue #38).

Import: fresh interpreters import what `edge-agent run` imports to start (agent.cli,
then the daemon module and the upload queue's store, as cmd_run does) or what a bare
client needs (socketio and its Client); the time is taken inside the process around the
imports alone, so the interpreter's own start, the same for both, does not dilute it.

Link: from the spawn of the process to its first proven link, against the reference
fleet server on loopback. edge-agent (shipped link defaults, a token, a fresh state
directory) proves its link with the first ACKed heartbeat: the time is the status file's
``updated_at`` of its first version saying online and ``proven_live``. The bare client
connects (websocket), emits one heartbeat with a callback and prints the time the ACK
arrives. The server's receipt of each client's first heartbeat is kept beside them.

Beside the bench's own bare client, the design card's (issue #51): the packages the
agent is made of and nothing else (``import socketio, requests, sdnotify, psutil,
pyudev``), the same connect with auth and one ACKed heartbeat. Against it: the import
statement, best of at least 5 fresh interpreters, and the exec to the first heartbeat at
the server, median of at least 7.

Repetitions rotate the clients, after one warm-up of each that is not counted
(bytecode compiled, page cache warm, as on a screen that has booted before).

Alone: ``python -m devtools.bench.startup --reps 3`` (root for a private loopback;
without it, the machine's own)."""
from __future__ import annotations

import ast

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from devtools.harness import REPO, FleetServerProcess, wait_for

from devtools.bench.common import DEVICE, edge_agent

TARGET = 1.3   # issue #38: each ratio at most this (and #51's against the design card)
BARE_DEVICE = "bare-1"
CARD_DEVICE = "card-1"
CARD_IMPORT_REPS, CARD_LINK_REPS = 5, 7   # issue #51: best of 5, median of 7

# the bare client: connect, one heartbeat with an ACK callback, print when the ACK came
BARE_CLIENT = """\
import sys, threading, time
import socketio
acked = threading.Event()
sio = socketio.Client()
def ack(*_):
    print(repr(time.time()), flush=True)
    acked.set()
@sio.event
def connect():
    sio.emit("device:heartbeat", {"seq": 1, "ts": time.time()}, callback=ack)
sio.connect(sys.argv[1], auth={"device_id": sys.argv[2], "token": "t"}, transports=["websocket"])
ok = acked.wait(30)
sio.disconnect()
sys.exit(0 if ok else 1)
"""


def agent_imports(repo: Path = REPO) -> list[str]:
    """What cmd_run imports to start, in this tree: read from cli.py itself (cmd_run and
    the functions of cli.py it calls, _load's configuration among them), each
    ``from .x import y`` as the module y where y is one, else x."""
    tree = ast.parse((repo / "agent" / "cli.py").read_text())
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    run = funcs["cmd_run"]
    called = dict.fromkeys(c.func.id for c in ast.walk(run) if isinstance(c, ast.Call)
                           and isinstance(c.func, ast.Name) and c.func.id in funcs)
    found = []
    for node in (n for fn in (run, *(funcs[c] for c in called)) for n in ast.walk(fn)):
        if not (isinstance(node, ast.ImportFrom) and node.level == 1 and node.module):
            continue
        base = repo / "agent" / node.module.replace(".", "/")
        for alias in node.names:
            is_module = (base / f"{alias.name}.py").exists() or (base / alias.name).is_dir()
            found.append(f"agent.{node.module}.{alias.name}" if is_module
                         else f"agent.{node.module}")
    return ["agent.cli", *dict.fromkeys(found)]


BARE_IMPORTS = ["socketio"]
BARE_TOUCH = "socketio.Client"   # what a bare client goes on to use
# the design card's packages, nothing else (issue #51's bare client)
CARD_IMPORTS = ["socketio", "requests", "sdnotify", "psutil", "pyudev"]
CARD_CLIENT = BARE_CLIENT.replace("import socketio\n", "import socketio, requests, sdnotify, "
                                  "psutil, pyudev\n", 1)


@dataclass
class Startup:
    reps: int
    agent_modules: list
    agent_import_ms: list = field(default_factory=list)
    bare_import_ms: list = field(default_factory=list)
    agent_process_ms: list = field(default_factory=list)   # interpreter start + imports + exit
    bare_process_ms: list = field(default_factory=list)
    agent_link_ms: list = field(default_factory=list)      # spawn to the first proven link
    bare_link_ms: list = field(default_factory=list)
    agent_server_ms: list = field(default_factory=list)    # spawn to the server's first heartbeat
    bare_server_ms: list = field(default_factory=list)
    card_import_ms: list = field(default_factory=list)      # the design card's bare client
    card_process_ms: list = field(default_factory=list)
    card_link_ms: list = field(default_factory=list)
    card_server_ms: list = field(default_factory=list)
    card: dict = field(default_factory=dict)               # agent / card: best, medians
    heaviest: list = field(default_factory=list)           # agent-only imports: [name, self ms]
    medians: dict = field(default_factory=dict)
    ratios: dict = field(default_factory=dict)
    errors: list = field(default_factory=list)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGE_AGENT_")}
    env["PYTHONPATH"] = str(REPO)
    env.pop("NOTIFY_SOCKET", None)
    return env


# what /usr/bin/edge-agent does before it imports anything for `run` (agent/__main__.py)
AGENT_PROLOGUE = "import gc\ngc.disable()\n"


def _import_code(modules: list[str], touch: str = "") -> str:
    prologue = AGENT_PROLOGUE if modules and modules[0].startswith("agent") else ""
    return ("import time\nt = time.perf_counter()\n" + prologue
            + "".join(f"import {m}\n" for m in modules) + (f"{touch}\n" if touch else "")
            + "print(repr((time.perf_counter() - t) * 1000))\n")


def _import_once(modules: list[str], touch: str = "") -> tuple[float, float]:
    """(import ms inside the process, the whole process's wall ms)."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _import_code(modules, touch)], cwd=REPO,
                         env=_env(), capture_output=True, text=True, timeout=60)
    wall = (time.perf_counter() - t0) * 1000
    if out.returncode != 0:
        raise RuntimeError(f"import of {modules} failed: {out.stderr.strip()[-300:]}")
    return float(out.stdout.strip().splitlines()[-1]), wall


def _importtime(modules: list[str], touch: str = "") -> dict[str, int]:
    """-X importtime: each module's own import time, microseconds."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", _import_code(modules, touch)],
                         cwd=REPO, env=_env(), capture_output=True, text=True, timeout=60)
    mods = {}
    for line in out.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        try:
            self_us, _cum, name = (p.strip() for p in line[len("import time:"):].split("|"))
            mods[name] = int(self_us)
        except ValueError:   # the header line
            continue
    return mods


def heaviest_agent_only(modules: list[str], top: int = 8) -> list[list]:
    """The modules only the agent imports (not the design card's client), by package
    (agent's by its sub-package), with their own import time summed: where the
    difference in import time goes."""
    ours, bare = _importtime(modules), _importtime(CARD_IMPORTS, BARE_TOUCH)
    groups: dict[str, int] = {}
    for name, us in ours.items():
        if name in bare:
            continue
        parts = name.split(".")
        key = ".".join(parts[:2]) if parts[0] == "agent" and len(parts) > 1 else parts[0]
        groups[key] = groups.get(key, 0) + us
    return [[k, round(v / 1000, 1)] for k, v in sorted(groups.items(), key=lambda kv: -kv[1])[:top]]


def _first_after(times: list, t0: float) -> float | None:
    later = [t for t in times or [] if t >= t0 - 0.002]
    return min(later) if later else None


def _agent_once(server: FleetServerProcess, work: Path) -> tuple[float, float | None]:
    work.mkdir(parents=True)
    t0 = time.time()
    agent = edge_agent(server, work)
    try:
        def proven():
            doc = agent.status()
            link = doc.get("link") or {}
            return doc if link.get("state") == "online" and link.get("proven_live") else None
        try:
            doc = wait_for(proven, 30, interval=0.01, what="edge-agent's link proven live")
        except AssertionError as e:
            tail = " / ".join(agent.log_text().strip().splitlines()[-3:])
            raise AssertionError(f"{e}; its log ends: {tail}") from None
        seen = doc.get("updated_at") or time.time()
    finally:
        if agent.stop() is None or agent.alive():
            agent.proc.kill()
    first = _first_after(server.device(DEVICE).get("first_heartbeat_times"), t0)
    return (seen - t0) * 1000, (first - t0) * 1000 if first else None


def _bare_once(server: FleetServerProcess, work: Path, client: str = BARE_CLIENT,
               device: str = BARE_DEVICE) -> tuple[float, float | None]:
    work.mkdir(parents=True)
    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", client, server.url, device],
                         cwd=work, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"bare client: no ACK: {out.stderr.strip()[-300:]}")
    acked = float(out.stdout.strip().splitlines()[-1])
    first = _first_after(server.device(device).get("first_heartbeat_times"), t0)
    return (acked - t0) * 1000, (first - t0) * 1000 if first else None


def _card_once(server: FleetServerProcess, work: Path) -> tuple[float, float | None]:
    return _bare_once(server, work, CARD_CLIENT, CARD_DEVICE)


def _med(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 1) if values else None


def byte_compile(repo: Path = REPO) -> None:
    """The agent's modules compiled, as the package's installation compiles them
    (py3compile) and as pip compiled the bare client's libraries: a tree edited since
    its last run (or run with PYTHONDONTWRITEBYTECODE) would otherwise be timed
    compiling its sources, which no screen does."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(repo / "agent")],
                   check=True, capture_output=True, timeout=120)


def measure(reps: int, work: Path) -> Startup:
    work.mkdir(parents=True)
    byte_compile()
    mods = agent_imports()
    s = Startup(reps, mods)
    # imports: one warm-up each, then rotating, fresh interpreters
    order = [("agent", mods, ""), ("bare", BARE_IMPORTS, BARE_TOUCH),
             ("card", CARD_IMPORTS, BARE_TOUCH)]
    for i in range(max(reps, CARD_IMPORT_REPS) + 1):
        for name, m, touch in order[i % 3:] + order[:i % 3]:
            ms, wall = _import_once(m, touch)
            if i:
                getattr(s, f"{name}_import_ms").append(round(ms, 1))
                getattr(s, f"{name}_process_ms").append(round(wall, 1))
    try:
        s.heaviest = heaviest_agent_only(mods)
    except Exception as e:  # a diagnostic: never the row's failure
        s.errors.append(f"importtime: {e!r}")
    # spawn to a proven link: one server, one warm-up each, then alternating
    netns = contextlib.nullcontext()
    if os.geteuid() == 0:
        from devtools.netns import NetNS
        netns = NetNS()
    with netns:
        server = FleetServerProcess(work, "--accept-any").start()
        try:
            clients = [("agent", _agent_once), ("bare", _bare_once), ("card", _card_once)]
            for i in range(max(reps, CARD_LINK_REPS) + 1):
                for name, once in clients[i % 3:] + clients[:i % 3]:
                    try:
                        link, first = once(server, work / f"{name}-{i}")
                    except Exception as e:
                        s.errors.append(f"{name} #{i}: {e}")
                        continue
                    if i:
                        getattr(s, f"{name}_link_ms").append(round(link, 1))
                        getattr(s, f"{name}_server_ms").append(round(first, 1) if first else None)
        finally:
            server.kill()
    for key in ("import_ms", "process_ms", "link_ms", "server_ms"):
        a, b = _med(getattr(s, f"agent_{key}")), _med(getattr(s, f"bare_{key}"))
        s.medians[f"agent_{key}"], s.medians[f"bare_{key}"] = a, b
        s.ratios[key] = round(a / b, 2) if a and b else None
    best = [min(v) if v else None for v in (s.agent_import_ms, s.card_import_ms)]
    s.card = {"agent_import_best_ms": best[0], "card_import_best_ms": best[1],
              "agent_server_ms": s.medians["agent_server_ms"],
              "card_server_ms": _med(s.card_server_ms), "card_link_ms": _med(s.card_link_ms),
              "card_process_ms": _med(s.card_process_ms)}
    s.card["import"] = round(best[0] / best[1], 2) if all(best) else None
    a, b = s.card["agent_server_ms"], s.card["card_server_ms"]
    s.card["server"] = round(a / b, 2) if a and b else None
    return s


def _x(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def _met(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x (target <= {TARGET}x: {'met' if r <= TARGET else 'NOT met'})"


def section(s: Startup) -> list[str]:
    m, r = s.medians, s.ratios
    lines = ["## 8. Startup: imports and spawn to a proven link", "",
             f"Medians of {len(s.agent_import_ms) or s.reps} fresh processes each for the imports, "
             f"{len(s.agent_link_ms) or s.reps} for the link,",
             "edge-agent and a bare python-socketio client (and the design card's, below)",
             "rotating, after a warm-up of each. Import: inside the process, around",
             "the imports alone (edge-agent: what `edge-agent run` imports to start,",
             f"{', '.join(s.agent_modules)}; bare: socketio and its Client); process: the",
             "interpreter's start, the imports and its exit. Link: from the spawn to the client's",
             "own proof, its first ACKed heartbeat (edge-agent: its status file saying proven",
             "live; the bare client: the ACK callback), from the reference fleet server on",
             "loopback. Server: from the spawn to the server's receipt of the first heartbeat.", "",
             "| measure | edge-agent ms | bare client ms | edge-agent / bare |", "|---|---|---|---|"]
    for key, label in (("import_ms", "import"), ("process_ms", "import, whole process"),
                       ("link_ms", "spawn to proven link"), ("server_ms", "spawn to first heartbeat at the server")):
        ratio = r.get(key)
        lines.append(f"| {label} | {m.get(f'agent_{key}')} | {m.get(f'bare_{key}')} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}x'} |")
    lines += ["", f"Import {_met(r.get('import_ms'))}; spawn to a proven link {_met(r.get('link_ms'))}."]
    c = s.card
    if c:
        lines += ["", "Against the design card's bare client (issue #51): `import socketio, requests,",
                  "sdnotify, psutil, pyudev` and nothing else, the same connect with auth and one",
                  "ACKed heartbeat, byte-compiled, each run a fresh process.", "",
                  "| measure | edge-agent ms | design card's client ms | edge-agent / card |",
                  "|---|---|---|---|",
                  f"| import statement, best of {len(s.card_import_ms)} | "
                  f"{c.get('agent_import_best_ms')} | {c.get('card_import_best_ms')} | "
                  f"{_x(c.get('import'))} |",
                  f"| exec to the first heartbeat at the server, median of {len(s.card_server_ms)} | "
                  f"{c.get('agent_server_ms')} | {c.get('card_server_ms')} | {_x(c.get('server'))} |",
                  "", f"Import {_met(c.get('import'))}; exec to the first heartbeat at the server "
                      f"{_met(c.get('server'))}."]
    if s.heaviest:
        lines += ["", "Imported by edge-agent and not by the design card's client, heaviest (own "
                  "import time, -X importtime): "
                  + ", ".join(f"{n} {ms:g} ms" for n, ms in s.heaviest) + "."]
    if s.errors:
        lines += ["", "Errors:", *[f"- {e}" for e in s.errors]]
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m devtools.bench.startup", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3, help="counted repetitions of each (default 3)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="edge-agent-startup-"))
    try:
        s = measure(args.reps, work / "startup")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n".join(section(s)))
    if args.json:
        print(json.dumps(vars(s), indent=1))
    return 1 if s.errors and not s.agent_link_ms else 0


if __name__ == "__main__":
    raise SystemExit(main())
