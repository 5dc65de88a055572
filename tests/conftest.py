import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.harness import REPO, AgentProcess, FleetServerProcess, wait_for
from devtools.netns import NetNS


def _agent_pythons() -> list[tuple[str, str]]:
    """Interpreters to run the agent under: the test venv, plus bookworm's pinned stack.

    scripts/test sets AGENT_TEST_PYTHONS="latest=/path/python bookworm=/path/python".
    """
    spec = os.environ.get("AGENT_TEST_PYTHONS", "").split()
    pythons = [tuple(item.split("=", 1)) for item in spec if "=" in item]
    return pythons or [("current", sys.executable)]


def pytest_generate_tests(metafunc):
    if "agent_python" in metafunc.fixturenames:
        pythons = _agent_pythons()
        metafunc.parametrize("agent_python", [p for _, p in pythons],
                             ids=[name for name, _ in pythons])


@pytest.fixture
def netns():
    missing = [tool for tool in ("nft", "ip") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        # Not a skip: CI installs these and runs as root, so a missing one is a broken setup.
        pytest.fail(f"network-namespace tests need root and {', '.join(missing) or 'nothing'}")
    with NetNS() as ns:
        yield ns


@pytest.fixture
def fleet(netns, tmp_path):
    servers = []

    def start(*args, **kw):
        s = FleetServerProcess(tmp_path, *args, **kw).start()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


@pytest.fixture
def spawn_agent(tmp_path):
    agents = []

    def spawn(python, config, env=None):
        a = AgentProcess(python, config, tmp_path, env).start()
        agents.append(a)
        return a

    yield spawn
    for a in agents:
        a.stop()
        if os.environ.get("AGENT_TEST_SHOW_LOGS"):
            sys.stderr.write(a.log_text())


@pytest.fixture(scope="session")
def built_debs() -> tuple[Path, Path]:
    """The .deb as scripts/build-deb makes it, and a higher revision to upgrade to."""
    def build(*args):
        r = subprocess.run([str(REPO / "scripts" / "build-deb"), *args], capture_output=True,
                           text=True, timeout=600, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if r.returncode != 0:
            pytest.fail(f"scripts/build-deb {' '.join(args)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        return Path(r.stdout.strip().splitlines()[-1])
    return build(), build("--revision", "2")


# -- a real X server (working hours, the display's read-back) -----------------------
@contextlib.contextmanager
def _x_server(size: str, *extra: str):
    """Xvfb on a display number it picks free itself (-displayfd): (display, process)."""
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(["Xvfb", "-displayfd", str(write_end), "-screen", "0", size,
                             "-nolisten", "tcp", *extra], pass_fds=(write_end,),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as f:
            number = f.readline().strip().decode()
        assert number.isdigit(), "Xvfb said no display number"
        display = f":{number}"
        wait_for(lambda: subprocess.run(["xset", "-display", display, "q"],
                                        capture_output=True).returncode == 0, 10,
                 what="Xvfb answering")
        yield display, proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def xvfb():
    """A real X server and its process (working hours, the display's read-back)."""
    if shutil.which("Xvfb") is None or shutil.which("xset") is None:
        pytest.fail("a real X server's tests need Xvfb and xset (.ci/run installs xvfb and "
                    "x11-xserver-utils)")
    with _x_server("320x240x24") as server:
        yield server


@pytest.fixture
def xvfb_pictures():
    """Xvfb that keeps what is drawn on it (-noreset: a server resets, its root black
    again, when its last client leaves, as xsetroot does), 16:9, and its display. The
    picture check's tests draw with xsetroot and capture with xwd and ImageMagick's import."""
    missing = [tool for tool in ("Xvfb", "xset", "xsetroot", "xwd", "import")
               if not shutil.which(tool)]
    if missing:
        pytest.fail(f"the picture check's tests need {', '.join(missing)} (.ci/run installs "
                    "xvfb, x11-xserver-utils, x11-apps and imagemagick)")
    with _x_server("320x180x24", "-noreset") as (display, _):
        yield display
