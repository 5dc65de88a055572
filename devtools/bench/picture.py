"""The picture check's cost (issue #39): a real Xvfb screen of a Pi's 1920x1080 showing a
detailed picture, checked N times back to back as the agent checks it (xwd, Pillow's
thumbnail, the judge), in this process.

- CPU per check: this process's (Pillow, the judge) and the capture tool's (its children's
  rusage), projected at the default rate ([screen] picture_every_s) as a share of one core and,
  given the idle agent's CPU (section 5's footprint, else IDLE_CPU_MS_A_MINUTE), as the
  agent's CPU with the check against without it (target 1.5x or less).
- RSS: what the first check leaves resident for good (Pillow's modules) and each later
  check's peak above it (VmHWM, reset through /proc/self/clear_refs; target +10 MB).
- Bytes written: this process's write_bytes across the checks (/proc/self/io), and the
  capture tool's temporary files left in TMPDIR (target 0).

Alone: ``python -m devtools.bench.picture --checks 20``; scripts/bench runs it after the
rest, alone on the machine, beside its footprint."""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass

from devtools.harness import wait_for

CPU_TARGET, RSS_TARGET_MB = 1.5, 10.0
IDLE_CPU_MS_A_MINUTE = 5.0      # the idle agent's, measured (README's footprint)
SCREEN = (1920, 1080)


