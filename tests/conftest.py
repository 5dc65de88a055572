import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
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


# scripts/test's streams, run side by side: each test is in exactly one
# (tests/test_scripts.py); "stacks" is dealt into parts, "stacks:2/3"
STREAMS = ("system", "stacks", "units")


def pytest_addoption(parser):
    parser.addoption("--stream", metavar="NAME[:K/N]", default=None,
                     help="run one of scripts/test's streams: system (the booted tier), "
                          "stacks (the tests run on each agent stack), units (the rest); "
                          "NAME:K/N runs the K-th of N parts, dealt in turn")


def _stream(spec: str) -> tuple[str, int, int]:
    name, _, part = spec.partition(":")
    k, _, n = (part or "1/1").partition("/")
    if name not in STREAMS or not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise pytest.UsageError(f"--stream {spec!r}: expected one of {', '.join(STREAMS)}, "
                                "optionally with :K/N (1 <= K <= N), e.g. stacks:2/3")
    return name, int(k), int(n)


def _stream_of(item) -> str:
    if item.get_closest_marker("system") is not None:
        return "system"
    return "stacks" if "agent_python" in getattr(item, "fixturenames", ()) else "units"


def pytest_configure(config):
    if config.getoption("--stream") is not None:
        _stream(config.getoption("--stream"))   # a wrong name fails before the collection


@pytest.hookimpl(trylast=True)   # after -k and -m have deselected theirs
def pytest_collection_modifyitems(config, items):
    spec = config.getoption("--stream")
    if spec is None:
        return
    name, k, n = _stream(spec)
    ours = [item for item in items if _stream_of(item) == name]
    # dealt in turn, not cut in blocks: a file's slow tests (a stack's pair, a server's
    # generations) sit side by side in collection order and go to different parts
    kept = set(ours[k - 1::n])
    config.hook.pytest_deselected(items=[item for item in items if item not in kept])
    items[:] = [item for item in items if item in kept]


