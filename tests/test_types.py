"""The link's and the commands' types, checked (#51): Debian's mypy (python3-mypy, in
TEST_DEBS) on the system python3, as a maintainer on the target would run it, with the
repository's mypy.ini. No editor or checker could follow a call through the link's
mixins; what they are made of now is checked on every run."""
from __future__ import annotations

import subprocess

from devtools.harness import REPO

SYSTEM_PYTHON = "/usr/bin/python3"   # Debian's: python3-mypy installs for it alone
CHECKED = ("agent/link", "agent/commands")


def test_mypy_passes_on_the_link_and_the_commands(tmp_path):
    # its cache outside the tree: a run leaves nothing in the repository
    r = subprocess.run([SYSTEM_PYTHON, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"),
                        *CHECKED], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    out = (r.stdout + r.stderr).strip()
    assert "No module named mypy" not in out, \
        "python3-mypy is not installed (scripts/_env.sh's TEST_DEBS installs it)"
    assert (REPO / "mypy.ini").is_file()
    lines = out.splitlines()
    assert r.returncode == 0, (f"mypy {' '.join(CHECKED)}: {lines[-1] if lines else r.returncode}"
                               "\n" + "\n".join(lines[:60]))
    assert "Success" in out, out
