"""The bench's status row (devtools/bench/status_cli.py): it finds the previous release's
tree in git's history, runs `status` as the package's entry point does, and prints the
ratio with its target from issue #51. The one process run here is a single status."""
from __future__ import annotations

import subprocess

from devtools.bench import status_cli as SC
from devtools.harness import REPO


def test_the_previous_release_is_the_commit_that_set_its_version():
    version, commit = SC.previous_release()
    changelog = (REPO / "debian" / "changelog").read_text()
    assert f"edge-agent ({version}-" in changelog.split("\n -- ", 1)[1]   # the second entry
    shown = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:agent/__init__.py"],
                           capture_output=True, text=True, check=True).stdout
    assert f'__version__ = "{version}"' in shown
    before = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}^:agent/__init__.py"],
                            capture_output=True, text=True, check=True).stdout
    assert f'__version__ = "{version}"' not in before


def test_one_status_run_of_this_tree_as_the_bench_runs_it(tmp_path):
    runtime = tmp_path / "run"
    runtime.mkdir()
    SC._status_file(runtime)
    config = tmp_path / "agent.toml"
    config.write_text(f'[server]\nurl = "http://fleet.example:8080"\n[runtime]\ndir = "{runtime}"\n')
    ms, modules = SC._once(REPO, config)
    assert ms > 0 and modules and modules < 150


def test_the_status_row_prints_the_ratio_against_its_target():
    s = SC.StatusRun(11, "0.2.2 (d8059b4)", medians={"current": 70.0, "previous": 231.0},
                     current_modules=80, previous_modules=352, ratio=3.3)
    text = "\n".join(SC.section(s))
    assert "| this tree | 70.0 | 80 |" in text
    assert "| previous release 0.2.2 (d8059b4) | 231.0 | 352 |" in text
    assert "3.30x (target >= 3x, a third of the time: met)" in text
    s.ratio = 2.4
    assert "NOT met" in "\n".join(SC.section(s))
    s = SC.StatusRun(11, errors=["previous tree: a shallow clone?"], medians={}, ratio=None)
    text = "\n".join(SC.section(s))
    assert "Previous over this tree: -." in text and "- previous tree: a shallow clone?" in text
