"""The bench's cluster rows (devtools/bench/cluster_rows.py, issue #54) and its --only:
the section prints each fault's row for both clients from a synthetic result, and
--only runs the named jobs alone, refusing an unknown one in one line. Fast: no cluster
is started here."""
from __future__ import annotations

import subprocess
import sys

import pytest

from devtools.bench import __main__ as bench, cluster_rows as CR
from devtools.harness import REPO


def _rows() -> CR.Rows:
    kill = CR.Outage("kill", back_s={"edge-agent": {"edge-0000": 0.2, "edge-0002": 0.4},
                                     "stock": {"stock-0001": 1.1, "stock-0003": None}},
                     raised={"edge-agent": 2, "stock": 2}, stored={"edge-agent": 2, "stock": 0})
    freeze = CR.Outage("freeze", back_s={"edge-agent": {"edge-0001": 2.5},
                                         "stock": {"stock-0000": 41.3}},
                       raised={"edge-agent": 1, "stock": 1}, stored={"edge-agent": 1, "stock": 0},
                       error="redis-server went away")
    deploy = CR.Deploy(losses={"edge-agent": 0, "stock": 40},
                       widest_gap_s={"edge-agent": {"edge-0000": 2.01, "edge-0001": None},
                                     "stock": {"stock-0000": 3.4, "stock-0001": 5.9}},
                       raised={"edge-agent": 60, "stock": 60}, stored={"edge-agent": 60, "stock": 41},
                       twice={"edge-agent": 0, "stock": 0},
                       two_sessions={"edge-agent": [], "stock": ["stock-0007"]},
                       split={"edge-agent": (21, 19), "stock": (40, 0)}, stopped_s=[6.1, 6.3])
    return CR.Rows(kill, freeze, deploy, seconds=201.5)


def test_the_cluster_section_prints_each_fault_for_both_clients():
    text = "\n".join(CR.section(_rows()))
    assert "| node A SIGKILLed | edge-agent | 2/2 | 0.3 | 0.4 | 0/2 |" in text
    # a screen not back is counted out of the times, not as a time
    assert "| node A SIGKILLed | stock python-socketio client | 1/2 | 1.1 | 1.1 | 2/2 |" in text
    assert "| node A frozen (SIGSTOP) | stock python-socketio client | 1/1 | 41.3 | 41.3 | 1/1 |" in text
    assert "| edge-agent | 0 | 2.01 | 0/60 | 0 | 0 | 21/19 |" in text
    assert "| stock python-socketio client | 40 | 5.9 | 19/60 | 0 | 1 | 40/0 |" in text
    assert "The three rows took 201.5 s; nodes stopped [6.1, 6.3] s" in text
    assert "- freeze: redis-server went away" in text


def test_a_row_that_broke_before_its_fault_prints_its_error_and_no_numbers():
    rows = _rows()
    rows.kill = CR.Outage("kill", error="timed out after 90s waiting for 80 screens online")
    text = "\n".join(CR.section(rows))
    assert "| node A SIGKILLed |" not in text
    assert "- kill: timed out after 90s waiting for 80 screens online" in text


def test_device_ids_tell_the_kind():
    assert CR.kind_of("edge-0012") == "edge-agent"
    assert CR.kind_of("stock-0012") == "stock"
    assert CR.kind_of("screen-1") is None


def test_only_chooses_the_named_jobs_and_the_full_run_keeps_its_own_out_of_quick():
    assert bench.chosen_jobs("cluster", quick=False) == ("cluster",)
    assert bench.chosen_jobs(" deploy,hung ", quick=True) == ("hung", "deploy")
    assert "cluster" in bench.chosen_jobs(None, quick=False)
    assert not {"hung", "deploy", "cluster"} & set(bench.chosen_jobs(None, quick=True))
    with pytest.raises(ValueError, match="unknown job 'clustr'"):
        bench.chosen_jobs("cluster,clustr", quick=False)
    with pytest.raises(ValueError, match="no job named"):
        bench.chosen_jobs(",", quick=False)


def test_only_refuses_an_unknown_name_in_one_line_before_anything_runs():
    r = subprocess.run([sys.executable, "-m", "devtools.bench", "--only", "cluster,nope"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("bench: --only: unknown job 'nope'"), r.stderr
    assert "Traceback" not in r.stderr
