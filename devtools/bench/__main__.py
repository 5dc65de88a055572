"""scripts/bench entry point: runs the measurements and writes the report."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

from devtools.harness import REPO

from devtools.bench import cluster_rows as CR, faults as F, footprint as FP, hung_node as HN, idle_reap as IR, rolling_deploy as RD, netback as NB, outage_restarts as OR, silent_drop as SD, startup as SU, storm as ST, timeline
from devtools.bench.common import ACK_DEFAULT, HB_DEFAULT
from devtools.bench.uploads import upload_queue, uploads_section
from devtools.bench import picture as PB
from devtools.bench import status_cli as SC


def _med(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 2) if values else None


def _max(values):
    values = [v for v in values if v is not None]
    return max(values) if values else None


def _ratio(a, b):
    return f"{a / b:.1f}x" if a and b else "-"


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:
        return "?"


def silent_section(kinds) -> list[str]:
    ours = SD.summarize(kinds[0])
    lines = ["## 1. Silent drop: detection and recovery", "",
             "Time from an nftables DROP of the live connection (both directions, no FIN, no RST;",
             "new connections pass) to the first heartbeat the server receives on a new",
             "connection. The drop lands at a random phase of the 15 s heartbeat cycle.", "",
             "| client | trials | median s | max s | x slower than edge-agent (median) | sockets held at once |",
             "|---|---|---|---|---|---|"]
    for k in kinds:
        s = SD.summarize(k)
        lines.append(f"| {k.label} | {s['ok']}/{len(k.trials)} | {s['median']} | {s['max']} | "
                     f"{_ratio(s['median'], ours['median'])} | {s['sockets_max']} |")
    target = HB_DEFAULT + ACK_DEFAULT + 2.0
    lines += ["", f"Target for edge-agent with its defaults: at most {target:g} s "
              f"(heartbeat + ACK timeout + 2 s): max measured {ours['max']} s.", "",
              "<details><summary>per trial</summary>", "",
              "| client | phase s | recovery s | error |", "|---|---|---|---|"]
    for k in kinds:
        lines += [f"| {k.name} | {t.phase_s} | {t.recovery_s} | {t.error} |" for t in k.trials]
    return lines + ["", "</details>"]


def fault_section(runs) -> list[str]:
    lines = ["## 2. Fault matrix", "",
             "Server pings at 25 s/20 s; both clients heartbeat every 15 s. Recovery: from the",
             "end of the fault (for the reaping proxy: the reap) to the first heartbeat at the",
             "server. Noticed: from the start of the fault to the client's own \"link lost\".",
             "Heartbeats lost: seqs the server never received. Events lost: device events raised",
             "1 s into the fault that never reached the server (edge-agent holds them until",
             "ACKed; the stock client emits and forgets).", "",
             "| fault | client | trials | recovery median s | max s | stock / edge-agent | noticed median s | heartbeats lost | events lost | sockets held at once | other |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for fault, text in F.FAULTS.items():
        med = {}
        for client in F.CLIENTS:
            rs = [r for r in runs if r.fault == fault and r.client == client]
            med[client] = _med(r.recovery_s for r in rs)
        for client in F.CLIENTS:
            rs = [r for r in runs if r.fault == fault and r.client == client]
            if not rs:
                continue
            ok = sum(1 for r in rs if not r.error)
            other = ""
            if fault == "rst-storm":
                other = f"connect attempts in 20 s: {_max(r.connect_attempts for r in rs)}"
            if fault == "slow-acks":
                other = f"reconnects: {sum(r.reconnects for r in rs)}"
            ratio = _ratio(med["stock"], med["edge-agent"]) if client == "stock" else ""
            lines.append(f"| {fault} | {client} | {ok}/{len(rs)} | {med[client]} | "
                         f"{_max(r.recovery_s for r in rs)} | {ratio} | "
                         f"{_med(r.noticed_s for r in rs)} | {sum(r.heartbeats_lost for r in rs)} | "
                         f"{sum(r.events_lost for r in rs)}/{sum(r.events_raised for r in rs)} | "
                         f"{max(r.sockets_max for r in rs)} | {other} |")
    lines += ["", "Faults: " + "; ".join(f"**{k}**: {v}" for k, v in F.FAULTS.items()) + "."]
    errors = [f"- {r.fault} {r.client} #{r.trial}: {r.error}" for r in runs if r.error]
    return lines + (["", "Errors:", *errors] if errors else [])


def netback_section(runs, outage_s) -> list[str]:
    wake = _med(r.back_s for r in runs if r.mode == "wake")
    lines = ["## 3. Network back", "",
             f"The path to the server dropped for {outage_s:g} s (the agent backs off, 1 s doubling",
             "to 60 s, full jitter), then restored together with a carrier-up on a veth link, as",
             "a cable or Wi-Fi association gives. Time from the restore to the first heartbeat.", "",
             "| mode | trials | median s | max s | x slower than with the wake-up |", "|---|---|---|---|---|"]
    for mode in ("wake", "no-wake"):
        rs = [r for r in runs if r.mode == mode]
        med = _med(r.back_s for r in rs)
        lines.append(f"| {'udev/rtnetlink wake-up' if mode == 'wake' else 'backoff only'} | "
                     f"{sum(1 for r in rs if r.back_s is not None)}/{len(rs)} | {med} | "
                     f"{_max(r.back_s for r in rs)} | {_ratio(med, wake) if mode != 'wake' else ''} |")
    return lines


def storm_section(storms) -> list[str]:
    lines = ["## 4. Fleet reconnect storm", "",
             "N agents (the real link code, 50 per process) behind one loopback address; the",
             "server is SIGKILLed, stays down, and restarts. Times are from the restart.", "",
             "| reconnect policy | agents | downtime s | peak new connections/s | 99 % back s | 100 % back s | back | refused | quarantined |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in storms:
        lines.append(f"| {ST.LABELS[s.mode]} | {s.agents} | {s.downtime_s:g} | {s.peak_per_s} | {s.to_99_s} | "
                     f"{s.to_100_s} | {s.back}/{s.agents} | {s.refused} | {s.quarantined} |")
    by_mode = {s.mode: s for s in storms}
    ours, base = by_mode.get("edge-agent"), by_mode.get("fixed-30s")
    window = by_mode.get("edge-agent-window")
    if ours and base:
        lines += ["", f"Peak connection rate, fixed 30 s over edge-agent: "
                  f"{_ratio(base.peak_per_s, ours.peak_per_s)}."]
    if ours and window:
        lines += ["", f"Peak connection rate, edge-agent over edge-agent with the server's "
                  f"window: {_ratio(ours.peak_per_s, window.peak_per_s)}."]
    for s in storms:
        if s.error:
            lines.append(f"\nError ({s.mode}): {s.error}")
        lines.append(f"\nConnections per second after the restart ({s.mode}): "
                     f"{' '.join(str(n) for n in s.per_second[:90])}")
    return lines


# every job --only can name; the full run's own (FULL_ONLY) are not in --quick
JOBS = ("silent", "faults", "netback", "storm", "footprint", "uploads", "idle_reap", "startup",
        "status", "outage", "picture", "hung", "deploy", "cluster")
FULL_ONLY = ("hung", "deploy", "cluster")


def chosen_jobs(only: str | None, quick: bool) -> tuple[str, ...]:
    """The jobs a run makes: ``only`` (a comma list of JOBS, any of them even with
    --quick) or every job of the run. ValueError names an unknown one."""
    if only is None:
        return tuple(j for j in JOBS if not (quick and j in FULL_ONLY))
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in JOBS]
    if unknown or not names:
        raise ValueError(f"--only: unknown job {unknown[0]!r} (jobs: {', '.join(JOBS)})"
                         if unknown else f"--only: no job named (jobs: {', '.join(JOBS)})")
    return tuple(j for j in JOBS if j in names)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="reduced matrix for CI (under 3 min)")
    p.add_argument("--only", metavar="NAMES",
                   help=f"a comma list of jobs to run alone ({', '.join(JOBS)})")
    p.add_argument("--trials", type=int, default=None, help="silent-drop trials per client")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    p.add_argument("--seed", type=int, default=int(time.time()))
    args = p.parse_args(argv)
    try:
        chosen = chosen_jobs(args.only, args.quick)
    except ValueError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("bench: needs root (private network namespaces and nftables)", file=sys.stderr)
        return 1
    quick = args.quick
    trials = args.trials or (3 if quick else 10)
    fault_trials, nb_trials = (1, 1) if quick else (3, 3)
    outage_s = 20.0 if quick else 45.0
    fp_window, fp_warmup = (60.0, 10.0) if quick else (600.0, 20.0)
    storm_n, downtime = (100, 5.0) if quick else (500, 10.0)
    t0 = time.monotonic()
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"edge-agent-bench-{os.getpid()}"
    res: dict = {}

    def job(name, fn, *a):
        if name.split("-", 1)[0] not in chosen:
            return
        try:
            res[name] = fn(*a)
        except Exception as e:  # one broken measurement must not hide the others
            res[name] = e

    # phase 1: everything that mostly waits on the clock, side by side
    jobs = [("silent", SD.silent_drop, trials, quick, work, args.seed),
            ("faults", F.matrix, fault_trials, work, args.seed),
            ("netback", NB.compare, nb_trials, outage_s, work),
            ("footprint", FP.measure, fp_window, work / "footprint", fp_warmup),
            ("idle_reap", IR.compare, 150.0 if quick else 600.0, work),
            # the full run's: about 20 s a trial and 40 s for the frozen server; 80 clients
            # on a cluster, kill, freeze and deploy one after the other (about 3 min)
            ("hung", HN.compare, 3, work / "hung"),
            ("deploy", RD.compare, work / "deploy"),
            ("cluster", CR.compare, work / "cluster")]
    threads = [threading.Thread(target=job, args=j) for j in jobs if j[0] in chosen]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # phase 2: the storm wants the CPU to itself; quick runs both policies at once
    modes = list(ST.MODES)
    if quick:
        st = [threading.Thread(target=job, args=(f"storm-{m}", ST.run, m, storm_n, downtime,
                                                 work / f"storm-{m}")) for m in modes]
        for t in st:
            t.start()
        for t in st:
            t.join()
    else:
        for m in modes:
            job(f"storm-{m}", ST.run, m, storm_n, downtime, work / f"storm-{m}")
    job("uploads", upload_queue, 200 if quick else 1000, work)
    # fresh processes timed to the millisecond: alone on the machine, after the rest
    job("startup", SU.measure, 3 if quick else 10, work / "startup")
    job("status", SC.measure, 11 if quick else 31, work / "status")   # about 0.3 s a pair
    job("picture", PB.measure, 20)   # CPU per check: alone too, beside section 5's idle
    job("outage", OR.compare)   # a fake clock: microseconds, in every run
    elapsed = time.monotonic() - t0

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = (f"{time.strftime('%Y%m%d-%H%M%S')}{'-quick' if quick else ''}"
            f"{'-' + '-'.join(chosen) if args.only else ''}")
    lines = [f"# edge-agent benchmark{' (quick)' if quick else ''}", "",
             f"Run {time.strftime('%Y-%m-%d %H:%M:%S %Z')} in {elapsed:.0f} s on "
             f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
             f"python-socketio {_version('python-socketio')}, python-engineio "
             f"{_version('python-engineio')}; `scripts/bench{' --quick' if quick else ''}"
             f"{' --only ' + ','.join(chosen) if args.only else ''}`.", ""]
    sections = [("silent", silent_section), ("faults", fault_section),
                ("netback", lambda r: netback_section(r, outage_s)),
                ("storm", None), ("footprint", FP.section), ("uploads", uploads_section),
                ("idle_reap", IR.section), ("startup", SU.section), ("status", SC.section),
                ("outage", OR.section),
                ("picture", lambda r: PB.section(r, res.get("footprint")
                                                 if isinstance(res.get("footprint"), list)
                                                 else None)),
                ("hung", HN.section), ("deploy", RD.section), ("cluster", CR.section)]
    for key, fn in sections:
        if key not in chosen:
            continue
        if key == "storm":
            storms = [res.get(f"storm-{m}") for m in modes]
            bad = [s for s in storms if isinstance(s, Exception) or s is None]
            lines += (storm_section(storms) if not bad else ["## 4. Fleet reconnect storm", "",
                                                              f"failed: {bad}"]) + [""]
            continue
        value = res.get(key)
        if isinstance(value, Exception) or value is None:
            lines += [f"## {key}", "", f"failed: {value!r}", ""]
            continue
        lines += fn(value) + [""]
    png = None
    if ("silent" in chosen and "faults" in chosen and not isinstance(res.get("silent"), Exception)
            and not isinstance(res.get("faults"), Exception)):
        png = timeline.draw(res.get("silent") or [], res.get("faults") or [], out / f"{name}.png")
    if png:
        lines += ["## Timeline", "", f"![fault timeline]({png.name})", ""]
    text = "\n".join(lines) + "\n"
    (out / f"{name}.md").write_text(text)

    def plain(v):
        if isinstance(v, Exception):
            return repr(v)
        if isinstance(v, list):
            return [plain(x) for x in v]
        if dataclasses.is_dataclass(v):
            return {k: plain(x) for k, x in vars(v).items()}
        return v
    (out / f"{name}.json").write_text(json.dumps({k: plain(v) for k, v in res.items()},
                                                 indent=1, default=str))
    print(text)
    print(f"report: {out / name}.md")
    if "silent" not in chosen:
        return 0
    silent = res.get("silent")
    if isinstance(silent, Exception) or not silent:
        print(f"bench: FAIL: the silent-drop measurement broke: {silent!r}", file=sys.stderr)
        return 1
    ours, stock = SD.summarize(silent[0]), SD.summarize(silent[1])
    if ours["failed"] or ours["median"] is None:
        print("bench: FAIL: edge-agent did not recover in every trial", file=sys.stderr)
        return 1
    if stock["median"] is not None and ours["median"] >= stock["median"]:
        print("bench: FAIL: edge-agent is not faster than the stock client on a silent drop",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