@dataclass
class PictureCost:
    checks: int
    screen: str
    verdict: str
    agent_cpu_ms: float = 0.0       # per check, this process
    tool_cpu_ms: float = 0.0        # per check, the capture tool
    wall_ms: float = 0.0            # per check
    first_rss_mb: float = 0.0       # left resident by the first check (Pillow loaded)
    peak_rss_mb: float = 0.0        # a later check's peak above the resident
    write_bytes: int = 0
    temp_files: int = 0
    error: str = ""

    @property
    def cpu_ms(self) -> float:
        return self.agent_cpu_ms + self.tool_cpu_ms


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _write_bytes() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    return 0


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _xvfb(width: int, height: int):
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(["Xvfb", "-displayfd", str(write_end), "-screen", "0",
                             f"{width}x{height}x24", "-nolisten", "tcp", "-noreset"],
                            pass_fds=(write_end,), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        display = ":" + f.readline().strip().decode()
    wait_for(lambda: subprocess.run(["xset", "-display", display, "q"],
                                    capture_output=True).returncode == 0, 10,
             what="Xvfb answering")
    return proc, display


def _draw(display: str, work: str) -> None:
    """A 64x64 tile of a lit square and stripes: detail at every scale, not black."""
    size, rows = 64, []
    for y in range(size):
        bits = [1 if (x < 24 and y < 24) or (x + y) % 16 < 3 else 0 for x in range(size)]
        rows += [sum(bit << i for i, bit in enumerate(bits[b:b + 8])) for b in range(0, size, 8)]
    path = os.path.join(work, "tile.xbm")
    with open(path, "w") as f:
        f.write(f"#define tile_width {size}\n#define tile_height {size}\n"
                "static unsigned char tile_bits[] = {\n   "
                + ", ".join(f"0x{v:02x}" for v in rows) + " };\n")
    subprocess.run(["xsetroot", "-display", display, "-bitmap", path, "-fg", "#e0c040",
                    "-bg", "#102040"], check=True, timeout=10)


def measure(checks: int = 20, screen: tuple = SCREEN) -> PictureCost:
    from agent.config.model import Commands, Screen
    from agent.screen.watch import from_config

    missing = [t for t in ("Xvfb", "xset", "xsetroot", "xwd") if shutil.which(t) is None]
    if missing:
        raise RuntimeError(f"the picture bench needs {', '.join(missing)} "
                           "(xvfb, x11-xserver-utils, imagemagick)")
    work = tempfile.mkdtemp(prefix="edge-agent-picture-")
    proc, display = _xvfb(*screen)
    tmp = os.environ.get("TMPDIR", "/tmp")
    before_tmp = set(os.listdir(tmp))
    events = []
    try:
        _draw(display, work)
        commands = Commands(frozenset(), None, None, None, 10)
        watch = from_config(Screen(x_display=display), commands,
                            {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                            dark=lambda: None, publish=events.append)
        cost = PictureCost(checks, f"Xvfb {screen[0]}x{screen[1]}", "")
        rss0 = _status_kb("VmRSS")
        watch.check()                          # the first: Pillow imported, its arenas
        cost.first_rss_mb = round((_status_kb("VmRSS") - rss0) / 1024, 1)
        rss1 = _status_kb("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")                       # VmHWM back to VmRSS: the peak from here
        w0, c0, t0, wall0 = _write_bytes(), time.process_time(), _children_cpu(), \
            time.monotonic()
        for _ in range(checks):
            watch.check()
        wall1, t1, c1, w1 = time.monotonic(), _children_cpu(), time.process_time(), \
            _write_bytes()
        cost.peak_rss_mb = round((_status_kb("VmHWM") - rss1) / 1024, 1)
        cost.agent_cpu_ms = round((c1 - c0) / checks * 1000, 2)
        cost.tool_cpu_ms = round((t1 - t0) / checks * 1000, 2)
        cost.wall_ms = round((wall1 - wall0) / checks * 1000, 1)
        cost.write_bytes = w1 - w0
        cost.verdict = watch.snapshot()["verdict"] or "-"
        failure = watch.snapshot()["failure"] or watch.snapshot()["unavailable"]
        cost.error = failure or ""
        cost.temp_files = len(set(os.listdir(tmp)) - before_tmp - {os.path.basename(work)})
        return cost
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def section(cost: PictureCost, footprint=None) -> list[str]:
    """``footprint``: section 5's list of Footprint, for the idle agent's CPU."""
    from agent.config.model import Screen
    every_s = Screen().picture_every_s
    share = cost.cpu_ms / 1000 / every_s * 100
    lines = ["## Picture check's cost", "",
             f"{cost.checks} checks of a real {cost.screen} showing a detailed picture, back to "
             "back: xwd (x11-apps), every row of its dump folded as it streams, the judge, in "
             "one process. CPU: this process's (process_time) and the capture tool's "
             "(RUSAGE_CHILDREN); not the X server's. RSS: VmRSS/VmHWM of this process.", "",
             "| verdict | CPU ms/check (agent + tool) | wall ms/check "
             f"| at the default rate (every {every_s:g} s), of one core | RSS left by the first check MB | peak RSS above it during a check MB "
             "| bytes written | temp files |",
             "|---|---|---|---|---|---|---|---|",
             f"| {cost.verdict} | {cost.cpu_ms:.1f} ({cost.agent_cpu_ms:.1f} + "
             f"{cost.tool_cpu_ms:.1f}) | {cost.wall_ms} | {share:.3f} % | {cost.first_rss_mb} | "
             f"{cost.peak_rss_mb} | {cost.write_bytes} | {cost.temp_files} |", ""]
    idle = next((f for f in footprint or [] if getattr(f, "client", "") == "edge-agent"), None)
    per_min, source = IDLE_CPU_MS_A_MINUTE / 1000, "README's footprint"
    if idle is not None and idle.cpu_s:
        per_min, source = idle.cpu_s / idle.window_s * 60, "section 5"
    ratio = (per_min * every_s / 60 + cost.cpu_ms / 1000) / (per_min * every_s / 60)
    lines.append(f"Against the idle agent ({source}, {per_min * 1000:.1f} ms of CPU a "
                 f"minute): {ratio:.2f}x with the check every {every_s:g} s (target <= "
                 f"{CPU_TARGET:g}x: {'met' if ratio <= CPU_TARGET else 'NOT met'}).")
    lines.append(f"Peak RSS of a check: +{cost.peak_rss_mb} MB (target <= +{RSS_TARGET_MB:g} MB: "
                 f"{'met' if cost.peak_rss_mb <= RSS_TARGET_MB else 'NOT met'}); bytes written "
                 f"{cost.write_bytes}, temp files {cost.temp_files} (target 0: "
                 f"{'met' if cost.write_bytes == 0 and cost.temp_files == 0 else 'NOT met'})."
                 + (f" Capture failed: {cost.error}" if cost.error else ""))
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m devtools.bench.picture", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checks", type=int, default=20, help="checks measured (default 20)")
    p.add_argument("--screen", default="1920x1080", help="Xvfb's size (default 1920x1080)")
    args = p.parse_args(argv)
    width, height = (int(v) for v in args.screen.split("x"))
    print("\n".join(section(measure(args.checks, (width, height)))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
