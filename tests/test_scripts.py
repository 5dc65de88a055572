"""The scripts a new user runs first say what to do when something is missing."""
import os
import shutil
import subprocess
import sys

from devtools.harness import REPO


def _fresh_clone(tmp_path):
    """The script as it lies in a clone where neither scripts/demo nor scripts/test ran."""
    clone = tmp_path / "clone"
    (clone / "scripts").mkdir(parents=True)
    shutil.copy2(REPO / "scripts" / "fleet-server", clone / "scripts" / "fleet-server")
    shutil.copytree(REPO / "fleet_server", clone / "fleet_server")
    return clone / "scripts" / "fleet-server"


def _run(script, env):
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGE_AGENT_")} | env
    return subprocess.run([str(script), "list"], capture_output=True, text=True, timeout=60, env=env)


def test_fleet_server_on_a_fresh_clone_names_the_command_that_sets_it_up(tmp_path):
    r = _run(_fresh_clone(tmp_path), {})
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert "run scripts/demo or scripts/test" in r.stderr


def test_fleet_server_with_a_python_that_lacks_its_libraries_says_so(tmp_path):
    bare = tmp_path / "bare-python"   # an interpreter without site-packages
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    bare.chmod(0o755)
    r = _run(_fresh_clone(tmp_path), {"EDGE_AGENT_PYTHON": str(bare)})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "lacks aiohttp or python-socketio" in r.stderr
    r = _run(_fresh_clone(tmp_path / "b"), {"EDGE_AGENT_PYTHON": str(tmp_path / "nope")})
    assert r.returncode == 2 and "is not an executable interpreter" in r.stderr


def test_fleet_server_runs_with_the_dev_environment(tmp_path):
    r = subprocess.run([str(REPO / "scripts" / "fleet-server"), "--help"], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "EDGE_AGENT_PYTHON": sys.executable})
    assert r.returncode == 0, r.stderr