# The processes' own words beside a failure: a timing test that fails once in a hundred
# CI runs (side by side with four other streams on 2 cores) says only what it waited
# for; the agent's and the server's logs say what each did meanwhile.
PROCESS_LOGS = ("agent.log", "server.log")
LOG_TAIL_LINES = 60
LOGS_SHOWN = 4


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    tmp = getattr(item, "funcargs", {}).get("tmp_path")
    if report.failed and report.when == "call" and isinstance(tmp, Path):
        logs = sorted(p for name in PROCESS_LOGS for p in tmp.rglob(name) if p.is_file())
        for path in logs[:LOGS_SHOWN]:
            lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            report.sections.append((f"{path.relative_to(tmp)} (its last {len(lines)} lines)",
                                    "\n".join(lines)))
    return report


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
def _x_server(size: str, *extra: str, high: bool = False):
    """Xvfb on a display number it picks free itself (-displayfd): (display, process).
    ``high``: a number far above the ones -displayfd picks (from :0 up), for a test that
    kills its server and must find the display gone: a number -displayfd freed would be
    taken by the next test stream's Xvfb and answer for it.

    -noreset, as a desktop's X server is while its session runs: Xvfb resets when its
    last client leaves (its root black again), and a client that connects during the
    reset is refused ("unable to open display"): 29 of 300 `xset q` in a row beside
    three busy loops, 0 with -noreset. An agent restarted at once met one."""
    read_end, write_end = os.pipe()
    chosen = []
    if high:
        import random
        chosen = [f":{n}" for n in random.sample(range(600, 6000), 20)
                  if not os.path.exists(f"/tmp/.X{n}-lock")][:1]
    proc = subprocess.Popen(["Xvfb", *chosen, "-displayfd", str(write_end), "-screen", "0",
                             size, "-nolisten", "tcp", "-noreset", *extra],
                            pass_fds=(write_end,),
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
def xvfb(request):
    """A real X server and its process (working hours, the display's read-back); a test
    marked ``x_killed`` gets one on a high display number (_x_server)."""
    if shutil.which("Xvfb") is None or shutil.which("xset") is None:
        pytest.fail("a real X server's tests need Xvfb and xset (.ci/run installs xvfb and "
                    "x11-xserver-utils)")
    with _x_server("320x240x24", high=request.node.get_closest_marker("x_killed") is not None
                   ) as server:
        yield server


@pytest.fixture
def xvfb_pictures():
    """Xvfb that keeps what is drawn on it (-noreset, _x_server: xsetroot is its last
    client), 16:9, and its display. The picture check's tests draw with xsetroot and
    capture with xwd and ImageMagick's import."""
    missing = [tool for tool in ("Xvfb", "xset", "xsetroot", "xwd", "import")
               if not shutil.which(tool)]
    if missing:
        pytest.fail(f"the picture check's tests need {', '.join(missing)} (.ci/run installs "
                    "xvfb, x11-xserver-utils, x11-apps and imagemagick)")
    with _x_server("320x180x24") as (display, _):
        yield display


# -- a real wlroots compositor (Raspberry Pi OS's desktop is one: labwc) -----------------
DESKTOP_UID = 65534      # the desktop's user: not root (sway refuses to run as root), and
                         # not the test's: its runtime directory is another user's, 0700


class WaylandDesktop:
    """sway run headless as another user, in a runtime directory of its own (0700, that
    user's): its ``env`` is what a client needs (WAYLAND_DISPLAY, XDG_RUNTIME_DIR, PATH),
    ``swaymsg(...)`` asks it over its IPC, ``show(image)`` puts a picture (or a colour,
    "#rrggbb") on its one output through swaybg and waits until the output shows it."""
    OUTPUT = "HEADLESS-1"

    def __init__(self, runtime: Path, proc: subprocess.Popen):
        self.runtime, self.proc = runtime, proc
        self.env: dict = {}
        self.ipc = ""
        self._shown = 0

    def swaymsg(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(["swaymsg", "-s", self.ipc, *argv], capture_output=True,
                              text=True, timeout=10)

    def grab(self):
        """The output's pixels now, as grim prints them (a Pillow RGB image)."""
        import io
        from PIL import Image
        out = subprocess.run(["grim", "-t", "ppm", "-"], env=self.env, capture_output=True,
                             timeout=10)
        assert out.returncode == 0, out.stderr
        return Image.open(io.BytesIO(out.stdout)).convert("RGB")

    def show(self, image) -> None:
        if isinstance(image, str):
            r = self.swaymsg("output", self.OUTPUT, "bg", image, "solid_color")
            want = None
        else:       # swaybg, the desktop's own client, reads it as the desktop's user
            self._shown += 1
            path = self.runtime / f"shown-{self._shown}.png"
            image.save(path)
            os.chown(path, DESKTOP_UID, DESKTOP_UID)
            r = self.swaymsg("output", self.OUTPUT, "bg", str(path), "stretch")
            want = image.convert("RGB")
        assert r.returncode == 0, r.stdout + r.stderr
        if want is None:
            rgb = tuple(int(image[i:i + 2], 16) for i in (1, 3, 5))
            wait_for(lambda: self.grab().getextrema() == tuple((v, v) for v in rgb), 10,
                     interval=0.1, what=f"the output filled {image}")
        else:
            from PIL import ImageChops
            wait_for(lambda: ImageChops.difference(self.grab(), want).getbbox() is None, 10,
                     interval=0.1, what="the output showing the picture")


@pytest.fixture
def wayland_desktop():
    """A real headless wlroots compositor, sway (bookworm's 1.7; trixie's labwc is met in
    the booted tier), as the desktop's user, 1920x1080, nothing drawn."""
    missing = [t for t in ("sway", "swaymsg", "swaybg", "grim", "wlr-randr", "setpriv")
               if shutil.which(t) is None]
    if missing:
        pytest.fail(f"the Wayland tests need {', '.join(missing)} (.ci/run installs sway, "
                    "swaybg, grim and wlr-randr)")
    # in /tmp itself: pytest's directories are root's 0700, the desktop's user could not
    # reach its own runtime directory in them
    runtime = Path(tempfile.mkdtemp(prefix="edge-agent-desktop-"))
    os.chown(runtime, DESKTOP_UID, DESKTOP_UID)
    (runtime / "config").write_text("output * mode 1920x1080\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(runtime), "XDG_RUNTIME_DIR": str(runtime),
           "WLR_BACKENDS": "headless", "WLR_LIBINPUT_NO_DEVICES": "1",
           "WLR_RENDERER": "pixman"}     # no GPU here: the CPU renders
    log = open(runtime.with_suffix(".log"), "wb")
    proc = subprocess.Popen(["setpriv", f"--reuid={DESKTOP_UID}", f"--regid={DESKTOP_UID}",
                             "--clear-groups", "sway", "-c", str(runtime / "config")],
                            env=env, stdout=log, stderr=log, start_new_session=True)
    desktop = WaylandDesktop(runtime, proc)
    try:
        def ready():
            assert proc.poll() is None, \
                "sway exited: " + runtime.with_suffix(".log").read_text()[-2000:]
            sockets = [p.name for p in runtime.glob("wayland-*") if not p.name.endswith(".lock")]
            ipc = list(runtime.glob("sway-ipc.*.sock"))
            return (sockets[0], str(ipc[0])) if sockets and ipc else None
        display, desktop.ipc = wait_for(ready, 15, interval=0.05, what="sway's sockets")
        desktop.env = {"PATH": os.environ["PATH"], "WAYLAND_DISPLAY": display,
                       "XDG_RUNTIME_DIR": str(runtime)}
        wait_for(lambda: subprocess.run(["wlr-randr"], env=desktop.env, capture_output=True
                                        ).returncode == 0, 10, what="sway answering")
        yield desktop
    finally:        # sway and its swaybg: the group sway leads
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()
        shutil.rmtree(runtime, ignore_errors=True)
        runtime.with_suffix(".log").unlink(missing_ok=True)
