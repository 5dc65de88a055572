"""The systemd unit: it verifies, and its hardening stays at or below the exposure target."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parent.parent / "systemd" / "edge-agent.service"
EXPOSURE_TARGET = 1.5  # the bound the booted-system test holds too


@pytest.fixture
def analyze():
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.fail("systemd-analyze missing: .ci/run installs systemd")
    return tool


def test_unit_verifies(analyze, tmp_path):
    # verify checks that ExecStart exists; before the .deb installs it, a stand-in does
    exe = tmp_path / "edge-agent"
    exe.write_text(f"#!{sys.executable}\nfrom agent.cli import main\nraise SystemExit(main())\n")
    exe.chmod(0o755)
    unit = tmp_path / "edge-agent.service"
    text = UNIT.read_text()
    assert "ExecStart=/usr/bin/edge-agent run" in text
    unit.write_text(text.replace("/usr/bin/edge-agent", str(exe)))
    r = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr


def test_security_exposure_is_at_most_the_target(analyze):
    r = subprocess.run([analyze, "security", "--offline=true", str(UNIT)],
                       capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for edge-agent.service: ([0-9.]+)", r.stdout)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) <= EXPOSURE_TARGET


def test_unit_says_what_the_agent_relies_on():
    text = UNIT.read_text()
    for directive in ["Type=notify", "NotifyAccess=main", "WatchdogSec=", "Restart=always",
                      "StartLimitIntervalSec=0", "StateDirectory=edge-agent",
                      "StateDirectoryMode=0700", "RuntimeDirectory=edge-agent",
                      "ConfigurationDirectory=edge-agent", "User=edge-agent",
                      "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
                      "SystemCallFilter=@system-service", "CapabilityBoundingSet=\n"]:
        assert directive in text, directive
    # StartLimitIntervalSec belongs to [Unit]; in [Service] systemd ignores it
    assert text.index("StartLimitIntervalSec=0") < text.index("[Service]")
