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


def _collected(*args) -> list[str]:
    # the assertions rewritten once, read back by the next collections (10 s each without)
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
           "AGENT_TEST_PYTHONS": f"latest={sys.executable} bookworm={sys.executable}"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
                        *args], capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return [line for line in r.stdout.splitlines() if "::" in line]


def test_the_streams_scripts_test_runs_side_by_side_run_every_test_once():
    """A test in no stream would never run on CI; one in two would race itself."""
    import re
    script = (REPO / "scripts" / "test").read_text()
    streams = re.findall(r"--stream ([\w:/]+)", script)
    streams += re.search(r"^streams=\(([^)]*)\)", script, re.M).group(1).split()
    assert sorted(streams) == ["stacks:1/3", "stacks:2/3", "stacks:3/3", "system", "units"]
    everything = _collected()
    ran = {stream: _collected("--stream", stream) for stream in streams}
    assert len(everything) > 1500
    assert sorted(test for tests in ran.values() for test in tests) == sorted(everything)
    parts = [ran[f"stacks:{k}/3"] for k in (1, 2, 3)]
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert all(re.search(r"[\[-](latest|bookworm)[\]-]", test) for part in parts for test in part)


def test_a_stream_that_does_not_exist_is_one_line_naming_it():
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "--stream", "stacks:4/3"],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 4 and "--stream 'stacks:4/3': expected one of system, stacks, units" \
        in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_failed_test_shows_the_tail_of_each_agent_and_server_log_it_left(tmp_path):
    """A test that fails once in a hundred CI runs must say what the processes did."""
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "test_probe.py").write_text(
        "def test_fails(tmp_path):\n"
        "    (tmp_path / 'screen-2').mkdir()\n"
        "    (tmp_path / 'screen-2' / 'agent.log').write_text(\n"
        "        ''.join(f'agent line {n}\\n' for n in range(100)))\n"
        "    (tmp_path / 'server.log').write_text('listening\\n')\n"
        "    assert False\n"
        "\n"
        "def test_passes(tmp_path):\n"
        "    (tmp_path / 'agent.log').write_text('quiet\\n')\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p",
                        "no:cacheprovider", "--basetemp", str(tmp_path / "base"), "-q",
                        str(probe)], capture_output=True, text=True, timeout=60, cwd=probe,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "1 failed, 1 passed" in r.stdout, r.stdout + r.stderr
    assert "screen-2/agent.log (its last 60 lines)" in r.stdout
    assert "agent line 99" in r.stdout and "agent line 40" in r.stdout
    assert "agent line 39" not in r.stdout
    assert "server.log (its last 1 lines)" in r.stdout and "listening" in r.stdout
    assert "quiet" not in r.stdout   # a test that passed shows nothing
