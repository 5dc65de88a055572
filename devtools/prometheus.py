"""Debian's real node_exporter and Prometheus, run for a test: node_exporter's textfile
collector over a directory (as prometheus-node-exporter runs it, as its own user where
one is given), and a Prometheus that scrapes it every second and evaluates rules."""
from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

from devtools.harness import wait_for
from devtools.site import free_port

NODE_EXPORTER = "prometheus-node-exporter"
PROMETHEUS = "prometheus"


def _as(user: str | None):
    if user is None:
        return None
    entry = pwd.getpwnam(user)

    def drop():
        os.setgroups([])
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)
    return drop


class Process:
    def __init__(self, argv: list[str], log: Path, user: str | None = None):
        self.log = log
        self._out = open(log, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, preexec_fn=_as(user))

    def threads(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/task"))

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._out.close()


@contextlib.contextmanager
def node_exporter(textfile_dir: Path, log: Path, user: str | None = "prometheus"):
    """node_exporter with its textfile collector alone, over ``textfile_dir``; yields
    (process, port)."""
    if shutil.which(NODE_EXPORTER) is None:
        raise RuntimeError("prometheus-node-exporter is not installed (scripts/_env.sh TEST_DEBS)")
    port = free_port()
    p = Process([NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{port}",
                 "--collector.disable-defaults", "--collector.textfile",
                 f"--collector.textfile.directory={textfile_dir}"], log, user)
    try:
        wait_for(lambda: scrape(port, 2) is not None or p.proc.poll() is not None, 15,
                 interval=0.1, what="node_exporter to answer")
        assert p.proc.poll() is None, log.read_text()
        yield p, port
    finally:
        p.stop()


def scrape(port: int, timeout: float) -> str | None:
    """node_exporter's /metrics, or None where it does not answer within ``timeout``."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
            return r.read().decode()
    except OSError:
        return None


@contextlib.contextmanager
def prometheus(target_port: int, rules: Path, work: Path):
    """A Prometheus scraping 127.0.0.1:``target_port`` every second as instance
    "screen", evaluating ``rules`` every second; yields a function that answers the
    alerts firing now, {alertname: [labels, ...]}."""
    if shutil.which(PROMETHEUS) is None:
        raise RuntimeError("prometheus is not installed (scripts/_env.sh TEST_DEBS)")
    port = free_port()
    config = work / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{rules}']\n"
        "scrape_configs:\n"
        "  - job_name: screens\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{target_port}'], "
        "labels: {instance: screen}}]\n")
    p = Process([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={work / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}"], work / "prometheus.log", user=None)

    def firing() -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/alerts", timeout=5) as r:
            alerts = json.load(r)["data"]["alerts"]
        out: dict = {}
        for a in alerts:
            if a["state"] == "firing":
                out.setdefault(a["labels"]["alertname"], []).append(a["labels"])
        return out
    try:
        def ready():
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready",
                                              timeout=2).status == 200
            except OSError:
                return p.proc.poll() is not None
        wait_for(ready, 30, interval=0.2, what="Prometheus to be ready")
        assert p.proc.poll() is None, (work / "prometheus.log").read_text()[-3000:]
        yield firing
    finally:
        p.stop()


def wait_firing(firing, want: set, timeout: float = 30) -> dict:
    """Until exactly ``want`` (alert names) fire; what fires then."""
    seen: dict = {}

    def check():
        nonlocal seen
        seen = firing()
        return set(seen) == want
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return seen
        time.sleep(0.5)
    raise AssertionError(f"firing {sorted(seen)}, not {sorted(want)}")
