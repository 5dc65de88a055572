"""`edge-agent status`, this tree beside the previous release's (issue #51: run by every
operator and every monitoring script, it should take a third of 0.2.2's time).

The previous release is the second entry of debian/changelog, its tree the commit that
set agent/__init__.py's version to it (git archive: nothing of the checkout is touched).
Both trees byte-compiled, as a package's installation compiles them; each run is a fresh
interpreter started as /usr/bin/edge-agent starts (isolated, ``-I``), without site
(``-S``: no .pth of the development environment, whose editable install would take the
one tree for the other) and with the same libraries on its path; it prints the same
status file (a running agent's, online) with the same configuration. Runs alternate the
two trees, after one warm-up each; the figure is the wall time from the spawn to the
exit, and the modules each run loaded (beyond the interpreter's own start, without site).

Alone: ``python -m devtools.bench.status_cli --reps 21``."""
from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from devtools.harness import REPO

TARGET = 3.0   # issue #51: a third of the previous tree's time, or faster

# the console script's own lines (agent.__main__:main), on a path set here, not by site
ENTRY = ("import sys\nsys.path[:0] = sys.argv[1:3]\ndel sys.argv[1:3]\n"
         "started = len(sys.modules)\n"
         "from agent.__main__ import main\n"
         "code = main()\n"
         "print('modules', len(sys.modules) - started, file=sys.stderr)\n"
         "sys.exit(code)\n")


@dataclass
class StatusRun:
    reps: int
    previous: str = ""          # "0.2.2 (d8059b4)"
    current_ms: list = field(default_factory=list)
    previous_ms: list = field(default_factory=list)
    current_modules: int | None = None
    previous_modules: int | None = None
    medians: dict = field(default_factory=dict)
    ratio: float | None = None  # previous / current: how many times faster
    errors: list = field(default_factory=list)


def previous_release(repo: Path = REPO) -> tuple[str, str]:
    """(the previous release's version, the commit that set it), from the changelog and
    git's history; RuntimeError saying why where the history cannot tell (a shallow
    clone)."""
    versions = re.findall(r"^edge-agent \(([^)-]+)-\d+\)", (repo / "debian" / "changelog")
                          .read_text(), re.M)
    if len(versions) < 2:
        raise RuntimeError("debian/changelog names no previous release")
    version = versions[1]
    out = subprocess.run(["git", "-C", str(repo), "log", "--format=%H", "--reverse",
                          "-S", f'__version__ = "{version}"', "--", "agent/__init__.py"],
                         capture_output=True, text=True, timeout=60)
    commits = out.stdout.split()
    if out.returncode != 0 or not commits:
        raise RuntimeError(f"no commit in git's history sets version {version} "
                           f"({out.stderr.strip()[-200:] or 'a shallow clone?'})")
    return version, commits[0]


def extract(commit: str, into: Path, repo: Path = REPO) -> Path:
    """The commit's agent/ package under ``into``, compiled."""
    blob = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit, "agent"],
                          capture_output=True, check=True, timeout=120).stdout
    safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}   # 3.11.4 and up
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(into, **safe)
    return into


def _compile(tree: Path) -> None:
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "agent")],
                   check=True, capture_output=True, timeout=300)


def _once(tree: Path, config: Path) -> tuple[float, int | None]:
    libs = sysconfig.get_paths()["purelib"]
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-I", "-S", "-c", ENTRY, str(tree), libs, "status",
                          "--config", str(config)], capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    wall = (time.perf_counter() - t0) * 1000
    if out.returncode not in (0, 1) or "crashed" in out.stderr:
        raise RuntimeError(f"{tree}: exit {out.returncode}: {out.stderr.strip()[-300:]}")
    m = re.search(r"^modules (\d+)$", out.stderr, re.M)
    return wall, int(m.group(1)) if m else None


def _status_file(runtime: Path) -> None:
    """A running agent's (this process stands for it), online and claimed."""
    from agent.base import status_file
    now = time.time()
    status_file.write(str(runtime / "status.json"), {
        "pid": os.getpid(), "version": "0.0.0", "device_id": "screen-1",
        "server": "http://fleet.example:8080", "updated_at": now, "claimed": True,
        "link": {"state": "online", "proven_live": True, "since_s": 60.0, "rtt_ms": 12.0,
                 "last_ack_age_s": 3.0, "losses_last_hour": []}})


def measure(reps: int, work: Path) -> StatusRun:
    work.mkdir(parents=True)
    s = StatusRun(reps)
    try:
        version, commit = previous_release()
        s.previous = f"{version} ({commit[:7]})"
        prev = extract(commit, work / "previous")
    except (RuntimeError, OSError, subprocess.SubprocessError, tarfile.TarError) as e:
        s.errors.append(f"previous tree: {e}")
        prev = None
    for tree in (REPO, prev):
        if tree is not None:
            _compile(tree)
    runtime = work / "run"
    runtime.mkdir()
    _status_file(runtime)
    config = work / "agent.toml"
    config.write_text(f'[server]\nurl = "http://fleet.example:8080"\n'
                      f'[runtime]\ndir = "{runtime}"\n')
    trees = [("current", REPO)] + ([("previous", prev)] if prev is not None else [])
    for i in range(reps + 1):
        for name, tree in (trees if i % 2 == 0 else trees[::-1]):
            try:
                ms, modules = _once(tree, config)
            except (RuntimeError, subprocess.SubprocessError) as e:
                s.errors.append(f"{name} #{i}: {e}")
                continue
            setattr(s, f"{name}_modules", modules)
            if i:
                getattr(s, f"{name}_ms").append(round(ms, 1))
    for name in ("current", "previous"):
        values = getattr(s, f"{name}_ms")
        s.medians[name] = round(statistics.median(values), 1) if values else None
    a, b = s.medians.get("previous"), s.medians.get("current")
    s.ratio = round(a / b, 2) if a and b else None
    return s


def section(s: StatusRun) -> list[str]:
    m = s.medians
    lines = ["## 9. `edge-agent status`, beside the previous release", "",
             f"Medians of {s.reps} fresh processes each, this tree and the previous release's",
             f"({s.previous or 'not available'}) alternating, after a warm-up of each: from the",
             "spawn to the exit, printing the same running agent's status file with the same",
             "configuration (`python3 -I -S`, as /usr/bin/edge-agent starts but without site;",
             "both trees byte-compiled). Modules: those the command loaded, beyond the",
             "interpreter's own start (without site: os and the like are the command's too).", "",
             "| tree | ms | modules |", "|---|---|---|",
             f"| this tree | {m.get('current')} | {s.current_modules} |",
             f"| previous release {s.previous} | {m.get('previous')} | {s.previous_modules} |"]
    r = s.ratio
    lines += ["", "Previous over this tree: " + (
        "-" if r is None else f"{r:.2f}x (target >= {TARGET:g}x, a third of the time: "
                              f"{'met' if r >= TARGET else 'NOT met'})") + "."]
    if s.errors:
        lines += ["", "Errors:", *[f"- {e}" for e in s.errors]]
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m devtools.bench.status_cli", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=21, help="counted runs of each (default 21)")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="edge-agent-status-"))
    try:
        s = measure(args.reps, work / "status")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n".join(section(s)))
    return 1 if s.ratio is None else 0


if __name__ == "__main__":
    raise SystemExit(main())
