"""The .deb, built and installed for real on this Debian 12 machine.

It must lint clean, pull bookworm's python3-* packages, run on Debian's own
/usr/bin/python3 against the reference server until heartbeats are ACKed, upgrade
with state and config kept, and purge its state.
"""
import os
import re
import subprocess
from pathlib import Path

import pytest

from devtools.harness import REPO, AgentProcess, agent_config

pytestmark = pytest.mark.netns

APT = ["apt-get", "-y", "-q", "-o", "Dpkg::Options::=--force-confold"]
ENV = {**os.environ, "DEBIAN_FRONTEND": "noninteractive",
       "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def sh(*cmd, check=True, **kw):
    r = subprocess.run(list(cmd), capture_output=True, text=True, env=ENV, timeout=600, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def build(revision=None) -> Path:
    args = [str(REPO / "scripts" / "build-deb")] + (["--revision", revision] if revision else [])
    out = sh(*args).stdout.strip().splitlines()[-1]
    return Path(out)


def installed_version(pkg):
    r = sh("dpkg-query", "-W", "-f=${Version}", pkg, check=False)
    return r.stdout if r.returncode == 0 else None


@pytest.fixture(scope="module")
def debs():
    if os.geteuid() != 0:
        pytest.fail("the .deb test installs packages: run as root (CI does)")
    first = build()
    second = build("2")
    yield first, second
    sh(*APT, "purge", "edge-agent", check=False)


def test_deb_lints_clean(debs):
    assert [d.name for d in debs] == ["edge-agent_0.1.0-1_all.deb", "edge-agent_0.1.0-2_all.deb"]
    for deb in debs:
        r = sh("lintian", "--fail-on", "error,warning", str(deb), check=False)
        problems = [l for l in r.stdout.splitlines() if re.match(r"^[EW]: ", l)]
        assert r.returncode == 0 and not problems, r.stdout


def test_install_run_on_debian_python_upgrade_and_purge(debs, netns, fleet, tmp_path):
    first, second = debs
    with netns.outside():  # apt reaches its mirror from the real network only
        sh(*APT, "install", str(first))
    assert installed_version("edge-agent") == "0.1.0-1"
    # bookworm's packaged stack, not a venv
    assert installed_version("python3-socketio").startswith("5.7.2")
    assert installed_version("python3-engineio").startswith("4.3.4")
    assert Path("/usr/bin/edge-agent").read_text().startswith("#! /usr/bin/python3") or \
        Path("/usr/bin/edge-agent").read_text().startswith("#!/usr/bin/python3")
    assert sh("/usr/bin/edge-agent", "--version").stdout.strip() == "edge-agent 0.1.0"
    help_text = sh("/usr/bin/edge-agent", "--help").stdout
    assert all(c in help_text for c in ("run", "status", "check-config"))
    assert sh("getent", "passwd", "edge-agent").returncode == 0
    assert oct(os.stat("/etc/edge-agent/agent.toml").st_mode & 0o777) == "0o640"
    sh("systemd-analyze", "verify", "/lib/systemd/system/edge-agent.service")

    # the installed agent, on /usr/bin/python3, against the reference server
    server = fleet()
    cfg = agent_config(server, tmp_path)
    agent = AgentProcess("/usr/bin/python3", cfg, tmp_path, command=["/usr/bin/edge-agent"]).start()
    try:
        agent.wait_live(20, connection=1)
        assert server.device()["heartbeats"] >= 1
    finally:
        assert agent.stop() == 0

    # upgrade: state and edited config survive
    state = Path("/var/lib/edge-agent")
    state.mkdir(exist_ok=True)
    (state / "marker").write_text("kept")
    conf = Path("/etc/edge-agent/agent.toml")
    conf.write_text(conf.read_text() + "\n# edited by the operator\n")
    sh(*APT, "install", str(second))
    assert installed_version("edge-agent") == "0.1.0-2"
    assert (state / "marker").read_text() == "kept"
    assert "# edited by the operator" in conf.read_text()

    sh(*APT, "remove", "edge-agent")
    assert (state / "marker").exists(), "remove must keep the state"
    sh(*APT, "purge", "edge-agent")
    assert not state.exists(), "purge removes the state"
    assert not conf.exists()
    # Debian policy: the system user is left in place
    assert sh("getent", "passwd", "edge-agent", check=False).returncode == 0
