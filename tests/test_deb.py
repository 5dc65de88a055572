"""The .deb, as built: lint-clean. Installing, running, upgrading and purging it are
proven on a booted Debian with systemd as PID 1 (tests/test_booted_systemd.py)."""
import re
import subprocess


def test_deb_lints_clean(built_debs):
    assert [d.name for d in built_debs] == ["edge-agent_0.1.0-1_all.deb", "edge-agent_0.1.0-2_all.deb"]
    for deb in built_debs:
        r = subprocess.run(["lintian", "--fail-on", "error,warning", str(deb)],
                           capture_output=True, text=True, timeout=600)
        problems = [line for line in r.stdout.splitlines() if re.match(r"^[EW]: ", line)]
        assert r.returncode == 0 and not problems, r.stdout + r.stderr
