"""The alert rules docs/operate.md gives (docs/edge-agent-alerts.yml): Prometheus' own
check of their syntax, promtool's unit tests proving each fires and does not fire
(tests/data/edge-agent-alerts.test.yml), and the rules evaluated by a real Prometheus
over the agent's textfile as a real node_exporter serves it: the series and labels the
rules name are the ones the agent writes, and a stopped agent is the absence alert."""
from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from agent.link.journal import ConnectionJournal
from agent.metrics import service
from devtools.harness import REPO
from devtools.prometheus import node_exporter, prometheus, wait_firing

RULES = REPO / "docs" / "edge-agent-alerts.yml"
ALERTS = {"EdgeAgentAbsent", "EdgeAgentNotProvenLive", "EdgeAgentPictureNotOk",
          "EdgeAgentRecoveryExhausted", "EdgeAgentVersionBehind", "EdgeAgentAptStale"}


def test_the_rules_are_prometheus_rules_and_each_fires_and_does_not_fire():
    check = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0 and f"SUCCESS: {len(ALERTS)} rules found" in check.stdout, \
        check.stdout + check.stderr
    names = set(re.findall(r"^\s+- alert: (\w+)$", RULES.read_text(), re.M))
    assert names == ALERTS
    fixtures = REPO / "tests" / "data" / "edge-agent-alerts.test.yml"
    tested = set(re.findall(r"alertname: (\w+)", fixtures.read_text()))
    assert tested == ALERTS, "every alert proven"
    unit = subprocess.run(["promtool", "test", "rules", str(fixtures)], capture_output=True,
                          text=True, timeout=120)
    assert unit.returncode == 0 and "SUCCESS" in unit.stdout, unit.stdout + unit.stderr


BAD = {"version": "0.3.0", "link": {"state": "waiting", "proven_live": False},
       "screen": {"picture": {"verdict": "frozen"},
                  "recovery": {"enabled": True, "state": "exhausted",
                               "taken": {"restart-player": 1}}},
       "update": {"installed": "0.3.0-1", "repository": {
           "newest": "0.3.1-1", "behind": True, "apt_success_at": time.time() - 4 * 86400}}}
GOOD = {"version": "0.3.1", "link": {"state": "online", "proven_live": True},
        "screen": {"picture": {"verdict": "ok"},
                   "recovery": {"enabled": True, "state": "watching"}},
        "update": {"installed": "0.3.1-1", "repository": {
            "newest": "0.3.1-1", "behind": False, "apt_success_at": time.time() - 3600}}}


@contextlib.contextmanager
def readable_dir():
    """A directory node_exporter's own user can read (a test's tmp_path is root's 0700)."""
    with tempfile.TemporaryDirectory(prefix="textfile-") as d:
        os.chmod(d, 0o755)
        yield Path(d)


def test_a_real_prometheus_fires_the_rules_on_what_a_real_node_exporter_serves(tmp_path):
    rules = tmp_path / "rules.yml"
    # the same rules, without their waits: what is proven here is the series they name
    rules.write_text(re.sub(r"for: \S+", "for: 0s", RULES.read_text()))
    now = [0.0]
    with readable_dir() as textfiles:
        metrics = service.Metrics(str(textfiles / "edge-agent.prom"), 1.0,
                                  journal=ConnectionJournal, counts=lambda: ({}, 0),
                                  render=service.renderer(), clock=lambda: now[0])
        with node_exporter(textfiles, tmp_path / "node_exporter.log") as (_, port), \
                prometheus(port, rules, tmp_path) as firing:
            metrics.document(BAD)
            fired = wait_firing(firing, ALERTS - {"EdgeAgentAbsent"})
            assert fired["EdgeAgentPictureNotOk"][0]["verdict"] == "frozen"
            now[0] += 1
            metrics.document(GOOD)
            wait_firing(firing, set())
            metrics.stop()   # the agent stopped: its series end, node_exporter stays
            wait_firing(firing, {"EdgeAgentAbsent"})
