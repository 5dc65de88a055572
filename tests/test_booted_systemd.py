"""The user story under real systemd, on each release a screen runs: Debian 12 bookworm
(systemd 252, Python 3.11) and Debian 13 trixie (systemd 257, Python 3.13, what Raspberry
Pi OS is now based on), booted with systemd-nspawn, the one .deb installed into each with
apt, the screen configured, paired, wedged, cut off, upgraded and purged.

One system per release is booted for the module, in the test's own network namespace
(shared with the reference fleet server), and the tests run in order like an operator's
day. Each test is a step of that day that names the steps it starts after: a test
selected alone (``-k enrolls_and_pairs``) first runs those on its screen, once, so it
starts from the state it expects; in a full run they have already run and nothing runs
twice. WatchdogSec is lowered by a drop-in, as an operator would, so a watchdog restart
takes seconds, not five minutes.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent import __version__ as V
from agent.base.journal_fields import MessageId
from agent.commands import ledger
from devtools.booted import SUITES, BootedDebian, ensure_rootfs, package_depends
from devtools.harness import REPO, FleetServerProcess, wait_for
from devtools.netns import NetNS
from devtools.releases import SigningKey, built_at, reversioned

pytestmark = pytest.mark.system

UNIT = "edge-agent.service"
# above what one silent drop leaves unproven while the agent heals it (2 heartbeats of
# 2 s plus the 1 s ACK timeout): under it, the agent warns at start, rightly
WATCHDOG_S = 6
CONF = "/etc/edge-agent/agent.toml"
STATE = "/var/lib/edge-agent"
GRANT = "/run/edge-agent-grants/reboot"     # polkit's flag (agent/programs/grants.py)
LOGS_SOCKET = "/run/edge-agent-logs.sock"   # the journal gate (agent/programs/journal_gate.py)
HELPER_EXPOSURE_TARGET = 0.5                # as tests/test_unit_file.py holds it offline
DROP_IN = f"""[Service]
WatchdogSec={WATCHDOG_S}s
RestartSec=1s
# so that a core dump, if the agent allowed one, would land where the test looks:
# a writable working directory and no rlimit in the way (systemd-coredump's pipe
# ignores the rlimit anyway)
WorkingDirectory={STATE}
LimitCORE=infinity
"""
# the stack each release's own packages give the agent: what proves which one a run was on
STACKS = {
    "bookworm": {"systemd": r"252\.", "python3": r"3\.11\.", "python3-socketio": r"5\.7\.2-",
                 "python3-engineio": r"4\.3\.4-", "python3-requests": r"2\.28\.",
                 "python3-websocket": r"1\.2\.3-", "polkitd": r"122-"},
    "trixie": {"systemd": r"257\.", "python3": r"3\.13\.", "python3-socketio": r"5\.12\.",
               "python3-engineio": r"4\.11\.", "python3-requests": r"2\.32\.",
               "python3-websocket": r"1\.8\.", "polkitd": r"126-"},
}
PYTHON = {"bookworm": "python3.11", "trixie": "python3.13"}
# a display for working hours to turn off and on: an X server and xset, in the rootfs
# beside what the package needs
DISPLAY_STAND_IN = ["xvfb", "x11-xserver-utils"]
# the zones set-timezone sets (a Pi's image has them; trixie's minbase does not)
TIME_STAND_IN = ["tzdata"]
# what reads the agent's metrics on a fleet watched by Prometheus: Debian's node_exporter,
# its textfile collector at its own default directory; by debootstrap, without the
# collectors it recommends (their timers would write files of their own beside ours)
METRICS_READER = ["prometheus-node-exporter"]
# Raspberry Pi OS's own desktop (issue #52.2): a wlroots compositor run headless as a
# desktop user's (trixie's labwc, what Raspberry Pi OS runs; bookworm's sway 1.7), what
# the agent captures it with and reads it back with, a background to show, and setfacl
# for the recipe's grant
DESKTOP_STAND_IN = {"trixie": ["labwc", "grim", "wlr-randr", "swaybg", "acl"],
                    "bookworm": ["grim", "wlr-randr", "swaybg", "acl"]}
# bookworm's sway depends on polkitd, whose scripts debootstrap cannot run: apt installs it
DESKTOP_LATER = {"trixie": [], "bookworm": ["sway"]}
# the alarms apt's output must not raise on install, upgrade or purge
ALARMING = re.compile(r"could not|fail|error|warning", re.I)
# what dpkg says when it stops to ask about a configuration file: never, unattended
PROMPT = re.compile(r"Configuration file '|conffile prompt|\(Y/I/N/O/D/Z\)")
# dpkg on trixie when the last package that listed /lib/systemd/system leaves it for
# /usr/lib (merged /usr: the directory is /usr/lib/systemd/system, and not empty)
LEFT_ALIASED_DIRS = re.compile(r"dpkg: warning: unable to delete old directory "
                               r"'(/lib/systemd(?:/system)?)': Directory not empty")
# the landed state screens in the field were installed from, as 0.1.0-1: its
# /etc/edge-agent/agent.toml was a conffile, its units were under /lib/systemd/system
FIELD_RELEASE = "1eaf24a"
# today's version V: the tree builds V-1 (and V-2); the releases the tests make of it are
# V-2 and up, every one above the field's 0.1.0-1
# what the next release changes in its shipped defaults (/usr/lib/edge-agent/agent.toml):
# a key the operator's file sets too, and one it does not
NEW_DEFAULTS = {"# stable_after_s": "stable_after_s = 90",
                "# adapt_probe_after_s": "adapt_probe_after_s = 3600"}


@dataclass
class Site:
    release: str
    ns: NetNS
    server: FleetServerProcess
    screen: BootedDebian
    debs: tuple
    files_before_install: set = field(default_factory=set)
    statuses: list = field(default_factory=list)  # every Status: seen while (re)starting
    start_cursor: str = ""                        # the journal where the configured start began
    device_id: str = ""
    work: Path | None = None
    releases: dict = field(default_factory=dict)  # signed packages for the self-update
    steps: dict = field(default_factory=dict)     # step -> None (passed) or why it failed

    def reach(self, step, fixtures: dict) -> None:
        """Runs ``step`` on this screen unless it ran already, after the steps it needs:
        the screen's day is lived once, whichever of its tests are selected."""
        name = step.__name__
        if name in self.steps:
            if self.steps[name] is not None:
                raise AssertionError(f"{name} failed earlier on this screen: {self.steps[name]}")
            return
        for need in step.needs:
            if need.__name__ not in self.steps:
                print(f"\n[{self.release}] first, {need.__name__}")
            self.reach(need, {"site": self})
        self.steps[name] = "it was interrupted"
        try:
            step.__wrapped__(**fixtures)
        except BaseException as e:
            self.steps[name] = f"{type(e).__name__}: {str(e)[:300]}"
            raise
        self.steps[name] = None


def step(*needs):
    """A test that is a step of the screen's day, starting after ``needs``."""
    def wrap(fn):
        @functools.wraps(fn)
        def test(**fixtures):
            fixtures["site"].reach(test, fixtures)
        test.needs = needs
        return test
    return wrap


@pytest.fixture(scope="module", params=SUITES)
def release(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def rootfs(release):
    missing = [t for t in ("systemd-nspawn", "debootstrap", "nsenter") if shutil.which(t) is None]
    if os.geteuid() != 0 or missing:
        pytest.fail(f"the booted-system tests need root and {', '.join(missing) or 'nothing'} "
                    "(.ci/run installs systemd-container and debootstrap)")
    control = REPO / "debian" / "control"
    return ensure_rootfs(package_depends(control) + DISPLAY_STAND_IN + TIME_STAND_IN
                         + METRICS_READER + DESKTOP_STAND_IN[release],
                         package_depends(control, "Recommends") + DESKTOP_LATER[release],
                         suite=release)


@pytest.fixture(scope="module")
def site(release, rootfs, built_debs, tmp_path_factory):
    work = tmp_path_factory.mktemp(f"booted-{release}")
    with NetNS() as ns:
        server = FleetServerProcess(work, devices={}).start()
        try:
            with BootedDebian(rootfs) as screen:
                for deb in built_debs:
                    shutil.copy(deb, screen.path("/root/"))
                yield Site(release, ns, server, screen, built_debs, work=work)
        finally:
            server.stop()


# -- helpers ----------------------------------------------------------------------
def as_user(user: str, group: str, *argv: str) -> list[str]:
    return ["setpriv", f"--reuid={user}", f"--regid={group}", "--clear-groups", *argv]


def status(screen, *, unprivileged: bool = False) -> tuple[int, dict]:
    argv = ["edge-agent", "status", "--json"]
    if unprivileged:
        argv = as_user("nobody", "nogroup", *argv)
    r = screen.run(*argv, check=False)
    try:
        return r.returncode, json.loads(r.stdout)
    except ValueError:
        return r.returncode, {}


def wait_online(screen, timeout=20.0) -> dict:
    def online():
        rc, doc = status(screen)
        return doc if rc == 0 else None
    return wait_for(online, timeout, interval=0.2, what="edge-agent status: online")


def unit_lines(screen, after: str | None = None) -> list[dict]:
    """Everything about the unit, the agent's lines and systemd's, after a cursor.
    (journalctl 252 returns nothing for a field match combined with --after-cursor,
    so the filtering is done here.)"""
    entries = screen.journal(*(("--after-cursor", after) if after else ()))
    return [e for e in entries if UNIT in (e.get("_SYSTEMD_UNIT"), e.get("UNIT"))]


def agent_lines(screen, after: str | None = None) -> list[dict]:
    """The agent's own lines (not systemd's about it)."""
    return [e for e in unit_lines(screen, after)
            if e.get("_SYSTEMD_UNIT") == UNIT and e.get("SYSLOG_IDENTIFIER") == "edge-agent"]


def text(entries) -> str:
    return "\n".join(str(e.get("MESSAGE")) for e in entries)


def main_pid(screen) -> int:
    return int(screen.show(UNIT, "MainPID")["MainPID"])


def apt(screen, *args, expected: re.Pattern | None = None):
    """apt as an unattended upgrade runs it: no terminal, stdin at its end,
    DEBIAN_FRONTEND=noninteractive (INSIDE_ENV), and no --force-conf* option to
    answer a question dpkg should never have to ask. ``expected``: the one kind of
    warning the caller knows this step gives, and says why."""
    r = screen.run("apt-get", "-y", "-q", *args, check=False, timeout=300, input="")
    out = r.stdout + r.stderr
    assert not PROMPT.search(out), "dpkg stopped at a question:\n" + out
    assert r.returncode == 0, out
    # apt-utils' absence is debconf's note, not ours
    alarms = [line for line in out.splitlines()
              if ALARMING.search(line) and "apt-utils is not installed" not in line
              and not (expected and expected.fullmatch(line))]
    assert not alarms, "apt said:\n" + "\n".join(alarms)
    return out


def write_config(screen, server, **extra) -> None:
    # the file apt installed, so its owner and mode (root:edge-agent 0640) stay
    body = (f'[server]\nurl = "{server.url}"\nconnect_timeout_s = 2\n'
            '[link]\nheartbeat_interval_s = 2\nack_timeout_s = 1\nstable_after_s = 30\n'
            '[link.backoff]\nbase_s = 0.5\ncap_s = 2\n'
            '[uploads]\nbase_s = 1\ncap_s = 2\n')
    for line in extra.get("replace", []):
        body = body.replace(*line)
    screen.path(CONF).write_text(body)


class StatusSampler:
    """What `systemctl status` shows as Status:, sampled while a restart happens."""

    def __init__(self, screen, into: list):
        self.screen, self.into = screen, into
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            r = self.screen.run("systemctl", "show", UNIT, "--property=StatusText,ActiveState",
                                check=False)
            props = dict(l.split("=", 1) for l in r.stdout.splitlines() if "=" in l)
            if props.get("ActiveState") in ("activating", "active", "reloading"):
                self.into.append(props.get("StatusText", ""))
            self._stop.wait(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)


def exists(screen, path: str) -> bool:
    """Inside the container: /run is its own tmpfs, which ``screen.path`` does not see."""
    return screen.run("test", "-e", path, check=False).returncode == 0


def can_reboot(screen) -> str:
    """What logind, asking polkit, answers the edge-agent user: "yes" or "no"."""
    out = screen.run(*as_user("edge-agent", "edge-agent", "busctl", "call",
                              "org.freedesktop.login1", "/org/freedesktop/login1",
                              "org.freedesktop.login1.Manager", "CanReboot")).stdout
    return out.strip().removeprefix("s ").strip('"')


def files(screen) -> set[str]:
    return set(screen.run("find", "/", "-xdev").stdout.splitlines())


# -- the day ----------------------------------------------------------------------
@step()
def test_fresh_install_waits_for_its_configuration_instead_of_failing(site):
    s = site.screen
    site.files_before_install = files(s)
    apt(s, "install", f"/root/{site.debs[0].name}")  # no 'Could not execute systemctl'

    props = s.show(UNIT, "ActiveState", "Result", "UnitFileState", "NRestarts")
    assert props == {"ActiveState": "inactive", "Result": "exec-condition",
                     "UnitFileState": "enabled", "NRestarts": "0"}, props
    assert s.run("systemctl", "is-failed", UNIT, check=False).stdout.strip() != "failed"
    hint = [e for e in unit_lines(s) if "not configured yet" in str(e.get("MESSAGE"))]
    assert hint and hint[0]["PRIORITY"] == "5", hint  # a notice, not an error
    assert str(hint[0]["MESSAGE"]).startswith("edge-agent: not configured yet: set [server] url")

    # the user, directories and modes the unit and the README promise
    pw = s.run("getent", "passwd", "edge-agent").stdout.strip().split(":")
    assert int(pw[2]) < 1000 and pw[5] == STATE and pw[6] in ("/usr/sbin/nologin", "/bin/false"), pw
    modes = dict(line.split(" ", 1) for line in s.run(
        "stat", "-c", "%n %a %U:%G", CONF, STATE, "/etc/edge-agent").stdout.splitlines())
    assert modes == {CONF: "640 root:edge-agent", STATE: "700 edge-agent:edge-agent",
                     "/etc/edge-agent": "755 root:root"}, modes
    # the operator's file is theirs: no conffile for dpkg to ask about on an upgrade;
    # the package's defaults are under /usr
    assert s.run("dpkg-query", "-W", "-f=${Conffiles}", "edge-agent").stdout.strip() == ""
    assert "/usr/lib/edge-agent/agent.toml" in s.run("dpkg", "-L", "edge-agent").stdout
    assert s.path(CONF).read_text().count("\n") < 15, "the operator's file is not the short one"
    # on Debian's python3 and the release's own packaged stack, not a virtualenv
    assert s.path("/usr/bin/edge-agent").read_text().split("\n")[0] in (
        "#!/usr/bin/python3", "#! /usr/bin/python3", "#! /usr/bin/python3 -I")
    stack = STACKS[site.release]
    versions = dict(line.split(" ", 1) for line in s.run(
        "dpkg-query", "-W", "-f=${Package} ${Version}\n", "edge-agent", *stack).stdout.splitlines())
    print(f"\n[{site.release}] the stack the agent runs on: {versions}")
    assert versions["edge-agent"] == f"{V}-1", versions
    wrong = {p: v for p, v in versions.items() if p in stack and not re.match(stack[p], v)}
    assert not wrong, (site.release, wrong)
    where = s.run("python3", "-c", "import socketio, engineio, websocket, requests; "
                  "print(socketio.__file__, engineio.__file__, websocket.__file__, requests.__file__)")
    assert all(f.startswith("/usr/lib/python3/dist-packages/") for f in where.stdout.split()), where.stdout
    r = s.run("systemd-analyze", "verify", UNIT, "edge-agent-logs.socket", check=False)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
    # the journal gate listens from the install on, for the agent's user only
    props = s.show("edge-agent-logs.socket", "ActiveState", "UnitFileState")
    assert props == {"ActiveState": "active", "UnitFileState": "enabled"}, props
    assert s.run("stat", "-c", "%a %U:%G %F", LOGS_SOCKET).stdout.strip() == \
        "600 edge-agent:edge-agent socket"


@step(test_fresh_install_waits_for_its_configuration_instead_of_failing)
def test_a_bad_configuration_fails_the_unit_with_an_error_in_the_journal(site):
    s = site.screen
    write_config(s, site.server, replace=[("ack_timeout_s = 1", "ack_timeout_s = 5")])
    cursor = s.cursor()
    assert s.run("systemctl", "restart", UNIT, check=False).returncode != 0
    props = s.show(UNIT, "ActiveState", "ExecMainStatus", "NRestarts")
    # exit 2 is not restarted (RestartPreventExitStatus=2): no crash loop on a typo
    assert props == {"ActiveState": "failed", "ExecMainStatus": "2", "NRestarts": "0"}, props
    # journald reads the stream on its own time: wait for the line, then look at it
    errors = wait_for(lambda: [e for e in agent_lines(s, cursor)
                               if "config error" in e["MESSAGE"]], 10, interval=0.2,
                      what="the config error in the journal")
    assert len(errors) == 1, text(errors)
    assert errors[0]["PRIORITY"] == "3", errors[0]
    assert errors[0]["MESSAGE"] == ("edge-agent: config error: link.ack_timeout_s: must be less "
                                    "than link.heartbeat_interval_s (2.0)")
    s.run("systemctl", "reset-failed", UNIT)


@step(test_fresh_install_waits_for_its_configuration_instead_of_failing)
def test_only_the_url_finds_a_screentinker_server_and_is_built_again_for_it_in_place(site):
    """#50: agent.toml as the install block writes it (the url alone) and a ScreenTinker
    server (the emulation, which answers GET /api/version as both generations do): the
    agent finds out, records it and re-executes itself with the screentinker profile:
    the same main process, no STOPPING=1, no restart counted, and it registers."""
    s = site.screen
    (site.work / "screentinker").mkdir(exist_ok=True)
    st = FleetServerProcess(site.work / "screentinker", "--profile", "screentinker",
                            devices={}).start()
    try:
        write_config(s, st)
        cursor = s.cursor()
        s.run("systemctl", "restart", UNIT)
        pid = main_pid(s)
        code = wait_for(lambda: (status(s)[1].get("pairing") or {}).get("code"), 30,
                        interval=0.2, what="a code registered with the ScreenTinker profile")
        assert re.fullmatch(r"\d{3}-\d{3}", code), code
        assert main_pid(s) == pid, "re-executed in place, not restarted by systemd"
        props = s.show(UNIT, "ActiveState", "SubState", "NRestarts")
        assert props == {"ActiveState": "active", "SubState": "running", "NRestarts": "0"}, props
        said = text(agent_lines(s, cursor))
        assert "server profile screentinker: detected" in said and "restarting with it" in said
        assert status(s)[1]["profile"]["profile"] == "screentinker"
        assert json.loads(s.path(f"{STATE}/server-kind.json").read_text())["url"] == st.url
    finally:   # the screen's day goes on with the project's own server, from nothing
        s.run("systemctl", "stop", UNIT)
        s.run("rm", "-f", f"{STATE}/server-kind.json", f"{STATE}/credentials.json")
        st.stop()


@step(test_fresh_install_waits_for_its_configuration_instead_of_failing)
def test_enrolls_and_pairs_under_systemd(site):
    s, server = site.screen, site.server
    write_config(s, server)
    s.path(f"/etc/systemd/system/{UNIT}.d").mkdir(parents=True, exist_ok=True)
    s.path(f"/etc/systemd/system/{UNIT}.d/test.conf").write_text(DROP_IN)
    s.run("systemctl", "daemon-reload")
    site.start_cursor = s.cursor()
    with StatusSampler(s, site.statuses):
        s.run("systemctl", "restart", UNIT)
        code = wait_for(lambda: s.run("cat", "/run/edge-agent/pairing-code", check=False).stdout.strip(),
                        20, interval=0.2, what="the pairing code file")
    assert re.fullmatch(r"\d{3}-\d{3}", code), code
    said = wait_for(lambda: [e for e in agent_lines(s, site.start_cursor)
                             if f"pairing code {code}" in e["MESSAGE"]], 10, interval=0.2,
                    what="the pairing code in the journal")
    assert said[0]["PRIORITY"] == "6", said
    assert s.show(UNIT, "StatusText")["StatusText"] == f"waiting for pairing code {code}"
    rc, doc = status(s)
    # unclaimed: its own exit status, apart from a degraded screen's 1
    assert rc == 4 and doc["claimed"] is False and doc["pairing"]["code"] == code, doc
    # the clone check under the unit's sandbox: a board serial where the board has one
    # (not here: a PC, whose DMI uuid only root may read), else said unavailable
    board = doc["board"]
    assert board["clone_check"] in ("bound", "unavailable"), board
    if board["clone_check"] == "unavailable":
        said = s.run("edge-agent", "status", check=False).stdout
        assert "clone       check unavailable" in said, said
    else:
        assert s.path(f"{STATE}/board.json").exists()
    # only the url set: the server's own answers chose the profile, kept in the state dir
    assert doc["profile"]["profile"] == "edge-agent", doc["profile"]
    assert json.loads(s.path(f"{STATE}/server-kind.json").read_text())["url"] == server.url

    r = server.pair(code)
    assert r.returncode == 0, r.stderr
    doc = wait_online(s)
    assert s.show(UNIT, "StatusText")["StatusText"].startswith("online")
    # an operator without root sees the same
    rc, as_nobody = status(s, unprivileged=True)
    assert rc == 0 and as_nobody["device_id"] == doc["device_id"], as_nobody
    creds = s.run("stat", "-c", "%a %U", f"{STATE}/credentials.json").stdout.split()
    assert creds == ["600", "edge-agent"], creds
    token = json.loads(s.path(f"{STATE}/credentials.json").read_text())["token"]
    assert token not in text(unit_lines(s)), "the token reached the journal"
    # the live process is the release's own Python
    assert s.run("readlink", f"/proc/{main_pid(s)}/exe").stdout.strip() == \
        f"/usr/bin/{PYTHON[site.release]}"
    site.device_id = doc["device_id"]


@step(test_enrolls_and_pairs_under_systemd)
def test_node_exporter_shows_the_agents_metrics_through_the_packages_link(site):
    """[metrics] enabled: the textfile on tmpfs, read by Debian's prometheus-node-exporter
    as it comes (its default textfile directory holds the package's link to it)."""
    s = site.screen
    s.path(CONF).write_text(s.path(CONF).read_text() + "[metrics]\nenabled = true\nevery_s = 1\n")
    s.run("systemctl", "restart", UNIT)
    wait_online(s)
    assert s.run("systemctl", "is-active", "prometheus-node-exporter.service",
                 check=False).stdout.strip() == "active"
    scrape = ("import sys, urllib.request; sys.stdout.write(urllib.request.urlopen("
              "'http://127.0.0.1:9100/metrics', timeout=5).read().decode())")

    def proven():
        out = s.run("python3", "-c", scrape, check=False).stdout
        return out if re.search(r"^edge_agent_link_proven_live 1(\.0)?$", out, re.M) else None
    try:
        out = wait_for(proven, 30, interval=0.5, what="node_exporter to show the link proven live")
    except AssertionError:
        seen = [s.run(*argv, check=False) for argv in (
            ("journalctl", "-b", "-u", UNIT, "--no-pager", "-n", "40"),
            ("findmnt", "/run/edge-agent-metrics"),
            ("ls", "-la", "/run/edge-agent-metrics", "/var/lib/prometheus/node-exporter"))]
        raise AssertionError("\n".join(r.stdout + r.stderr for r in seen)) from None
    assert re.search(r"^edge_agent_link_up 1(\.0)?$", out, re.M), out
    assert re.search(r"^node_textfile_scrape_error 0$", out, re.M), out
    for series in ("edge_agent_link_connect_seconds_count", "edge_agent_queue_items",
                   "edge_agent_link_heartbeat_rtt_seconds_bucket", "edge_agent_watchdog_pets_total",
                   'edge_agent_commands_total{result="ok"}', 'edge_agent_settings_state{state='):
        assert series in out, f"{series} not in node_exporter's /metrics"
    path = "/run/edge-agent-metrics/edge-agent.prom"
    assert s.run("stat", "-f", "-c", "%T", path).stdout.strip() == "tmpfs", "never the card"
    assert s.run("stat", "-c", "%a %U", path).stdout.split() == ["644", "edge-agent"]
    assert s.run("readlink", "/var/lib/prometheus/node-exporter/edge-agent.prom"
                 ).stdout.strip() == path


@step(test_enrolls_and_pairs_under_systemd)
def test_the_sandbox_is_in_force(site):
    s = site.screen
    pid = main_pid(s)
    proc = dict(line.split(":\t", 1) for line in s.run("cat", f"/proc/{pid}/status").stdout.splitlines()
                if ":\t" in line)
    uid = s.run("id", "-u", "edge-agent").stdout.strip()
    assert proc["Uid"].split()[0] == uid
    assert proc["NoNewPrivs"] == "1" and proc["Seccomp"] == "2"
    assert int(proc["CapEff"], 16) == 0 and int(proc["CapBnd"], 16) == 0
    mounts = {parts[4]: parts[5] for parts in
              (line.split() for line in s.run("cat", f"/proc/{pid}/mountinfo").stdout.splitlines())}
    assert mounts["/"].startswith("ro"), mounts.get("/")           # ProtectSystem=strict
    assert mounts[STATE].startswith("rw"), mounts.get(STATE)       # ...but its state
    for private in ("/home", "/root", "/tmp", "/dev"):             # ProtectHome, PrivateTmp/Devices
        assert private in mounts, f"{private} is not a private mount"
    # nothing systemd or the agent said since the start was a warning or an error
    bad = [e for e in unit_lines(s, site.start_cursor) if int(e["PRIORITY"]) <= 4]
    assert not bad, text(bad)

    out = s.run("systemd-analyze", "security", UNIT, "--no-pager").stdout
    exposure = float(re.search(r"Overall exposure level for edge-agent.service: ([0-9.]+)", out).group(1))
    print(f"\nsystemd-analyze security {UNIT} on the booted system: {exposure}")
    assert exposure <= 1.5

    # MemoryMax/TasksMax need the memory and pids controllers for the unit's cgroup
    cgroups = dict(line.split(":", 2)[1:] for line in
                   s.run("cat", f"/proc/{pid}/cgroup").stdout.splitlines())
    limits = s.show(UNIT, "MemoryMax", "TasksMax")
    assert limits == {"MemoryMax": str(128 * 2 ** 20), "TasksMax": "64"}, limits
    for controller, key in (("memory", "MemoryMax"), ("pids", "TasksMax")):
        if cgroups.get(controller, "/") == "/" and not cgroups.get("", "").endswith(UNIT):
            print(f"{key} not enforced on this host: its {controller} controller is cgroup v1, "
                  "read-only in the container (a device on cgroup v2 enforces it)")
            continue
        path = f"/sys/fs/cgroup/unified{cgroups['']}" if cgroups.get(controller, "/") == "/" \
            else f"/sys/fs/cgroup/{controller}{cgroups[controller]}"
        name = {"memory": ("memory.max", "memory.limit_in_bytes"), "pids": ("pids.max",)}[controller]
        values = [s.run("cat", f"{path}/{n}", check=False).stdout.strip() for n in name]
        if not any(values):
            print(f"{key} not enforced on this host: no {controller} controller in {path} "
                  "(cgroup v1 controllers are read-only in the container; a device on cgroup "
                  "v2 enforces it)")
            continue
        assert limits[key] in values, (key, values)


@step(test_enrolls_and_pairs_under_systemd)
def test_the_os_grants_the_agent_only_what_its_configuration_allows(site):
    """[commands] allow does not list reboot here: polkit refuses it (not only the
    agent); and the agent is not in systemd-journal, so it cannot read other services'
    journals, while the gate that reads its own lines is closed to anyone else."""
    s = site.screen
    assert not exists(s, GRANT)
    assert can_reboot(s) == "no"
    r = s.run(*as_user("edge-agent", "edge-agent", "systemctl", "reboot", "--no-ask-password"),
              check=False)
    assert r.returncode != 0 and "Access denied" in r.stderr, r
    assert s.proc.poll() is None and s.boots == 1, "the container rebooted"

    pid = main_pid(s)
    proc = dict(line.split(":\t", 1) for line in s.run("cat", f"/proc/{pid}/status").stdout.splitlines()
                if ":\t" in line)
    journal_gid = s.run("getent", "group", "systemd-journal").stdout.split(":")[2]
    groups = proc["Groups"].split()
    assert journal_gid not in groups, proc["Groups"]
    # journalctl with exactly the agent process's uid, gid and groups
    uid, gid = proc["Uid"].split()[0], proc["Gid"].split()[0]
    assert s.journal("-u", "systemd-logind.service"), "nothing to hide: the check would be void"
    r = s.run("setpriv", f"--reuid={uid}", f"--regid={gid}", f"--groups={','.join(groups)}",
              "journalctl", "--no-pager", "-o", "json", "-u", "systemd-logind.service", check=False)
    assert not [line for line in r.stdout.splitlines() if line.startswith("{")], r.stdout[:500]

    r = s.run(*as_user("nobody", "nogroup", "python3", "-c",
                       f"import socket; socket.socket(socket.AF_UNIX).connect({LOGS_SOCKET!r})"),
              check=False)
    assert r.returncode != 0 and "PermissionError" in r.stderr, r
    out = s.run("systemd-analyze", "security", "edge-agent-logs@0.service", "--no-pager").stdout
    exposure = float(re.search(r"Overall exposure level for edge-agent-logs@0.service: ([0-9.]+)",
                               out).group(1))
    print(f"\nsystemd-analyze security edge-agent-logs@.service on the booted system: {exposure}")
    assert exposure <= HELPER_EXPOSURE_TARGET


WATCHDOG_DROPIN = "/etc/systemd/system.conf.d/edge-agent-watchdog.conf"


def runtime_watchdog(screen) -> str:
    """What PID 1 says of its RuntimeWatchdogSec (the manager's property)."""
    return screen.run("systemctl", "show", "-p", "RuntimeWatchdogUSec", "--value").stdout.strip()


@step(test_enrolls_and_pairs_under_systemd)
def test_the_system_watchdog_is_asked_of_systemd_only_while_configured(site):
    """[device] hardware_watchdog: root's start step writes the drop-in and reloads
    systemd, whose PID 1 then holds the period; a container has no /dev/watchdog0, which
    the doctor says. Turned off, the drop-in goes and systemd is back to off."""
    s = site.screen
    conf = s.path(CONF)
    before = conf.read_text()
    assert "[device]" not in before and runtime_watchdog(s) == "0"
    cursor = s.cursor()
    conf.write_text(before + "[device]\nhardware_watchdog = true\nhardware_watchdog_s = 12\n")
    try:
        s.run("systemctl", "restart", UNIT)
        wait_online(s)
        st = s.path(WATCHDOG_DROPIN).lstat()
        assert stat.S_ISREG(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o644
        assert "RuntimeWatchdogSec=12s" in s.path(WATCHDOG_DROPIN).read_text()
        assert runtime_watchdog(s) == "12s"
        said = text(unit_lines(s, cursor))
        assert (f"the system's watchdog: systemd's RuntimeWatchdogSec=12s in {WATCHDOG_DROPIN}, "
                "systemd reloaded") in said, said
        r = s.run("edge-agent", "doctor", "--json", check=False, timeout=120)
        step_ = {x["name"]: x for x in json.loads(r.stdout)["steps"]}["watchdog"]
        watchdog = wait_for(lambda: (status(s)[1].get("device") or {}).get("watchdog"), 20,
                            what="the status' watchdog")
        assert watchdog["configured_s"] == 12, watchdog
        # a container has no /dev/watchdog0; sysfs is the host's, which may have one
        if not exists(s, "/sys/class/watchdog/watchdog0"):
            assert not exists(s, "/dev/watchdog0")
            assert step_["verdict"] == "info" and step_["said"] == (
                "configured, no watchdog device here (systemd's RuntimeWatchdogSec is 12 s)"), \
                step_
            assert watchdog["state"] == "no-device", watchdog
        else:
            assert "/dev/watchdog0" in step_["said"], step_
        print(f"\n[{site.release}] RuntimeWatchdogUSec={runtime_watchdog(s)}; doctor: "
              f"{step_['said']}")
    finally:
        conf.write_text(before)
        s.run("systemctl", "restart", UNIT)
    wait_online(s)
    assert not s.path(WATCHDOG_DROPIN).exists() and runtime_watchdog(s) == "0"


@step(test_enrolls_and_pairs_under_systemd)
def test_a_healthy_link_gets_pets_and_is_never_restarted(site):
    s = site.screen
    before = s.show(UNIT, "NRestarts", "MainPID", "WatchdogTimestampMonotonic")
    time.sleep(4 * WATCHDOG_S)
    after = s.show(UNIT, "NRestarts", "MainPID", "WatchdogTimestampMonotonic")
    assert (after["NRestarts"], after["MainPID"]) == (before["NRestarts"], before["MainPID"])
    # systemd's own record of the last WATCHDOG=1: it kept moving
    assert int(after["WatchdogTimestampMonotonic"]) > int(before["WatchdogTimestampMonotonic"])
    last_pet_age = (time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6
                    - int(after["WatchdogTimestampMonotonic"])) / 1e6
    assert last_pet_age < WATCHDOG_S, f"last pet {last_pet_age:.1f}s ago"
    assert status(s)[0] == 0


@step(test_enrolls_and_pairs_under_systemd)
def test_a_wedged_agent_is_killed_by_the_watchdog_and_comes_back(site):
    s = site.screen
    pid, restarts = main_pid(s), int(s.show(UNIT, "NRestarts")["NRestarts"])
    cursor = s.cursor()
    with StatusSampler(s, site.statuses):
        s.run("systemctl", "kill", "--kill-whom=main", "--signal=SIGSTOP", UNIT)
        t0 = time.monotonic()
        wait_for(lambda: "Watchdog timeout" in text(unit_lines(s, cursor)),
                 WATCHDOG_S + 10, interval=0.2, what="systemd's watchdog timeout")
        print(f"\nSIGSTOP -> systemd's watchdog timeout in {time.monotonic() - t0:.1f}s "
              f"(WatchdogSec={WATCHDOG_S}s)")
        wait_for(lambda: main_pid(s) not in (0, pid), 20, interval=0.2, what="a new main process")
        wait_online(s)
    assert int(s.show(UNIT, "NRestarts")["NRestarts"]) == restarts + 1
    said = text(unit_lines(s, cursor))
    # the stacks of every thread reach the journal: the clue to why it wedged
    assert "Fatal Python error: Aborted" in said and "Thread 0x" in said, said
    # ...and no core file: not to the SD card, not with the token in it
    print("kernel.core_pattern on this host: " + Path("/proc/sys/kernel/core_pattern").read_text().strip())
    # killed by the SIGABRT, or, now and then, by a SIGSEGV inside faulthandler itself:
    # systemd sends SIGCONT with the SIGABRT, and a thread that runs on while its stack is
    # printed can crash the printing (CPython documents the dump as best effort)
    assert re.search(r"Main process exited, code=killed, status=(6/ABRT|11/SEGV)", said), said
    assert "code=dumped" not in said
    left = s.run("find", STATE, "/var/lib/systemd/coredump", "-type", "f", "-name", "core*",
                 check=False).stdout
    assert not left.strip(), left


@step(test_enrolls_and_pairs_under_systemd)
def test_a_silent_drop_past_watchdogsec_restarts_and_continues_the_backoff(site):
    s, server = site.screen, site.server
    pid, restarts = main_pid(s), int(s.show(UNIT, "NRestarts")["NRestarts"])
    cursor = s.cursor()
    site.ns.drop_port(server.port)  # silent: no FIN, no RST, until restored
    try:
        with StatusSampler(s, site.statuses):
            wait_for(lambda: "Watchdog timeout" in text(unit_lines(s, cursor)),
                     3 * WATCHDOG_S + 10, interval=0.2, what="systemd's watchdog timeout")

            def continued():
                for e in agent_lines(s, cursor):
                    m = re.search(r"continuing the reconnect schedule of the previous process: "
                                  r"attempt (\d+)", e["MESSAGE"])
                    if m and int(e["_PID"]) != pid:
                        return int(m.group(1))
                return None
            attempt = wait_for(continued, 20, interval=0.2,
                               what="the new process to continue the schedule")
            time.sleep(2.5)  # its first connect blocks on the dropped port: what does it say?
    finally:
        site.ns.restore()
    assert attempt >= 2, "the restarted agent started its backoff from scratch"
    wait_online(s, 30)
    assert int(s.show(UNIT, "NRestarts")["NRestarts"]) >= restarts + 1
    said = agent_lines(s, cursor)
    assert any("withholding pets" in e["MESSAGE"] and e["PRIORITY"] == "4" for e in said), text(said)


@step(test_a_bad_configuration_fails_the_unit_with_an_error_in_the_journal, test_enrolls_and_pairs_under_systemd, test_a_wedged_agent_is_killed_by_the_watchdog_and_comes_back, test_a_silent_drop_past_watchdogsec_restarts_and_continues_the_backoff)
def test_journal_priorities_and_status_lines(site):
    s = site.screen
    lines = agent_lines(s)
    by_priority: dict[str, list[str]] = {}
    for e in lines:
        by_priority.setdefault(e["PRIORITY"], []).append(e["MESSAGE"])
    assert any(m.startswith(f"edge-agent {V} starting") for m in by_priority.get("6", []))
    assert any("withholding pets" in m for m in by_priority.get("4", []))
    assert any("config error" in m for m in by_priority.get("3", []))
    # the <N> prefix is read by journald, never shown
    assert not [e for e in lines if re.match(r"<\d>", str(e["MESSAGE"]))]
    # `systemctl status` while starting and restarting: always a sentence, never None
    print(f"\nStatus: lines seen while (re)starting: {sorted(set(site.statuses))}")
    assert site.statuses, "no status was sampled"
    assert "None" not in site.statuses, sorted(set(site.statuses))
    assert {"starting link"} & set(site.statuses) or any(
        x.startswith(("waiting for pairing", "online", "reconnecting")) for x in site.statuses)


@step(test_enrolls_and_pairs_under_systemd)
def test_check_config_and_doctor_see_the_proxy_a_drop_in_gives_the_agent(site):
    """Operator #50.2: install.md's site-wide settings in a drop-in (Environment=, and an
    EnvironmentFile= by systemd's quoting rules): the agent is online through the proxy,
    and check-config and doctor, run from a shell that has none of it, say the same and
    where each value comes from (they read what systemd gives the unit)."""
    from devtools.site import Parts
    s, server = site.screen, site.server
    drop_in, env_file = f"/etc/systemd/system/{UNIT}.d/site.conf", "/etc/edge-agent/site.env"
    work = Path(tempfile.mkdtemp(prefix="site-proxy-", dir="/tmp"))   # tinyproxy, as nobody,
    os.chmod(work, 0o755)                                              # reopens its log here
    parts = Parts(work)
    port, log = parts.proxy(connect_ports=(server.port,))
    tunnel = f": CONNECT 127.0.0.1:{server.port} "   # a tunnel asked for, in its log
    s.path(env_file).write_text('# the site\n  EDGE_AGENT_LOG_LEVEL = "debug"  \n')
    s.path(drop_in).write_text(f'[Service]\nEnvironment="http_proxy=http://127.0.0.1:{port}"\n'
                               f"EnvironmentFile=-{env_file}\n")
    try:
        s.run("systemctl", "daemon-reload")
        s.run("systemctl", "restart", UNIT)
        wait_online(s)
        wait_for(lambda: tunnel in log.read_text(), 10, what="the agent's CONNECT")
        said = s.run("edge-agent", "check-config").stdout
        assert (f"proxy     http://127.0.0.1:{port} (http_proxy, from Environment= in "
                f"{drop_in})") in said, said
        assert f"EDGE_AGENT_LOG_LEVEL from EnvironmentFile {env_file}" in said, said
        before = log.read_text().count(tunnel)
        r = s.run("edge-agent", "doctor", "--json", check=False)
        report = json.loads(r.stdout)
        steps = {x["name"]: x for x in report["steps"]}
        assert steps["proxy"]["verdict"] == "ok", steps["proxy"]
        assert f"127.0.0.1:{port} accepted CONNECT" in steps["proxy"]["said"], steps["proxy"]
        assert f"from http_proxy, Environment= in {drop_in}" in \
            steps["configuration"]["said"], steps["configuration"]
        assert log.read_text().count(tunnel) > before, "the doctor did not use the proxy"
        assert steps["upgrade"]["verdict"] == "ok" and r.returncode == report["exit"], report
        assert any(f"http_proxy from Environment= in {drop_in}" in n and
                   f"EDGE_AGENT_LOG_LEVEL from EnvironmentFile {env_file}" in n
                   for n in report["notes"]), report["notes"]
        assert not [x for x in report["steps"] if x["verdict"] == "fail"], report
    finally:
        s.run("rm", "-f", drop_in, env_file)
        s.run("systemctl", "daemon-reload")
        s.run("systemctl", "restart", UNIT)
        wait_online(s)
        parts.close()
        shutil.rmtree(work)


@step(test_enrolls_and_pairs_under_systemd,
      test_a_silent_drop_past_watchdogsec_restarts_and_continues_the_backoff)
def test_the_journal_selects_the_agents_records_by_their_fields_and_explains_them(site):
    """What a log pipeline and an operator select by: the record of the link the silent
    drop cost, found by its reason as `journalctl -u edge-agent REASON=...` finds it,
    with the screen's fields; the restart after the watchdog's kill said with its id;
    and `journalctl -x` explaining both from the catalog the package installed."""
    s = site.screen
    lost = [e for e in agent_lines(s) if e.get("MESSAGE_ID") == MessageId.LINK_LOST]
    assert lost, text(agent_lines(s)[-40:])
    reason = lost[-1]["REASON"]
    found = [e for e in s.journal("-u", UNIT, f"REASON={reason}")
             if e.get("MESSAGE_ID") == MessageId.LINK_LOST]
    assert found and found[-1]["__CURSOR"] == lost[-1]["__CURSOR"], found
    record = found[-1]
    assert record["MESSAGE"].startswith("link lost: "), record
    assert (record["PRIORITY"], record["SYSLOG_IDENTIFIER"], record["_TRANSPORT"]) == \
        ("4", "edge-agent", "journal"), record
    assert (record["DEVICE_ID"], record["VERSION"]) == (site.device_id, V), record
    assert record["CONNECTION"].isdigit() and record["_SYSTEMD_UNIT"] == UNIT, record
    # every record of the agent's own carries the screen's fields, its start included
    started = [e for e in agent_lines(s) if e["MESSAGE"].startswith(f"edge-agent {V} starting")]
    assert started and started[-1].get("DEVICE_ID") == site.device_id, started[-1]
    restarted = [e for e in agent_lines(s) if e.get("MESSAGE_ID") == MessageId.RESTARTED_AFTER_KILL]
    assert restarted and restarted[-1]["PRIORITY"] == "4", text(agent_lines(s)[-40:])
    paired = {e.get("MESSAGE_ID") for e in agent_lines(s, site.start_cursor)}
    assert {MessageId.PAIRING_CODE_SHOWN, MessageId.PAIRING_CLAIMED} <= paired, paired
    # the catalog, installed by the package and read in by systemd's dpkg trigger
    explained = s.run("journalctl", "--no-pager", "-x", "-u", UNIT,
                      f"MESSAGE_ID={MessageId.LINK_LOST}").stdout
    assert f"Subject: Link to the fleet server lost: {reason}" in explained, explained[-2000:]
    assert "docs/troubleshooting.md" in explained
    explained = s.run("journalctl", "--no-pager", "-x", "-u", UNIT,
                      f"MESSAGE_ID={MessageId.RESTARTED_AFTER_KILL}").stdout
    assert "Subject: Started again after the previous process was killed" in explained


def command(site, name, args=None, timeout=30.0) -> dict:
    """What `fleet-server command` does: queue it for the screen, wait for the result."""
    server = site.server
    cid = server.admin("/api/v1/commands", {"device_id": site.device_id, "name": name,
                                            "args": args or {}})["id"]
    return wait_for(lambda: server.admin(f"/api/v1/devices/{site.device_id}/commands")[cid]["result"],
                    timeout, interval=0.2, what=f"the result of {name}")


def bundle(site, upload_id):
    import urllib.error
    import urllib.request
    url = f"{site.server.url}/admin/uploads/{site.device_id}/{upload_id}/content"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read()
    except urllib.error.HTTPError:
        return None


@step(test_a_bad_configuration_fails_the_unit_with_an_error_in_the_journal, test_enrolls_and_pairs_under_systemd, test_a_silent_drop_past_watchdogsec_restarts_and_continues_the_backoff)
def test_a_logs_command_returns_the_agents_journal_lines_with_their_priorities(site):
    import gzip
    result = command(site, "logs", {"since_s": 3600, "priority": 7})
    assert result["ok"] and result["source"] == "the journal", result
    data = wait_for(lambda: bundle(site, result["upload_id"]), 30, interval=0.2,
                    what="the journal bundle through the upload queue")
    lines = [json.loads(x) for x in gzip.decompress(data).decode().splitlines()]
    priorities = {x["priority"] for x in lines}
    assert {3, 4, 6} <= priorities, priorities  # the config error, the withheld pets, starts
    assert any(x["message"].startswith(f"edge-agent {V} starting") for x in lines
               if x["priority"] == 6)
    assert not [x for x in lines if re.match(r"<\d>", x["message"])]
    # read for the agent by a helper instance of the socket's, not by the agent itself
    helpers = [e for e in site.screen.journal() if str(e.get("UNIT", "")).startswith(
        "edge-agent-logs@") and str(e.get("MESSAGE", "")).startswith("Started ")]
    assert helpers, "no edge-agent-logs@ instance served the command"


def next_release(site) -> Path:
    """Revision 2 of today's version, whose shipped defaults differ from 0.1.0-1's, as the
    next release's would: in /root/ of the screen."""
    deb = site.work / "next" / site.debs[1].name
    if not deb.exists():
        deb.parent.mkdir(exist_ok=True)
        reversioned(site.debs[1], f"{V}-2", deb.parent, defaults=NEW_DEFAULTS)
    shutil.copy(deb, site.screen.path("/root/"))
    return deb


def assert_new_defaults_under_the_operators(screen, stable_after_s: str = "30.0") -> None:
    """The configuration as the installed agent reads it: the new release's default
    where the operator set nothing, the operator's value where they did (as this
    release takes it: ``stable_after_s``)."""
    out = screen.run("python3", "-I", "-c", "from agent.config import load as config; c = config.load(); "
                     "print(c.link.stable_after_s, c.origins['link.stable_after_s'], "
                     "c.link.idle.probe_after_s, c.origins['link.adapt_probe_after_s'])").stdout
    # the release's shipped defaults file says "package", the code's own "default"
    assert out.split() == [stable_after_s, "file", "3600.0", "package"], out


def assert_dpkg_content(screen) -> None:
    r = screen.run("dpkg", "--audit", check=False)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr
    assert package_version(screen) == f"{V}-2 ii"


@step(test_enrolls_and_pairs_under_systemd)
def test_the_journal_takes_words_from_outside_as_one_entry_at_their_own_priority(site):
    """journald splits a stream at NUL as well as LF and takes a new <N> as the next
    entry's priority: a command id or a ScreenTinker refusal text made entries at
    emergency priority credited to the agent. The agent's own logging, under the real
    journald, with the words a hostile fleet sends: on journald's socket, as the agent
    writes, and on the stream it falls back to when the socket is out of its reach."""
    s = site.screen
    ident = f"edge-agent-forgery-{os.getpid()}"
    hostile = "'x\\x00<0>forged emergency\\n<1>forged alert\\r<2>crit \\x1b]52;c;eA==\\x07'"
    code = ("import logging; from agent.base import logs; logs.setup('info'); "
            f"logging.getLogger('edge_agent').warning('refused: %s', {hostile}, "
            f"extra={{'journal': {{'COMMAND_ID': {hostile[:-1]} {ident}'}}}})")
    for socket_out_of_reach in (False, True):
        s.run("systemd-run", "--wait", "--quiet", "-p", "User=edge-agent",
              "-p", "StandardOutput=journal", "-p", "StandardError=journal",
              "-p", "SyslogLevelPrefix=yes", "-p", f"SyslogIdentifier={ident}",
              *(("-p", "InaccessiblePaths=/run/systemd/journal/socket")
                if socket_out_of_reach else ()),
              "/usr/bin/python3", "-I", "-c", code)
    # the socket's record: the agent's identifier, found by the field it carries
    entries = wait_for(lambda: [e for e in s.journal("SYSLOG_IDENTIFIER=edge-agent", "_TRANSPORT=journal")
                                if ident in str(e.get("COMMAND_ID"))] or None, 10,
                       interval=0.2, what="the record in the journal")
    streamed = wait_for(lambda: s.journal("-t", ident) or None, 10, interval=0.2,
                        what="the line the stream carried")
    for said in (entries, streamed):
        assert len(said) == 1, [(e.get("PRIORITY"), e.get("MESSAGE")) for e in said]
        assert said[0]["PRIORITY"] == "4"
        assert said[0]["MESSAGE"].startswith("refused: x\\x00<0>forged emergency\\n<1>forged")
    assert entries[0]["_TRANSPORT"] == "journal" and streamed[0]["_TRANSPORT"] == "stdout"
    assert entries[0]["COMMAND_ID"].startswith("x\\x00<0>forged emergency\\n<1>forged")


@step(test_enrolls_and_pairs_under_systemd)
def test_every_failure_of_a_reason_is_found_by_it_written_or_counted(site):
    """`journalctl REASON=proxy-unreachable` listed 1 of 3 failures: the rate limit held
    two back behind another reason's line and no record of that reason said so. Under
    the real journald, as the unit's agent writes (its user, journald's socket), the
    rate limit's clock stepped past its window: the records a selection by REASON finds
    account for every failure, the held-back ones in HELD_BACK."""
    s = site.screen
    ident = f"held-back-{os.getpid()}-{time.monotonic_ns()}"
    code = ("import logging; from agent.base import logs; "
            "from agent.base.journal_fields import journal; logs.setup('info'); "
            "log = logging.getLogger('edge_agent'); now = [0.0]; "
            "log.handlers[0].repeats.clock = lambda: now[0]\n"
            "def fail(reason, n):\n"
            "    log.warning('connect to %s failed (%s: %s), retrying in %.1fs (attempt %d)', "
            f"'{ident}', reason, 'no answer', 2.0, n, extra=journal(REASON=reason))\n"
            "for n, reason in enumerate(['proxy-unreachable', 'dns-failed', "
            "'proxy-unreachable', 'proxy-unreachable']): fail(reason, n + 1)\n"
            "now[0] = 61.0; fail('proxy-unreachable', 5)\n"
            "now[0] = 70.0; fail('proxy-unreachable', 6); fail('proxy-unreachable', 7)\n")
    s.run("systemd-run", "--wait", "--quiet", "-p", "User=edge-agent",
          "-p", "StandardOutput=journal", "-p", "StandardError=journal",
          "-p", "SyslogLevelPrefix=yes", "/usr/bin/python3", "-I", "-c", code)

    def found():
        said = [e for e in s.journal("SYSLOG_IDENTIFIER=edge-agent", "REASON=proxy-unreachable")
                if ident in str(e.get("MESSAGE"))]
        return said if len(said) >= 3 else None
    said = wait_for(found, 10, interval=0.2, what="the records of that reason")
    shown = [(e["MESSAGE"], e.get("HELD_BACK")) for e in said]
    assert len(said) == 3, shown
    first, next_one, at_stop = said
    assert first["MESSAGE"].endswith("(attempt 1)") and "HELD_BACK" not in first, shown
    assert next_one["MESSAGE"].endswith("(attempt 5) (2 more like this in the last 61s)")
    assert next_one["HELD_BACK"] == "2" and next_one["_TRANSPORT"] == "journal", shown
    assert at_stop["MESSAGE"].startswith("held back 2 more like this in the last 9s: ")
    assert at_stop["HELD_BACK"] == "2" and at_stop["PRIORITY"] == "4", shown
    # every failure of that reason (attempts 1, 3-7): the ones written, and the ones the
    # records count
    written = [e for e in said if e["MESSAGE"].startswith("connect to ")]
    assert len(written) + sum(int(e.get("HELD_BACK", 0)) for e in said) == 6, shown
    other = [e for e in s.journal("SYSLOG_IDENTIFIER=edge-agent", "REASON=dns-failed")
             if ident in str(e.get("MESSAGE"))]
    assert len(other) == 1 and "HELD_BACK" not in other[0], other


@step(test_enrolls_and_pairs_under_systemd)
def test_nothing_the_agents_user_writes_runs_at_the_next_start(site):
    """The agent's user owns its home (the state directory, $HOME under systemd): hooks
    planted there, where Python looks for a user's own, are never imported by the
    agent or by `edge-agent status` run as that user."""
    s = site.screen
    site_dir = f"{STATE}/.local/lib/{PYTHON[site.release]}/site-packages"
    planted = []
    for name, body in (("usercustomize.py", "usercustomize"), ("sitecustomize.py", "sitecustomize"),
                       ("planted.pth", "pth")):
        hook = f"open('{STATE}/ran-{body}', 'w').close()\n"
        planted.append((f"{site_dir}/{name}", ("import os; " + hook) if name.endswith(".pth")
                        else hook))
    planted.append((f"{STATE}/sitecustomize.py", f"open('{STATE}/ran-cwd', 'w').close()\n"))
    s.run(*as_user("edge-agent", "edge-agent", "mkdir", "-p", site_dir))
    for path, body in planted:
        s.run(*as_user("edge-agent", "edge-agent", "sh", "-c", f'cat > "$1"', "-", path),
              input=body)
    try:
        s.run("systemctl", "restart", UNIT)
        wait_online(s)
        s.run(*as_user("edge-agent", "edge-agent", "env", f"HOME={STATE}", "sh", "-c",
                       f"cd {STATE} && edge-agent status"), check=False)
        ran = s.run("sh", "-c", f"ls {STATE}/ran-* 2>/dev/null", check=False).stdout.split()
        assert ran == [], f"planted hooks ran: {ran}"
        # the same hooks with the same interpreter, not isolated: they run (the test can fail)
        s.run(*as_user("edge-agent", "edge-agent", "env", f"HOME={STATE}",
                       PYTHON[site.release], "-c", "pass"))
        assert exists(s, f"{STATE}/ran-usercustomize")
    finally:
        s.run("sh", "-c", f"rm -rf {STATE}/.local {STATE}/sitecustomize.py {STATE}/ran-*")


@step(test_enrolls_and_pairs_under_systemd)
def test_a_long_outage_restarts_the_agent_less_and_less_often_and_heals_as_fast(site):
    """While the server cannot be reached (connect-timeout: the network's reason), each
    watchdog restart in the outage comes later than the last (1, 2, 4 x WatchdogSec);
    once the path is back the agent is online as fast as before."""
    s, server = site.screen, site.server
    wait_online(s)
    before = int(s.show(UNIT, "NRestarts")["NRestarts"])
    site.ns.drop_port(server.port)   # silent: connects time out
    window = 8 * WATCHDOG_S + 2      # without the patience: a restart every ~7 s
    try:
        time.sleep(window)
        restarts = int(s.show(UNIT, "NRestarts")["NRestarts"]) - before
    finally:
        site.ns.restore()
    t0 = time.monotonic()
    wait_online(s, 30)
    back_s = time.monotonic() - t0
    print(f"\n[{site.release}] {window} s of outage with WatchdogSec={WATCHDOG_S}s: {restarts} "
          f"restarts (every WatchdogSec: {window // (WATCHDOG_S + 1)}); online {back_s:.1f}s "
          f"after the path came back")
    assert 1 <= restarts <= 3, restarts
    assert back_s < 10, back_s


@step(test_enrolls_and_pairs_under_systemd)
def test_upgrade_keeps_identity_credentials_and_queue_and_restarts(site):
    s, server = site.screen, site.server
    # counted from here: the logs command's journal bundle went before
    stored_before = server.device(site.device_id).get("uploads", 0)
    queue_two_uploads(site)   # queued items stay queued
    assert status(s)[1]["uploads"]["items"] == 2
    before = s.show(UNIT, "MainPID", "InvocationID")
    ids = {p: s.path(p).read_bytes() for p in (f"{STATE}/device_id", f"{STATE}/credentials.json")}
    conf = s.path(CONF)
    conf.write_text(conf.read_text() + "# edited by the operator\n")
    edited = conf.read_text()

    with StatusSampler(s, site.statuses):
        apt(s, "install", f"/root/{next_release(site).name}")
        wait_for(lambda: s.show(UNIT, "InvocationID")["InvocationID"] != before["InvocationID"],
                 20, interval=0.2, what="the agent restarted by the upgrade")
        doc = wait_online(s)
    assert s.run("dpkg-query", "-W", "-f=${Version}", "edge-agent").stdout == f"{V}-2"
    assert main_pid(s) != int(before["MainPID"])
    assert {p: s.path(p).read_bytes() for p in ids} == ids, "device id or credentials changed"
    assert doc["device_id"] == site.device_id and doc["uploads"]["items"] == 2, doc
    assert conf.read_text() == edited
    assert_new_defaults_under_the_operators(s)
    assert_dpkg_content(s)
    server.admin("/admin/behaviour", {"upload_mode": "ok"})
    wait_for(lambda: server.device(site.device_id).get("uploads") == stored_before + 2, 20,
             interval=0.2, what="the queued uploads delivered after the upgrade")


@step(test_enrolls_and_pairs_under_systemd)
def test_a_reboot_command_reboots_once_through_logind_and_the_screen_comes_back(site):
    s, server = site.screen, site.server
    conf = s.path(CONF)
    conf.write_text(conf.read_text() + '[commands]\nallow = ["diagnostics", "logs", "reboot"]\n')
    try:
        s.run("systemctl", "restart", UNIT)
        wait_online(s)
        # the root-side step wrote polkit's flag: root's file, 0644, in root's directory
        assert s.run("stat", "-c", "%a %U:%G %F", GRANT, os.path.dirname(GRANT)).stdout.splitlines() \
            == ["644 root:root regular file", "755 root:root directory"]
        assert can_reboot(s) == "yes"
        cid = server.admin("/api/v1/commands", {"device_id": site.device_id, "name": "reboot"})["id"]
        s.rebooted(60)  # logind, asked by the edge-agent user under the polkit rule
        wait_online(s, 60)
        record = wait_for(lambda: server.admin(f"/api/v1/devices/{site.device_id}/commands")[cid]
                          if server.admin(f"/api/v1/devices/{site.device_id}/commands")[cid]["result"]
                          else None, 30, interval=0.2, what="the reboot's result")
        assert record["result"]["ok"] and record["result"]["output"] == "the device rebooted", \
            record
        # the stop mark systemd's stop left at the reboot, told by the next boot's first start
        # (docs/operate.md, "The device"), read under the unit's sandbox
        # (the link may be online before the device part's first look is in the file)
        device = wait_for(lambda: (status(s)[1].get("device") or {}).get("last_boot")
                          and status(s)[1]["device"], 20, interval=0.5, what="the last boot said")
        assert (device["last_boot"]["cause"], device["last_boot"]["by"]) == ("clean", "fleet"), device
        assert device["storage"]["verdict"] in ("ok", "worn", "full"), device
        booted = wait_for(lambda: screen_events(site, "device.boot")[-1:], 20, what="device.boot")
        assert (booted[0]["cause"], booted[0]["by"]) == ("clean", "fleet")
        time.sleep(3 * WATCHDOG_S)
        assert s.proc.poll() is None and s.boots == 2, "it rebooted again"
        # read as the agent reads it (the ledger's format is agent/commands/ledger.py's)
        entries = ledger.load(str(s.path(f"{STATE}/commands.json")), time.time()).entries
        assert entries[cid].state == "done", entries.get(cid)
        # /run is new after the reboot: the start wrote the flag again
        assert exists(s, GRANT) and can_reboot(s) == "yes"
        # the operator takes reboot out again: at the next start polkit refuses it again
        conf.write_text(conf.read_text().replace('"logs", "reboot"]', '"logs"]'))
        s.run("systemctl", "restart", UNIT)
        wait_online(s)
        assert not exists(s, GRANT) and can_reboot(s) == "no"
    except BaseException:
        # reboot left allowed, the next steps' ladders may reboot this screen under them
        # (the network healer's last rung is a reboot where allowed): on CI, after this
        # step failed once, the screen was gone for the twelve steps after the healer's
        conf.write_text(conf.read_text().replace('"logs", "reboot"]', '"logs"]'))
        s.run("systemctl", "restart", UNIT, check=False)
        raise


@step(test_enrolls_and_pairs_under_systemd,
      test_a_reboot_command_reboots_once_through_logind_and_the_screen_comes_back)
def test_settings_from_the_fleet_restart_the_agent_and_the_grants_follow_them(site):
    """A revision applied by systemd's restart; root's ExecStartPre grants what it
    allows (the file lets the fleet manage [commands] allow) and takes it back with the
    next revision; the operator's way back is to remove the overlay."""
    s = site.screen
    conf = s.path(CONF)
    before = conf.read_text()
    conf.write_text(before.replace('allow = ["diagnostics", "logs"]',
                                   'allow = ["diagnostics", "logs", "configure"]')
                    + '[fleet]\nmanage_commands_allow = true\nproof_timeout_s = 15\n')
    s.run("systemctl", "restart", UNIT)
    wait_online(s)
    assert not exists(s, GRANT)
    managed = ["diagnostics", "logs", "configure", "reboot"]
    pid = main_pid(s)
    r = command(site, "configure", {"revision": 1, "settings": {
        "commands.allow": managed, "log.level": "debug"}})
    assert r["ok"] and "revision 1 staged" in r["output"], r
    wait_for(lambda: main_pid(s) not in (0, pid), 30, what="systemd starting the agent again")
    doc = wait_online(s, 30)
    kept = wait_for(lambda: status(s)[1]["settings"] if status(s)[1].get("settings", {})
                    .get("state") == "kept" else None, 30, what="revision 1 kept")
    assert kept["origins"]["commands.allow"] == "fleet" and kept["origins"]["log.level"] == "fleet"
    assert doc["settings"]["revision"] == 1
    assert exists(s, GRANT) and can_reboot(s) == "yes"
    assert "fleet settings revision 1 kept" in text(agent_lines(s))
    pid = main_pid(s)
    assert command(site, "configure", {"revision": 2, "settings": {
        "commands.allow": managed[:3]}})["ok"]
    wait_for(lambda: main_pid(s) not in (0, pid), 30, what="systemd starting the agent again")
    wait_online(s, 30)
    assert not exists(s, GRANT) and can_reboot(s) == "no"
    # the operator's way back: the file alone
    s.run("rm", f"{STATE}/fleet-settings.json")
    conf.write_text(before)
    s.run("systemctl", "restart", UNIT)
    assert wait_online(s).get("settings", {}).get("revision") is None


X11_DROP_IN = "/etc/systemd/system/edge-agent.service.d/display.conf"


@step(test_enrolls_and_pairs_under_systemd,
      test_settings_from_the_fleet_restart_the_agent_and_the_grants_follow_them)
def test_working_hours_reach_an_x_display_through_the_sandbox_only_with_the_readmes_drop_in(
        site):
    """The unit's PrivateTmp= hides the X server's socket (/tmp/.X11-unix) from the
    agent: the hours report the fault; README's drop-in opens that one directory and
    the display goes dark out of hours. The X server listens on its socket file only
    (an abstract socket would pass any sandbox that keeps the network)."""
    s, server = site.screen, site.server
    # -noreset: a desktop's X server does not reset when a client leaves (conftest.py)
    s.run("systemd-run", "--unit=x-display", "--uid=nobody", "Xvfb", ":0", "-nolisten", "tcp",
          "-nolisten", "local", "-noreset", "-screen", "0", "640x480x24")
    wait_for(lambda: s.run("xset", "-display", ":0", "q", check=False).returncode == 0, 15,
             what="the X server in the container")
    conf = s.path(CONF)
    before = conf.read_text()
    today = s.run("date", "+%Y-%m-%d").stdout.strip()
    commands = ('display_on_command = "xset -display :0 s reset dpms force on"\n'
                'display_off_command = "xset -display :0 dpms force off"\n')
    with_commands = (before.replace("[commands]\n", "[commands]\n" + commands, 1)
                     if "[commands]\n" in before else before + "[commands]\n" + commands)
    # hours in force all week but today: the display is to be off now
    conf.write_text(with_commands + '[hours]\nweek = ["mon-sun 00:00-24:00"]\n'
                    f'exceptions = ["{today} off"]\nclock = "trusted"\n')

    def events(kind):
        return [e for e in server.device(site.device_id).get("events", [])
                if e.get("type") == kind]
    try:
        s.run("systemctl", "restart", UNIT)
        wait_online(s)
        fault = wait_for(lambda: events("display.fault"), 20, what="display.fault")
        assert fault[-1]["wanted"] == "off" and "unable to open display" in fault[-1]["error"]
        s.path(X11_DROP_IN).write_text("[Service]\nBindPaths=/tmp/.X11-unix\n")
        s.run("systemctl", "daemon-reload")
        s.run("systemctl", "restart", UNIT)
        wait_online(s)
        done = wait_for(lambda: events("display.scheduled"), 20, what="display.scheduled")
        assert done[-1]["state"] == "off"
        assert status(s)[1]["hours"]["applied"] == "off"
    finally:
        s.run("rm", "-f", X11_DROP_IN)
        s.run("systemctl", "daemon-reload")
        s.run("systemctl", "stop", "x-display", check=False)
        conf.write_text(before)
        s.run("systemctl", "restart", UNIT)
        wait_online(s)


# -- the screen's truth under the sandbox ---------------------------------------------
PLAYER = "kiosk.service"
PLAYER_GRANT = "/run/edge-agent-grants/restart-player"
POWEROFF_GRANT = "/run/edge-agent-grants/poweroff"
REFUSED = re.compile(r"Access denied|Interactive authentication required")


def with_allow(conf: str, allow: list[str]) -> str:
    """The configuration with [commands] allow set to ``allow``."""
    line = "allow = " + json.dumps(allow)
    if re.search(r"^allow = .*$", conf, re.M):
        return re.sub(r"^allow = .*$", line, conf, count=1, flags=re.M)
    return conf + f"[commands]\n{line}\n"


def can_power_off(screen) -> str:
    """What logind, asking polkit, answers the edge-agent user: "yes" or "no"."""
    out = screen.run(*as_user("edge-agent", "edge-agent", "busctl", "call",
                              "org.freedesktop.login1", "/org/freedesktop/login1",
                              "org.freedesktop.login1.Manager", "CanPowerOff")).stdout
    return out.strip().removeprefix("s ").strip('"')


def as_agent_systemctl(screen, *argv: str):
    return screen.run(*as_user("edge-agent", "edge-agent", "systemctl", "--no-ask-password",
                               *argv), check=False)


def screen_events(site, kind):
    return [e for e in site.server.device(site.device_id).get("events", [])
            if e.get("type") == kind]


@step(test_enrolls_and_pairs_under_systemd)
def test_the_player_is_watched_and_restarted_through_polkit_only_while_allowed(site):
    """A player unit killed is told (player.crashed) and restarted by the recovery
    ladder as the edge-agent user, through polkit's grant for that one unit and verb;
    restart-player answers with the unit read back active; another unit, another verb,
    and the same unit once the configuration no longer allows it are refused by polkit.
    poweroff's grant follows [commands] allow as reboot's does."""
    s = site.screen
    s.path(f"/etc/systemd/system/{PLAYER}").write_text(
        "[Unit]\nDescription=a kiosk player's stand-in\n"
        "[Service]\nExecStart=/bin/sleep infinity\nRestart=no\n")
    s.path("/etc/systemd/system/other.service").write_text(
        "[Service]\nExecStart=/bin/sleep infinity\n")
    s.run("systemctl", "daemon-reload")
    s.run("systemctl", "start", PLAYER, "other.service")
    conf = s.path(CONF)
    before = conf.read_text()
    conf.write_text(with_allow(before, ["diagnostics", "logs", "restart-player", "poweroff"])
                    + f'[screen]\nplayer_unit = "{PLAYER}"\nrecovery = true\n'
                      'recovery_wait_s = 5\npicture_every_s = 0\n')
    try:
        s.run("systemctl", "restart", UNIT)
        wait_online(s)
        assert s.run("head", "-n1", PLAYER_GRANT).stdout.strip() == PLAYER
        assert exists(s, POWEROFF_GRANT) and can_power_off(s) == "yes"
        assert as_agent_systemctl(s, "restart", PLAYER).returncode == 0
        for verb, unit in (("restart", "other.service"), ("stop", PLAYER),
                           ("restart", UNIT)):
            r = as_agent_systemctl(s, verb, unit)
            # polkit's own answer for what the rule leaves alone: an administrator's password
            assert r.returncode != 0 and REFUSED.search(r.stderr), (verb, unit, r)
        r = command(site, "restart-player")
        assert r["ok"] and "restarted" in r["output"], r
        # killed, and no Restart= of its own: the ladder restarts it (a look every 10 s,
        # acted on once the player has been down for 30 s)
        s.run("systemctl", "kill", "--signal=KILL", PLAYER)
        crashed = wait_for(lambda: screen_events(site, "player.crashed"), 30,
                           what="player.crashed")
        assert crashed[0]["unit"] == PLAYER and crashed[0]["result"] == "signal", crashed
        rung = wait_for(lambda: screen_events(site, "screen.recovery"), 90,
                        what="the ladder's restart")
        assert rung[0]["rung"] == "restart-player" and rung[0]["ok"] is True, rung
        wait_for(lambda: s.show(PLAYER, "ActiveState")["ActiveState"] == "active", 20,
                 what="the player active again")
        restarted = wait_for(lambda: [e for e in screen_events(site, "player.restarted")
                                      if e.get("by") == "the agent"], 30,
                             what="player.restarted by the agent")
        assert restarted, restarted
        player = status(s)[1]["screen"]["player"]
        assert player["unit"] == PLAYER and player["active"] is True, player
        # the operator takes it back: the grants follow at the next start
        conf.write_text(before)
        s.run("systemctl", "restart", UNIT)
        wait_online(s)
        assert not exists(s, PLAYER_GRANT) and not exists(s, POWEROFF_GRANT)
        r = as_agent_systemctl(s, "restart", PLAYER)
        assert r.returncode != 0 and REFUSED.search(r.stderr), r
        assert can_power_off(s) == "no"
    finally:
        conf.write_text(before)
        s.run("systemctl", "stop", PLAYER, "other.service", check=False)
        s.run("rm", "-f", f"/etc/systemd/system/{PLAYER}", "/etc/systemd/system/other.service")
        s.run("systemctl", "daemon-reload")
        s.run("systemctl", "restart", UNIT)
        wait_online(s)


@step(test_enrolls_and_pairs_under_systemd)
def test_what_polkit_cannot_see_of_a_granted_restart(site):
    """polkit's rule for the player's grant sees the unit and the verb systemd passes it
    (org.freedesktop.systemd1.manage-units: "unit", "verb"), never the job mode. The
    agent's user, granted a restart of the player, asking with every other mode:
    what systemd itself refuses, and what the mode does that polkit cannot see (flush
    cancels every other job queued: here a unit's start waiting on a slow one)."""
    s = site.screen
    # restarted eight times in a row: no start limit of its own to meet
    units = {PLAYER: "[Unit]\nStartLimitIntervalSec=0\n[Service]\nExecStart=/bin/sleep infinity\n",
             "slow.service": "[Service]\nType=oneshot\nExecStart=/bin/sleep 60\n",
             "queued.service": "[Unit]\nAfter=slow.service\n[Service]\nExecStart=/bin/sleep infinity\n"}
    for name, text in units.items():
        s.path(f"/etc/systemd/system/{name}").write_text(text)
    s.run("systemctl", "daemon-reload")
    s.run("systemctl", "start", PLAYER)
    conf = s.path(CONF)
    before = conf.read_text()
    conf.write_text(with_allow(before, ["diagnostics", "logs", "restart-player"])
                    + f'[screen]\nplayer_unit = "{PLAYER}"\npicture_every_s = 0\n')
    said = {}
    try:
        s.run("systemctl", "restart", UNIT)
        wait_online(s)
        assert s.run("head", "-n1", PLAYER_GRANT).stdout.strip() == PLAYER
        s.run("systemctl", "start", "--no-block", "slow.service", "queued.service")

        def jobs() -> str:
            return s.run("systemctl", "list-jobs", "--no-legend", "--no-pager").stdout
        wait_for(lambda: "queued.service" in jobs(), 10, what="queued.service's job waiting")
        for mode in ("isolate", "triggering", "restart-dependencies", "fail",
                     "ignore-dependencies", "ignore-requirements", "replace-irreversibly",
                     "flush"):
            r = as_agent_systemctl(s, "restart", f"--job-mode={mode}", PLAYER)
            said[mode] = (r.returncode, r.stderr.strip().splitlines()[:2])
            if mode == "flush":
                said["jobs after flush"] = jobs()
                said["slow after flush"] = s.show("slow.service", "ActiveState")
        print(json.dumps(said, indent=1))
        # the modes systemd refuses for a restart whoever asks
        for mode in ("isolate", "triggering", "restart-dependencies"):
            assert said[mode][0] != 0 and not REFUSED.search(" ".join(said[mode][1])), said
        # the ones polkit lets through as "restart" of the granted unit
        for mode in ("fail", "ignore-dependencies", "ignore-requirements",
                     "replace-irreversibly", "flush"):
            assert said[mode][0] == 0, (mode, said)
        # what flush does that polkit cannot see: another unit's queued start, cancelled
        assert "queued.service" not in said["jobs after flush"], said
        assert s.show("queued.service", "ActiveState")["ActiveState"] == "inactive"
        # and a unit other than the granted one, in any mode, is refused by polkit
        r = as_agent_systemctl(s, "restart", "--job-mode=flush", "slow.service")
        assert r.returncode != 0 and REFUSED.search(r.stderr), r
    finally:
        conf.write_text(before)
        s.run("systemctl", "stop", PLAYER, "slow.service", "queued.service", check=False)
        s.run("rm", "-f", *(f"/etc/systemd/system/{n}" for n in units))
        s.run("systemctl", "daemon-reload")
        s.run("systemctl", "restart", UNIT)
        wait_online(s)


# -- the operator's tools under the sandbox ----------------------------------------------
TIME_GRANTS = {"set-time": "/run/edge-agent-grants/set-time",
               "set-timezone": "/run/edge-agent-grants/set-timezone"}


@step(test_enrolls_and_pairs_under_systemd)
def test_a_service_restart_is_no_reboot_and_a_players_clean_stop_is_no_crash(site):
    """`systemctl restart edge-agent`, and a stop then a start, are the same boot (the
    kernel's boot id against the mark the last start kept where a stop does not remove
    it): ScreenTinker 1.9 files a cold start as "Device restarted (power/reboot)". The player's unit stopped by
    the operator is player.stopped; killed, it is player.crashed."""
    s = site.screen
    cursor = s.cursor()
    s.path(f"/etc/systemd/system/{PLAYER}").write_text(
        "[Unit]\nDescription=a kiosk player's stand-in\n"
        "[Service]\nExecStart=/bin/sleep infinity\nRestart=no\n")
    s.run("systemctl", "daemon-reload")
    s.run("systemctl", "start", PLAYER)
    conf = s.path(CONF)
    before = conf.read_text()
    conf.write_text(before + f'[screen]\nplayer_unit = "{PLAYER}"\npicture_every_s = 0\n')
    try:
        s.run("systemctl", "restart", UNIT)
        wait_online(s)
        # and a stop then a start (an operator's, a package upgrade's prerm and postinst):
        # systemd removes the runtime directory at the stop
        s.run("systemctl", "stop", UNIT)
        assert not exists(s, "/run/edge-agent")
        s.run("systemctl", "start", UNIT)
        wait_online(s)
        starts = [e["MESSAGE"] for e in agent_lines(s, cursor)
                  if e["MESSAGE"].startswith(f"edge-agent {V} starting")]
        assert len(starts) == 2 and all(m.endswith("started again in this boot")
                                        for m in starts), starts
        seen = {k: len(screen_events(site, k)) for k in ("player.stopped", "player.crashed")}
        time.sleep(12)   # the player read once at least (every 10 s) while it runs
        s.run("systemctl", "stop", PLAYER)
        wait_for(lambda: len(screen_events(site, "player.stopped")) > seen["player.stopped"],
                 30, what="player.stopped")
        s.run("systemctl", "start", PLAYER)
        time.sleep(12)
        assert len(screen_events(site, "player.crashed")) == seen["player.crashed"]
        s.run("systemctl", "kill", "--signal=KILL", PLAYER)
        crashed = wait_for(lambda: screen_events(site, "player.crashed")[seen["player.crashed"]:],
                           30, what="player.crashed")
        assert crashed[0]["result"] == "signal", crashed
    finally:
        conf.write_text(before)
        s.run("systemctl", "stop", PLAYER, check=False)
        s.run("rm", "-f", f"/etc/systemd/system/{PLAYER}")
        s.run("systemctl", "daemon-reload")
        s.run("systemctl", "restart", UNIT)
        wait_online(s)


# -- the operator's tools under the sandbox ----------------------------------------------
TIME_GRANTS = {"set-time": "/run/edge-agent-grants/set-time",
               "set-timezone": "/run/edge-agent-grants/set-timezone"}


def polkit_allows(screen, action: str) -> bool:
    """What polkit answers the edge-agent user asking for ``action`` itself (pkcheck on
    its own process: no agent, so nothing it may answer for itself)."""
    return screen.run(*as_user("edge-agent", "edge-agent", "sh", "-c",
                               f"exec pkcheck --action-id {action} --process $$"),
                      check=False).returncode == 0


def time_zone(screen) -> str:
    return screen.run("timedatectl", "show", "-p", "Timezone", "--value").stdout.strip()


@step(test_enrolls_and_pairs_under_systemd)
def test_polkit_grants_the_clock_and_zone_only_while_allowed_and_the_shell_stays_in_the_sandbox(site):
    """set-timezone reaches timedated from inside the unit's sandbox through polkit's
    grant, only while [commands] allow lists it; set-time's grant follows it the same
    way (never exercised: the container shares the host's clock); the shell line runs
    as the edge-agent user, in a read-only system."""
    s = site.screen
    assert s.run("test", "-f", "/usr/share/zoneinfo/Asia/Tokyo", check=False).returncode == 0, \
        "no tzdata in the root filesystem (TIME_STAND_IN)"
    zone_before = time_zone(s)
    conf = s.path(CONF)
    before = conf.read_text()
    assert not polkit_allows(s, "org.freedesktop.timedate1.set-timezone")
    assert not polkit_allows(s, "org.freedesktop.timedate1.set-time")
    # what polkit's own defaults answer before any grant
    others = {a: polkit_allows(s, a) for a in ("org.freedesktop.timedate1.set-ntp",
                                               "org.freedesktop.timedate1.set-local-rtc")}
    conf.write_text(with_allow(before, ["diagnostics", "logs", "shell", "set-time",
                                        "set-timezone"]))
    try:
        s.run("systemctl", "restart", UNIT)
        wait_online(s)
        for flag in TIME_GRANTS.values():
            assert s.run("stat", "-c", "%a %U:%G %F", flag).stdout.strip() == \
                "644 root:root regular file"
        assert polkit_allows(s, "org.freedesktop.timedate1.set-timezone")
        assert polkit_allows(s, "org.freedesktop.timedate1.set-time")
        # timedated's own policy says set-time implies set-ntp (and set-timezone): polkit
        # answers yes to it by the implication, which no rule can take back; the RTC's
        # mode, nothing implies: polkit's own answer stays (docs/security.md)
        assert {a: polkit_allows(s, a) for a in others} == {
            **others, "org.freedesktop.timedate1.set-ntp": True}

        r = command(site, "set-timezone", {"zone": "Asia/Tokyo"})
        assert r["ok"] and r["output"] == "time zone set to Asia/Tokyo", r
        assert time_zone(s) == "Asia/Tokyo"
        r = command(site, "set-timezone", {"zone": "Europe/Nowhere"})
        assert not r["ok"] and r["error"].startswith("no such time zone here"), r

        r = command(site, "shell", {"cmd": "id -un; touch /etc/edge-agent-was-here; "
                                           "sleep 60 & echo $!"})
        lines = r["output"].splitlines()
        assert lines[0] == "edge-agent" and "Read-only file system" in lines[1], r
        assert r["exit"] == 0 and r["ok"], r
        assert s.run("test", "-e", "/etc/edge-agent-was-here", check=False).returncode != 0
        sleeper = lines[-1]
        # killed with its group before the result went; systemd, the container's init,
        # reaps the orphan within moments
        wait_for(lambda: s.run("test", "-d", f"/proc/{sleeper}", check=False).returncode != 0,
                 5, interval=0.1, what="the background sleep gone with its line")
        said = text(unit_lines(s))
        assert "shell line from the fleet: 'id -un; touch /etc/edge-agent-was-here; " in said

        # the operator takes them back: the grants follow at the next start
        conf.write_text(before)
        s.run("systemctl", "restart", UNIT)
        wait_online(s)
        assert not any(exists(s, flag) for flag in TIME_GRANTS.values())
        assert not polkit_allows(s, "org.freedesktop.timedate1.set-timezone")
        assert not polkit_allows(s, "org.freedesktop.timedate1.set-time")
        r = s.run(*as_user("edge-agent", "edge-agent", "timedatectl", "--no-ask-password",
                           "set-timezone", "Europe/Berlin"), check=False)
        assert r.returncode != 0 and "Access denied" in r.stderr, r
        assert time_zone(s) == "Asia/Tokyo"
        r = command(site, "set-timezone", {"zone": "Europe/Berlin"})
        assert not r["ok"] and "'set-timezone' is not allowed on this screen" in r["error"], r
    finally:
        conf.write_text(before)
        s.run("timedatectl", "set-timezone", zone_before, check=False)
        s.run("systemctl", "restart", UNIT)
        wait_online(s)


NETWORK_GRANT = "/run/edge-agent-grants/network-heal"
HEAL_GW, HEAL_ME = "10.77.0.1", "10.77.0.2"


def network_events(site) -> list:
    return [(e.get("rung"), e.get("outcome"), e.get("cause"))
            for e in screen_events(site, "network.healing")]


@step(test_enrolls_and_pairs_under_systemd)
def test_the_network_is_bounced_through_networkd_and_polkit_from_the_units_sandbox(site):
    """[device] heal_network (#53) under real systemd, networkd and polkit. Off: no flag,
    and polkit refuses the agent's user networkd's reconfigure and its restart. On:
    systemd-networkd manages eh0 (a veth in the test's namespace, its peer a gateway in
    a namespace of the test's), the gateway stops answering ARP and the server's port is
    dropped: the agent, in its sandbox, tells gateway-silent, bounces eh0 with
    `networkctl reconfigure` through polkit (networkd does it: the interface configured
    again), restarts networkd through systemd, and, no reboot allowed, says the ladder
    is exhausted; the link back, healed. The fleet hears each once the link is back.
    Another verb, another unit stay refused."""
    s = site.screen
    conf = s.path(CONF)
    before = conf.read_text()
    assert not exists(s, NETWORK_GRANT)
    assert not polkit_allows(s, "org.freedesktop.network1.reconfigure")
    r = as_agent_systemctl(s, "restart", "systemd-networkd.service")
    assert r.returncode != 0 and REFUSED.search(r.stderr), r
    gw = f"edgehealgw{os.getpid()}"
    subprocess.run(["ip", "netns", "add", gw], check=True, timeout=20)
    try:
        for argv in (["ip", "link", "add", "eh0", "type", "veth", "peer", "name", "gw0",
                      "netns", gw],
                     ["ip", "netns", "exec", gw, "ip", "addr", "add", f"{HEAL_GW}/24",
                      "dev", "gw0"],
                     ["ip", "netns", "exec", gw, "ip", "link", "set", "gw0", "up"]):
            subprocess.run(argv, check=True, timeout=20)
        s.path("/etc/systemd/network").mkdir(parents=True, exist_ok=True)
        s.path("/etc/systemd/network/50-eh0.network").write_text(
            f"[Match]\nName=eh0\n[Network]\nAddress={HEAL_ME}/24\nGateway={HEAL_GW}\n")
        s.run("systemctl", "start", "systemd-networkd.service")
        wait_for(lambda: "configured" in s.run("networkctl", "list", "--no-legend", "eh0",
                                               check=False).stdout, 30,
                 what="networkd to configure eh0")
        conf.write_text(before + "[watchdog]\nrequire_link = false\n"
                        "[device]\nheal_network = true\nheal_probe_s = 2\n"
                        "heal_confirm_s = 10\nheal_wait_s = 30\n")
        s.run("systemctl", "restart", UNIT)
        wait_online(s)
        assert s.run("stat", "-c", "%a %U:%G %F", NETWORK_GRANT).stdout.strip() == \
            "644 root:root regular file"
        assert polkit_allows(s, "org.freedesktop.network1.reconfigure")
        # the flag names the manager found: another manager's restart, ifupdown's unit of
        # the very interface, are refused (systemd asks polkit before it looks for the unit)
        assert s.run("head", "-n1", NETWORK_GRANT).stdout.strip() == "systemd-networkd"
        for verb, unit in (("stop", "systemd-networkd.service"), ("restart", "ssh.service"),
                           ("start", "systemd-networkd.service"),
                           ("restart", "NetworkManager.service"),
                           ("restart", "networking.service"), ("restart", "ifup@eh0.service")):
            r = as_agent_systemctl(s, verb, unit)
            assert r.returncode != 0 and REFUSED.search(r.stderr), (verb, unit, r)
        network = status(s)[1]["network"]
        assert (network["state"], network["manager"]) == ("watching", None), network
        cursor = s.cursor()
        subprocess.run(["ip", "netns", "exec", gw, "nft", "-f", "-"], check=True, text=True,
                       timeout=20, input="add table arp edgetest\nadd chain arp edgetest in "
                       "{ type filter hook input priority 0; policy drop; }\n")
        subprocess.run(["ip", "neigh", "flush", "dev", "eh0"], check=True, timeout=20)
        site.ns.drop_port(site.server.port)
        began = time.monotonic()
        try:
            network = wait_for(lambda: (status(s)[1].get("network") or {}).get("state")
                               == "exhausted" and status(s)[1]["network"], 150,
                               interval=1.0, what="bounce, restart, exhausted")
        except AssertionError as e:
            raise AssertionError(f"{e}: {status(s)[1].get('network')}\n"
                                 f"{text(agent_lines(s, cursor))[-3000:]}") from None
        finally:
            site.ns.restore()
        took = time.monotonic() - began
        said = text(agent_lines(s, cursor))
        assert "eh0 bounced through systemd-networkd" in said, said
        assert "systemd-networkd.service restarted" in said, said
        assert network["cause"] == "gateway-silent" and network["manager"] == \
            "systemd-networkd", network
        wait_online(s, 30)
        # and healed: the link proven live again ends the episode
        events = wait_for(lambda: len(network_events(site)) >= 4 and network_events(site),
                          30, what="network.healing at the fleet")
        assert events == [("bounce", "done", "gateway-silent"),
                          ("restart-manager", "done", "gateway-silent"),
                          (None, "exhausted", "gateway-silent"),
                          (None, "healed", "gateway-silent")], events
        print(f"[{site.release}] bounced, restarted and exhausted in {took:.0f}s")
        journal = [e for e in agent_lines(s, cursor)
                   if e.get("MESSAGE_ID") == MessageId.NETWORK_HEALING]
        assert journal and all(e.get("CAUSE") == "gateway-silent" for e in journal), journal
        conf.write_text(before)
        s.run("systemctl", "restart", UNIT)
        wait_online(s)
        assert not exists(s, NETWORK_GRANT)
        assert not polkit_allows(s, "org.freedesktop.network1.reconfigure")
    finally:
        site.ns.restore()
        conf.write_text(before)
        s.run("systemctl", "stop", "systemd-networkd.service", "systemd-networkd.socket",
              check=False)
        s.run("rm", "-f", "/etc/systemd/network/50-eh0.network", check=False)
        subprocess.run(["ip", "link", "del", "eh0"], timeout=20, capture_output=True)
        subprocess.run(["ip", "netns", "del", gw], timeout=20, capture_output=True)
        s.run("systemctl", "restart", UNIT)
        wait_online(s)


@step(test_enrolls_and_pairs_under_systemd,
      test_working_hours_reach_an_x_display_through_the_sandbox_only_with_the_readmes_drop_in)
def test_the_picture_is_captured_and_judged_under_the_sandbox_with_the_readmes_drop_in(site):
    """The picture check in the unit's sandbox: xwd on the X server the drop-in opens,
    Pillow in the agent. A black
    root is black (told once), a lit one ok; nothing the check does is refused by the
    sandbox (system calls, memory that is written and run)."""
    s = site.screen
    s.run("systemd-run", "--unit=x-picture", "--uid=nobody", "Xvfb", ":0", "-nolisten", "tcp",
          "-nolisten", "local", "-noreset", "-screen", "0", "640x360x24")
    wait_for(lambda: s.run("xset", "-display", ":0", "q", check=False).returncode == 0, 15,
             what="the X server in the container")
    s.run("xsetroot", "-display", ":0", "-solid", "black")
    conf = s.path(CONF)
    before = conf.read_text()
    conf.write_text(before + '[screen]\nx_display = ":0"\npicture_every_s = 1\n')
    s.path(X11_DROP_IN).write_text("[Service]\nBindPaths=/tmp/.X11-unix\n")
    try:
        s.run("systemctl", "daemon-reload")
        s.run("systemctl", "restart", UNIT)
        wait_online(s)
        black = wait_for(lambda: screen_events(site, "screen.black"), 30, what="screen.black")
        assert black[-1]["captured_by"].startswith("xwd"), black
        s.path("/root/lit.xbm").write_text(
            "#define t_width 8\n#define t_height 8\n"
            "static unsigned char t_bits[] = {\n   0x0f, 0x0f, 0x0f, 0x0f, 0, 0, 0, 0};\n")
        s.run("xsetroot", "-display", ":0", "-bitmap", "/root/lit.xbm", "-fg", "white",
              "-bg", "black")
        wait_for(lambda: screen_events(site, "screen.ok"), 30, what="screen.ok")
        picture = status(s)[1]["screen"]["picture"]
        assert picture["verdict"] == "ok" and not picture["failures"], picture
        assert "picture check" not in text(e for e in agent_lines(s)
                                           if int(e.get("PRIORITY", 6)) <= 3)
    finally:
        s.run("rm", "-f", X11_DROP_IN, "/root/lit.xbm")
        s.run("systemctl", "daemon-reload")
        s.run("systemctl", "stop", "x-picture", check=False)
        conf.write_text(before)
        s.run("systemctl", "restart", UNIT)
        wait_online(s)



# Raspberry Pi OS's own desktop: a wlroots compositor run by the desktop's user (pi, uid
# 1000) in its runtime directory, /run/user/1000, its own and 0700. docs/operate.md's
# recipe: the unit binds a directory of it, edge-agent (0700, the desktop user's: a
# drop-in of user-runtime-dir@1000 makes it, as that user, with the runtime directory;
# every process of the unit needs the bind's source, its ExecCondition= first), read-only
# into its own runtime directory, and the
# desktop's autostart links the compositor's socket into it and grants edge-agent that
# directory's x and the socket's rw (ACLs); the runtime directory itself gets none
DESKTOP_DROP_IN = "/etc/systemd/system/edge-agent.service.d/desktop.conf"
RUNTIME_DIR_DROP_IN = "/etc/systemd/system/user-runtime-dir@1000.service.d/edge-agent.conf"
RUNTIME_DIR_HOOK = ("[Service]\nExecStartPost=/usr/bin/setpriv --reuid=1000 --regid=1000 "
                    "--clear-groups /usr/bin/mkdir -p -m 0700 /run/user/1000/edge-agent\n")
# trixie's labwc, as Raspberry Pi OS runs it (its autostart runs the grant); bookworm's
# sway 1.7 (an exec line in its configuration does)
COMPOSITOR = {"trixie": ["labwc"], "bookworm": ["sway", "-c", "/home/pi/.config/sway/config"]}


def blank_cursor() -> bytes:
    """An Xcursor file of one transparent pixel: a signage desktop's hidden pointer. A
    headless output has no cursor plane, so labwc draws its pointer into the picture,
    and a pointer on black is a bright detail (not black), as it would be on a screen."""
    image = struct.pack("<9I", 36, 0xFFFD0002, 1, 1, 1, 1, 0, 0, 0) + struct.pack("<I", 0)
    return (b"Xcur" + struct.pack("<3I", 16, 0x10000, 1)
            + struct.pack("<3I", 0xFFFD0002, 1, 28) + image)


def desktop_drop_in(socket: str) -> str:
    return ("[Unit]\nWants=user-runtime-dir@1000.service\nAfter=user-runtime-dir@1000.service\n"
            "[Service]\nBindReadOnlyPaths=/run/user/1000/edge-agent:/run/edge-agent/desktop\n"
            f"Environment=XDG_RUNTIME_DIR=/run/edge-agent/desktop WAYLAND_DISPLAY={socket}\n")


def as_desktop(*argv: str) -> list[str]:
    """A program of the desktop's session: pi's, with the compositor's variables."""
    return ["systemd-run", "--uid=pi", "--gid=pi", "-E", "XDG_RUNTIME_DIR=/run/user/1000",
            "-E", "HOME=/home/pi", *argv]


@step(test_enrolls_and_pairs_under_systemd,
      test_the_picture_is_captured_and_judged_under_the_sandbox_with_the_readmes_drop_in)
def test_the_desktops_wayland_is_reached_under_the_sandbox_with_the_drop_in_and_the_grant(
        site):
    """The agent in its unit reaches the desktop user's compositor (labwc on trixie, sway
    1.7 on bookworm, headless), in a runtime directory another user owns, 0700: with
    the drop-in alone grim is refused; with the desktop's grant (its autostart, run again
    at each start of the compositor) the picture is captured and judged (black, then a
    starfield: ok), and again after the compositor restarts (a new socket, linked again).
    The desktop's other sockets are not the agent's: a 0666 one beside the compositor's
    (PipeWire's pipewire-0) is not in the agent's view, and the runtime directory has no
    ACL. The display turned off and on by the fleet's display command is read back by
    wlr-randr: on trixie confirmed off then on; on bookworm sway 1.7 refuses the off (the
    command fails) and cannot say whether its headless output is on."""
    s, release = site.screen, site.release
    from tests.test_picture_content import starfield
    from tests.test_wayland import CONNECT as probe, DESKTOP_GRANT
    if s.run("id", "pi", check=False).returncode != 0:
        s.run("useradd", "-m", "-u", "1000", "-U", "pi")
    home = s.path("/home/pi")
    for d in (".config", ".config/labwc", ".config/sway"):
        (home / d).mkdir(exist_ok=True)
    (home / ".config/sway/config").write_text("")      # nothing but the headless output
    starfield().save(home / "stars.png")
    (home / ".icons/blank/cursors").mkdir(parents=True, exist_ok=True)
    for name in ("default", "left_ptr"):
        (home / ".icons/blank/cursors" / name).write_bytes(blank_cursor())
    s.run("chown", "-R", "pi:pi", "/home/pi")
    desktop_env = ["-E", "WLR_BACKENDS=headless", "-E", "WLR_LIBINPUT_NO_DEVICES=1",
                   "-E", "WLR_RENDERER=pixman", "-E", "XCURSOR_THEME=blank"]

    def start_desktop():
        # the session needs its runtime directory, as user@1000.service does at a login
        # (user-runtime-dir@ stops when no unit needs it)
        s.run(*as_desktop("--unit=desktop", "-p", "Requires=user-runtime-dir@1000.service",
                          "-p", "After=user-runtime-dir@1000.service", *desktop_env,
                          *COMPOSITOR[release]))
        return wait_for(lambda: [name for name in s.run("ls", "/run/user/1000").stdout.split()
                                 if name.startswith("wayland-") and "." not in name], 20,
                        interval=0.2, what="the compositor's socket")[0]   # /run: not on disk

    def show(*swaybg):
        s.run("systemctl", "stop", "desktop-bg", check=False)
        s.run(*as_desktop("--unit=desktop-bg", "-E", f"WAYLAND_DISPLAY={socket}", "swaybg",
                          *swaybg))

    s.path(RUNTIME_DIR_DROP_IN).parent.mkdir(exist_ok=True)
    s.path(RUNTIME_DIR_DROP_IN).write_text(RUNTIME_DIR_HOOK)
    s.run("systemctl", "daemon-reload")
    s.run("systemctl", "stop", "user-runtime-dir@1000.service")    # made again with the hook
    socket = start_desktop()
    made = s.run("stat", "-c", "%a %U", "/run/user/1000/edge-agent").stdout.split()
    assert made == ["700", "pi"], made
    show("-c", "#000000")
    conf = s.path(CONF)
    before = conf.read_text()
    commands = ('display_on_command = "wlr-randr --output HEADLESS-1 --on"\n'
                'display_off_command = "wlr-randr --output HEADLESS-1 --off"\n')
    body = with_allow(before, ["display"])
    body = body.replace("[commands]\n", "[commands]\n" + commands, 1)
    conf.write_text(body + "[screen]\npicture_every_s = 1\nsettle_s = 3\n")
    s.path(DESKTOP_DROP_IN).write_text(desktop_drop_in(socket))
    try:
        s.run("systemctl", "daemon-reload")
        s.run("systemctl", "restart", UNIT)
        wait_online(s)
        refused = wait_for(lambda: status(s)[1]["screen"]["picture"]["failure"], 20,
                           what="the capture refused without the grant")
        assert refused.startswith("grim exited 1") and "failed to create display" in refused
        # the desktop's autostart grants it; the compositor restarted: a new socket in
        # the same directory, reached without restarting the agent
        if release == "trixie":
            (home / ".config/labwc/autostart").write_text(DESKTOP_GRANT)
        else:
            (home / ".config/sway/config").write_text(
                "exec sh -c '" + DESKTOP_GRANT.replace("\n", "; ").replace("'", "") + "'\n")
        linked = f"/run/user/1000/edge-agent/{socket}"

        def restart_desktop():
            s.run("systemctl", "stop", "desktop-bg", "desktop")
            assert start_desktop() == socket
            inode = s.run("stat", "-c", "%i", f"/run/user/1000/{socket}").stdout
            wait_for(lambda: s.run("stat", "-c", "%i", linked, check=False).stdout == inode
                     and "user:edge-agent:rw" in s.run("getfacl", "-p", linked).stdout,
                     15, what="the new socket linked and granted")

        def told(kind):     # this test's: the X11 one's events are on the server too
            return [e for e in screen_events(site, kind) if e.get("captured_by") == "grim"]

        def judged():       # black, then a starfield: each told once more
            black, ok = len(told("screen.black")), len(told("screen.ok"))
            show("-c", "#000000")
            wait_for(lambda: len(told("screen.black")) > black, 30, what="screen.black by grim")
            show("-i", "/home/pi/stars.png", "-m", "stretch")
            wait_for(lambda: len(told("screen.ok")) > ok, 30, what="screen.ok by grim")
            picture = status(s)[1]["screen"]["picture"]
            assert picture["verdict"] == "ok" and picture["failure"] is None, picture

        restart_desktop()
        judged()
        restart_desktop()   # a new socket: the autostart links it again, the agent reaches it
        judged()
        # the desktop's other sockets: a 0666 one beside the compositor's, as PipeWire's
        s.run(*as_desktop("--unit=pipewire", "python3", "-c",
                          "import os, socket, time\n"
                          "s = socket.socket(socket.AF_UNIX); s.bind('/run/user/1000/pipewire-0')\n"
                          "os.chmod('/run/user/1000/pipewire-0', 0o666); s.listen(4); time.sleep(600)\n"))
        wait_for(lambda: s.run(*as_user("pi", "pi", "python3", "-c", probe,
                                        "/run/user/1000/pipewire-0")).stdout.strip()
                 == "connected", 10, what="the desktop's 0666 socket listening")
        in_unit = ["nsenter", "-t", str(main_pid(s)), "-m", "--",
                   *as_user("edge-agent", "edge-agent", "python3", "-c", probe)]
        assert s.run(*in_unit, f"/run/edge-agent/desktop/{socket}").stdout.strip() == "connected"
        assert s.run(*in_unit, "/run/edge-agent/desktop/pipewire-0").stdout.strip() == "ENOENT"
        assert s.run(*in_unit, "/run/user/1000/pipewire-0").stdout.strip() in ("ENOENT", "EACCES")
        assert "edge-agent" not in s.run("getfacl", "-p", "/run/user/1000").stdout
        # the display turned off and on by the fleet, read back by wlr-randr
        off = command(site, "display", {"state": "off"})
        on = command(site, "display", {"state": "on"})
        if release == "trixie":
            assert off["ok"] and off["confirmed"] and off["confirmed_by"] == ["Wayland"], off
            assert off["read"] == "Wayland: HEADLESS-1 disabled", off
            assert on["ok"] and on["confirmed"] and on["read"] == "Wayland: HEADLESS-1 enabled", on
        else:
            assert not off["ok"] and "wlr-randr exited 1" in off["error"], off
            assert on["ok"] and not on["confirmed"] and "cannot tell" in on["output"], on
        assert "picture check" not in text(e for e in agent_lines(s)
                                           if int(e.get("PRIORITY", 6)) <= 3)
    finally:
        s.run("rm", "-f", DESKTOP_DROP_IN, RUNTIME_DIR_DROP_IN)
        s.run("systemctl", "daemon-reload")
        s.run("systemctl", "stop", "desktop-bg", "desktop", "pipewire", check=False)
        conf.write_text(before)
        s.run("systemctl", "restart", UNIT)
        wait_online(s)


# -- the fleet updates the screen --------------------------------------------------------
KEYS_DIR = "/etc/edge-agent/update-keys"
UPDATE_UNIT = "edge-agent-update.service"
UPDATE_GRANT = "/run/edge-agent-grants/update"
PROOF_S = 15


def releases(site) -> dict:
    """The releases an operator would sign: N+1, a broken N+2 (never proves its link),
    and one whose postinst hangs (to cut the power in the middle of dpkg)."""
    if not site.releases:
        work = site.work / "releases"
        work.mkdir(exist_ok=True)
        r = {"key": SigningKey(work / "key"), "stranger": SigningKey(work / "stranger", "stranger"),
             "good": reversioned(site.debs[1], f"{V}-3", work),
             "broken": reversioned(site.debs[1], f"{V}-4", work, never_proves=True),
             "hangs": reversioned(site.debs[1], f"{V}-5", work,
                                  postinst_first='[ "$1" = configure ] && sleep 600'),
             "later": reversioned(site.debs[1], f"{V}-6", work)}
        for name in ("good", "broken", "hangs", "later"):
            r[f"{name}.sig"] = r["key"].sign(r[name])
        site.releases = r
    return site.releases


def fleet_update(site, deb: Path, sig: Path, *extra: str, wait: int = 180):
    """What the operator types: scripts/fleet-server update. (exit code, result, seconds)"""
    t0 = time.monotonic()
    r = subprocess.run([str(REPO / "scripts" / "fleet-server"), "update", site.device_id,
                        str(deb), "--signature", str(sig), "--url", site.server.url,
                        "--wait", str(wait), *extra], capture_output=True, text=True,
                       timeout=wait + 60, env={**os.environ, "EDGE_AGENT_PYTHON": sys.executable})
    took = time.monotonic() - t0
    try:
        result = json.loads(r.stdout)
    except ValueError:
        result = {"stderr": r.stderr}
    return r.returncode, result, took


def package_version(screen) -> str:
    return screen.run("dpkg-query", "-W", "-f=${Version} ${db:Status-Abbrev}", "edge-agent",
                      check=False).stdout.strip()


def update_lines(screen) -> str:
    return text(e for e in screen.journal() if e.get("_SYSTEMD_UNIT") == UPDATE_UNIT)


@step(test_enrolls_and_pairs_under_systemd, test_upgrade_keeps_identity_credentials_and_queue_and_restarts)
def test_a_first_update_that_never_proves_its_link_goes_back_to_the_version_apt_installed(site):
    s = site.screen
    rel = releases(site)
    s.path(f"{KEYS_DIR}/release.gpg").write_bytes(rel["key"].keyring.read_bytes())
    write_config(s, site.server)
    conf = s.path(CONF)
    conf.write_text(conf.read_text() + '[commands]\nallow = ["diagnostics", "logs", "update"]\n'
                    f'[update]\nproof_timeout_s = {PROOF_S}\n')
    configured = conf.read_text()
    s.run("systemctl", "restart", UNIT)
    wait_online(s)
    assert exists(s, UPDATE_GRANT)
    assert package_version(s) == f"{V}-2 ii"

    rc, result, took = fleet_update(site, rel["broken"], rel["broken.sig"])
    assert rc == 2 and result["error"].startswith(f"rolled back from {V}-4 to {V}-2"), result
    print(f"\n[{site.release}] fleet-server update (a release that never proves its link) -> "
          f"rolled back to the version apt installed: {took:.1f}s ({result['error']})")
    # apt kept no copy of {V}-2: the way back was rebuilt from dpkg's record, with the
    # configuration file as the package shipped it, so the operator's file is still theirs
    assert "rebuilt from dpkg's record" in update_lines(s)
    assert package_version(s) == f"{V}-2 ii"
    assert conf.read_text() == configured
    doc = wait_online(s)
    assert doc["update"]["last"]["outcome"] == "rolled-back", doc["update"]
    # the same version again, not asked explicitly: refused at once, nothing installed
    rc, result, took = fleet_update(site, rel["broken"], rel["broken.sig"])
    assert rc == 2 and "was rolled back here" in result["error"], result
    assert package_version(s) == f"{V}-2 ii"


@step(test_a_first_update_that_never_proves_its_link_goes_back_to_the_version_apt_installed)
def test_the_fleet_updates_the_screen_and_the_version_is_kept_once_its_link_is_proven(site):
    s = site.screen
    rel = releases(site)
    configured = s.path(CONF).read_text()
    rc, result, took = fleet_update(site, rel["good"], rel["good.sig"])
    assert rc == 0 and result["ok"], result
    assert result["output"].startswith(f"updated from {V}-2 to {V}-3"), result
    print(f"\n[{site.release}] fleet-server update -> committed {V}-3: {took:.1f}s")
    assert package_version(s) == f"{V}-3 ii"
    # a rollback to a rebuilt package and an update after it kept the operator's file
    assert s.path(CONF).read_text() == configured
    doc = wait_online(s)
    assert doc["update"]["installed"] == f"{V}-3"
    assert doc["update"]["last"]["outcome"] == "committed", doc["update"]
    said = s.run("edge-agent", "status").stdout
    assert f"last committed {V}-2 -> {V}-3" in said, said
    # the committed version's own package is what the next rollback reinstalls
    kept = s.run("dpkg-deb", "-f", "/var/lib/edge-agent-update/installed.deb", "Version").stdout
    assert kept.strip() == f"{V}-3"
    # the agent is still the unprivileged user in its sandbox
    assert s.run("stat", "-c", "%U", f"/proc/{main_pid(s)}").stdout.strip() == "edge-agent"
    assert not s.run("ls", "-A", f"{STATE}/update").stdout.strip(), "staged files left"


@step(test_the_fleet_updates_the_screen_and_the_version_is_kept_once_its_link_is_proven)
def test_a_broken_release_asked_for_again_is_rolled_back_to_the_committed_one(site):
    s = site.screen
    rel = releases(site)
    rc, result, took = fleet_update(site, rel["broken"], rel["broken.sig"], "--retry")
    assert rc == 2 and result["error"].startswith(f"rolled back from {V}-4 to {V}-3"), result
    print(f"\n[{site.release}] fleet-server update --retry (never proves its link) -> rolled "
          f"back to {V}-3: {took:.1f}s ({result['error']})")
    assert took < PROOF_S + 30
    assert package_version(s) == f"{V}-3 ii"
    wait_online(s)


@step(test_the_fleet_updates_the_screen_and_the_version_is_kept_once_its_link_is_proven)
def test_a_package_not_signed_by_an_installed_key_or_not_the_ordered_one_is_refused(site):
    s, server = site.screen, site.server
    rel = releases(site)
    before = s.show(UNIT, "MainPID")["MainPID"]
    # signed, but older than what is installed: whoever holds the server cannot bring
    # back an old release
    older_deb = Path(shutil.copy(site.debs[1], site.work / "releases"))
    rc, result, _ = fleet_update(site, older_deb, rel["key"].sign(older_deb))
    assert rc == 2 and f"older than the installed {V}-3" in result["error"], result
    # signed, but by a key the screen does not have
    stranger_sig = rel["stranger"].sign(rel["hangs"])
    rc, result, _ = fleet_update(site, rel["hangs"], stranger_sig)
    assert rc == 2 and "signed by a key that is not installed" in result["error"], result
    rel["key"].sign(rel["hangs"])   # the good signature back beside it
    # the server's checksum is not the package's
    published = json.loads(urllib_post(server.url + "/api/v1/releases", rel["hangs"].read_bytes()))
    args = {"version": f"{V}-5", "url": published["url"], "size": published["size"],
            "sha256": "0" * 64, "signature": base64.b64encode(rel["hangs.sig"].read_bytes()).decode()}
    result = command(site, "update", args, timeout=60)
    assert not result["ok"] and "SHA-256 is not the order's" in result["error"], result
    # an agent that does not check (taken over) stages a package whose bytes are not
    # the signed ones and starts the installer, as polkit lets it: root checks again
    tampered = bytearray(rel["hangs"].read_bytes())
    tampered[len(tampered) // 2] ^= 0xFF
    order = {"id": "planted", **args, "sha256": hashlib.sha256(tampered).hexdigest(),
             "size": len(tampered), "window_s": 0, "retry": False}
    stage = f"{STATE}/update"
    s.path(stage).mkdir(exist_ok=True)
    s.path(f"{stage}/package.deb").write_bytes(bytes(tampered))
    s.path(f"{stage}/package.sig").write_bytes(rel["hangs.sig"].read_bytes())
    s.path(f"{stage}/order.json").write_text(json.dumps(order))
    s.run("chown", "-R", "edge-agent:edge-agent", stage)
    r = s.run(*as_user("edge-agent", "edge-agent", "systemctl", "start", "--no-ask-password",
                       UPDATE_UNIT), check=False)
    assert r.returncode == 0, r.stderr
    history = wait_for(lambda: [h for h in json.loads(s.path(
        "/var/lib/edge-agent-update/history.json").read_text()) if h["id"] == "planted"],
        30, interval=0.2, what="the root side's verdict on the planted package")
    assert history[0]["outcome"] == "refused" and "bad signature" in history[0]["reason"], history
    assert package_version(s) == f"{V}-3 ii"
    assert s.show(UNIT, "MainPID")["MainPID"] == before, "the agent was restarted"
    s.run("rm", "-rf", stage)
    # polkit gives the edge-agent user that one start and nothing else
    for argv in (("restart", UPDATE_UNIT), ("stop", UPDATE_UNIT), ("start", "systemd-hostnamed.service"),
                 ("restart", UNIT)):
        r = s.run(*as_user("edge-agent", "edge-agent", "systemctl", "--no-ask-password", *argv),
                  check=False)
        # polkit's default for what the rule leaves alone: an administrator's password,
        # which no one is there to type
        assert r.returncode != 0 and ("Access denied" in r.stderr or
                                      "Interactive authentication required" in r.stderr), (argv, r)


def urllib_post(url: str, data: bytes) -> bytes:
    import urllib.request
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read()


@step(test_the_fleet_updates_the_screen_and_the_version_is_kept_once_its_link_is_proven)
def test_a_power_cut_in_the_middle_of_dpkg_boots_into_a_working_version(site):
    s = site.screen
    rel = releases(site)
    done = {}
    cli = threading.Thread(target=lambda: done.update(r=fleet_update(site, rel["hangs"],
                                                                    rel["hangs.sig"], wait=240)))
    cli.start()
    # the new package unpacked, its postinst hanging: dpkg is in the middle of it
    wait_for(lambda: package_version(s) == f"{V}-5 iF", 60, interval=0.2,
             what=f"dpkg configuring {V}-5")
    s.power_cut()
    # the boot finishes what was cut: the install is undone
    wait_for(lambda: package_version(s) == f"{V}-3 ii", 90, interval=0.5,
             what=f"{V}-3 installed again at boot")
    wait_online(s, 60)
    cli.join(240)
    rc, result, took = done["r"]
    assert rc == 2 and result["error"].startswith(f"rolled back from {V}-5 to {V}-3"), result
    assert "interrupted while installing" in result["error"], result
    print(f"\n[{site.release}] power cut during dpkg -> back on {V}-3, reported: {took:.1f}s")


@step(test_a_power_cut_in_the_middle_of_dpkg_boots_into_a_working_version)
def test_a_power_cut_before_the_proof_gives_the_new_version_its_proof_time_again(site):
    s, server = site.screen, site.server
    rel = releases(site)
    # the connected agent stays; a new connection is held: {V}-6 cannot prove its link
    server.admin("/admin/behaviour", {"connect_delay_s": 600})
    done = {}
    cli = threading.Thread(target=lambda: done.update(r=fleet_update(site, rel["later"],
                                                                    rel["later.sig"], wait=240)))
    cli.start()
    transaction = s.path("/var/lib/edge-agent-update/transaction.json")

    def proving():
        try:
            return json.loads(transaction.read_text()).get("phase") == "proving"
        except (OSError, ValueError):
            return False
    wait_for(proving, 60, interval=0.1, what=f"{V}-6 installed, waiting for its proof")
    assert package_version(s) == f"{V}-6 ii"
    s.power_cut()
    # the boot resumes the proof; the server lets the new connection in
    server.admin("/admin/behaviour", {"connect_delay_s": 0})
    cli.join(240)
    rc, result, took = done["r"]
    assert rc == 0 and result["output"].startswith(f"updated from {V}-3 to {V}-6"), result
    assert package_version(s) == f"{V}-6 ii"
    doc = wait_online(s)
    assert doc["update"]["last"]["outcome"] == "committed", doc["update"]
    print(f"\n[{site.release}] power cut before the proof -> {V}-6 proven after the boot, "
          f"committed: {took:.1f}s from the command")


def assert_purge_leaves_nothing(site) -> None:
    """`apt purge edge-agent`: nothing the package made is left, but its system user."""
    s = site.screen
    apt(s, "purge", "edge-agent")
    assert s.show(UNIT, "LoadState")["LoadState"] == "not-found"
    survivors = s.run("find", "/proc", "-maxdepth", "1", "-user", "edge-agent").stdout
    assert not survivors.strip(), f"an agent survived: {survivors}"
    for gone in ("/run/edge-agent", os.path.dirname(GRANT), LOGS_SOCKET, "/etc/edge-agent"):
        assert not exists(s, gone), gone
    # the test's own files (the drop-in, the packages it copied in, the operator's
    # repository and its sources entry), and the system's records of an install
    ours = (f"/etc/systemd/system/{UNIT}.d", "/root/edge-agent_", APT_REPO, APT_KEYRING,
            APT_SOURCE,
            # the Wayland step's desktop user, as Raspberry Pi OS makes it (pi, uid 1000)
            "/home/pi", "/var/mail/pi", "/var/spool/mail/pi")
    records = ("/var/lib/dpkg/", "/var/cache/apt/", "/var/cache/debconf/", "/var/log/",
               "/var/lib/apt/", "/etc/passwd", "/etc/group", "/etc/shadow",
               "/etc/gshadow", "/etc/subuid", "/etc/subgid", "/etc/.pwd.lock",
               "/var/tmp/systemd-private-",  # the second boot's, of systemd's own services
               "/var/cache/man/",  # man-db's index, which its trigger keeps for every man page
               "/var/backups/")  # dpkg's daily copy of its database (dpkg-db-backup.timer)
    left = sorted(p for p in files(s) - site.files_before_install
                  if not p.startswith(ours + records))
    assert not left, left
    # Debian policy: a system user may own files left elsewhere, so it stays
    assert s.run("getent", "passwd", "edge-agent", check=False).returncode == 0


@step(test_fresh_install_waits_for_its_configuration_instead_of_failing)
def test_purge_removes_what_the_package_created(site):
    assert_purge_leaves_nothing(site)


# -- the operator's APT repository (scripts/release) --------------------------------------
APT_REPO = "/srv/edge-agent-apt"                  # on the screen, served as file:
APT_KEYRING = "/etc/apt/keyrings/edge-agent.gpg"
APT_SOURCE = "/etc/apt/sources.list.d/edge-agent.list"
# `apt-get update` of that source alone: the screen has no Debian mirror to reach (its
# Debian lists stay as they are)
ONLY_ITS_SOURCE = ("-o", f"Dir::Etc::sourcelist={APT_SOURCE}", "-o", "Dir::Etc::sourceparts=-",
                   "-o", "APT::Get::List-Cleanup=0")
# values 0.1.0 took that today's bounds do not (1 s, 0.5 s, 0.1 s): used at the bound, said
AT_EARLIER_BOUNDS = [("stable_after_s = 30", "stable_after_s = 0.5"),
                     ("connect_timeout_s = 2", "connect_timeout_s = 0.4"),
                     ("base_s = 0.5", "base_s = 0.05")]
ADJUSTED = ("link.stable_after_s = 0.5 is under what this release takes: using 1",
            "server.connect_timeout_s = 0.4 is under what this release takes: using 0.5",
            "link.backoff.base_s = 0.05 is under what this release takes: using 0.1")


def publish(site, deb: Path) -> tuple[Path, Path]:
    """``deb`` published as the operator does it, with scripts/release, into the site's
    repository signed by the release key (the one the self-update tests put in
    update-keys), and the repository copied to APT_REPO on the screen: (the package in
    the pool, its detached signature)."""
    key = releases(site)["key"]
    repo = site.work / "apt-repo"
    r = subprocess.run([str(REPO / "scripts" / "release"), "--gnupghome", str(key.home),
                        "--deb", str(deb), str(repo), "release@edge-agent.invalid"],
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    pooled, sig = (Path(p) for p in r.stdout.split())
    inside = site.screen.path(APT_REPO)
    shutil.rmtree(inside, ignore_errors=True)
    shutil.copytree(repo, inside, ignore=shutil.ignore_patterns("conf", "db"))
    return pooled, sig


def point_at_the_repository(site) -> None:
    """What the operator's image does once: the repository's key, and its entry naming
    that key alone as the one to trust for it."""
    s = site.screen
    s.path(os.path.dirname(APT_KEYRING)).mkdir(parents=True, exist_ok=True)
    shutil.copy(site.work / "apt-repo" / "edge-agent-archive-keyring.gpg", s.path(APT_KEYRING))
    s.path(APT_SOURCE).write_text(f"deb [signed-by={APT_KEYRING}] file:{APT_REPO} stable main\n")
    s.run("chmod", "0644", APT_KEYRING, APT_SOURCE)


def queue_two_uploads(site) -> None:
    """Two uploads the server refuses for now: queued across what follows."""
    s, server = site.screen, site.server
    server.admin("/admin/behaviour", {"upload_mode": "500"})
    tried = len(server.device(site.device_id).get("upload_requests", []))
    for i in range(2):
        s.run(*as_user("edge-agent", "edge-agent", "edge-agent", "enqueue", "--kind", "log", "-"),
              input=f"log line {i}\n")
    wait_for(lambda: len(server.device(site.device_id).get("upload_requests", [])) >= tried + 2,
             15, interval=0.2, what="uploads tried and refused")


def deliver_the_queue(site, stored_before: int) -> None:
    site.server.admin("/admin/behaviour", {"upload_mode": "ok"})
    wait_for(lambda: site.server.device(site.device_id).get("uploads", 0) == stored_before + 2,
             30, interval=0.2, what="the queued uploads delivered after the upgrade")


def kept_state(screen) -> dict:
    """What an upgrade must keep byte for byte: identity, credentials, the operator's file."""
    return {p: screen.path(p).read_bytes()
            for p in (f"{STATE}/device_id", f"{STATE}/credentials.json", CONF)}


def ledger_entries(screen) -> dict:
    """The command ledger, read as this release's agent reads it."""
    return ledger.load(str(screen.path(f"{STATE}/commands.json")), time.time()).entries


def assert_adjusted_and_said(site, cursor: str) -> None:
    """The values 0.1.0 took, used at today's bounds: said once at the start (warning),
    in `edge-agent status`, and to the fleet."""
    s = site.screen
    said = wait_for(lambda: [e for e in agent_lines(s, cursor) if "configuration: " in
                             e["MESSAGE"] and "earlier release took" in e["MESSAGE"]] or None,
                    10, interval=0.2, what="the adjustments in the journal")
    assert {e["PRIORITY"] for e in said} == {"4"}, said
    for line in ADJUSTED:
        assert any(line in e["MESSAGE"] for e in said), (line, text(said))
    shown = s.run("edge-agent", "status").stdout
    assert "adjusted: " in shown and all(line in shown for line in ADJUSTED), shown
    events = wait_for(lambda: [e for e in site.server.device(site.device_id).get("events", [])
                               if e.get("type") == "config.adjusted"] or None, 20, interval=0.2,
                      what="config.adjusted at the server")
    assert {e.get("key") for e in events} >= {"link.stable_after_s", "server.connect_timeout_s",
                                              "link.backoff.base_s"}, events


@step(test_purge_removes_what_the_package_created)
def test_a_screen_installed_from_the_field_release_upgrades_unattended_and_keeps_its_edits(site):
    """The screen as operators have it: 0.1.0-1 as the landed state built it (its
    agent.toml a conffile, edited, as every screen's is), installed from the fleet's own
    APT repository (scripts/release: signed, its key the entry's signed-by), with values
    0.1.0 took that today's bounds do not, paired, uploads queued and a command in its
    ledger. The next release published there, and `apt-get upgrade` as an unattended
    upgrade runs it: no question, the edits kept byte for byte, the same device and
    credentials (no new pairing), the queue and the ledger kept, the values adjusted and
    said, the new version online, dpkg content."""
    s, server = site.screen, site.server
    publish(site, built_at(FIELD_RELEASE))
    point_at_the_repository(site)
    apt(s, "update", *ONLY_ITS_SOURCE)
    apt(s, "install", "edge-agent")
    assert package_version(s) == "0.1.0-1 ii"
    assert s.run("dpkg-query", "-W", "-f=${Conffiles}", "edge-agent").stdout.split()[:1] == [CONF]
    # the operator's edit: the url, the link's keys, values 0.1.0 took, a comment
    write_config(s, server, replace=AT_EARLIER_BOUNDS)
    conf = s.path(CONF)
    conf.write_text(conf.read_text() + '[log]\nlevel = "info"   # edited on this screen\n')
    s.run("systemctl", "restart", UNIT)
    code = wait_for(lambda: s.run("cat", "/run/edge-agent/pairing-code", check=False).stdout.strip(),
                    20, interval=0.2, what="the field release's pairing code")
    assert server.pair(code).returncode == 0
    site.device_id = wait_online(s)["device_id"]
    assert command(site, "diagnostics")["ok"]
    entries = ledger_entries(s)
    assert entries and all(e.state == "done" for e in entries.values()), entries
    queue_two_uploads(site)
    stored_before = server.device(site.device_id).get("uploads", 0)
    kept = kept_state(s)
    before = s.show(UNIT, "InvocationID")["InvocationID"]
    cursor = s.cursor()
    boots_before = len(screen_events(site, "device.boot"))   # earlier tests' on this screen

    deb, _ = publish(site, next_release(site))
    t0 = time.monotonic()
    apt(s, "update", *ONLY_ITS_SOURCE)
    out = apt(s, "upgrade", expected=LEFT_ALIASED_DIRS)
    took = time.monotonic() - t0
    assert f"Setting up edge-agent ({V}-2)" in out, out
    # The field release's units were under /lib/systemd/system, the next release's are
    # in /usr/lib/systemd/system: on merged /usr the same files, moved within one
    # package, which dpkg keeps (it does not remove an old path that is a new file).
    # Under trixie no other package lists /lib/systemd/system any more, so dpkg tries
    # to remove the old directories and says it cannot: they are /usr/lib's, full. It
    # leaves them, as it must; bookworm's systemd still lists them, so dpkg says nothing.
    left = LEFT_ALIASED_DIRS.findall(out)
    print(f"\n[{site.release}] dpkg on the move out of /lib/systemd/system: "
          f"{left or 'nothing'}")
    assert bool(left) == (site.release == "trixie"), out
    for unit in (UNIT, "edge-agent-logs.socket", "edge-agent-logs@.service", UPDATE_UNIT):
        assert s.path(f"/usr/lib/systemd/system/{unit}").is_file(), f"{unit} was lost"
    assert s.show(UNIT, "LoadState", "UnitFileState", "NeedDaemonReload") == {
        "LoadState": "loaded", "UnitFileState": "enabled", "NeedDaemonReload": "no"}
    wait_for(lambda: s.show(UNIT, "InvocationID")["InvocationID"] != before, 20, interval=0.2,
             what="the agent restarted by the upgrade")
    t1 = time.monotonic()
    doc = wait_online(s)
    online_s = time.monotonic() - t1
    assert "update" in doc, "the status is the field release's, not the new version's"
    assert doc["device_id"] == site.device_id and doc["uploads"]["items"] == 2, doc
    # the upgrade's restart is no boot: 0.1.0 left no boot mark, its status file says it
    # ran in this boot (a boot read here would be a power loss: there is no stop mark)
    assert (doc.get("device") or {}).get("last_boot") is None, doc.get("device")
    assert len(screen_events(site, "device.boot")) == boots_before, \
        "the upgrade was told as a boot"
    assert kept_state(s) == kept, "device id, credentials or the operator's file changed"
    assert not [e for e in agent_lines(s, cursor) if "pairing code" in e["MESSAGE"]], \
        "paired again"
    assert ledger_entries(s).keys() == entries.keys()
    assert s.run("stat", "-c", "%a %U:%G", CONF).stdout.strip() == "640 root:edge-agent"
    # dpkg keeps the file it no longer ships where it is, as an obsolete conffile
    # (removed on purge), and asks nothing about it
    assert s.run("dpkg-query", "-W", "-f=${Conffiles}", "edge-agent").stdout.split()[::2] == \
        [CONF, "obsolete"]
    assert_adjusted_and_said(site, cursor)
    assert_dpkg_content(s)
    assert_new_defaults_under_the_operators(s, stable_after_s="1.0")
    deliver_the_queue(site, stored_before)
    print(f"\n[{site.release}] 0.1.0-1 ({FIELD_RELEASE}, agent.toml a conffile, edited, values "
          f"at 0.1.0's bounds) from the repository -> {V}-2 by apt-get upgrade, unattended: "
          f"no question, edits, identity, queue and ledger kept, values adjusted and said; "
          f"apt took {took:.1f}s, online {online_s:.1f}s after the restart")


@step(test_a_screen_installed_from_the_field_release_upgrades_unattended_and_keeps_its_edits)
def test_the_fleet_updates_that_screen_to_the_repositorys_signed_package_and_purge_leaves_nothing(
        site):
    """The same screen, now on the repository's release, taking fleet settings and
    updates: the next release published with scripts/release, and the very package and
    signature it put in the pool named in `fleet-server update`. Committed, with the
    identity, the queue, the ledger, the settings revision and the operator's file kept,
    the adjusted values still said; apt then finds nothing newer; purge leaves nothing."""
    s, server = site.screen, site.server
    # the repository's key is the release key: the same one signs the update order's package
    s.path(f"{KEYS_DIR}/release.gpg").write_bytes(
        (site.work / "apt-repo" / "edge-agent-archive-keyring.gpg").read_bytes())
    conf = s.path(CONF)
    conf.write_text(conf.read_text() + '[commands]\nallow = ["diagnostics", "logs", "update", '
                    f'"configure"]\n[update]\nproof_timeout_s = {PROOF_S}\n')
    s.run("systemctl", "restart", UNIT)
    wait_online(s)
    pid = main_pid(s)
    r = command(site, "configure", {"revision": 3, "settings": {"log.level": "debug"}})
    assert r["ok"], r
    wait_for(lambda: main_pid(s) not in (0, pid), 30, what="systemd starting the agent again")
    wait_for(lambda: status(s)[1].get("settings", {}).get("state") == "kept", 30,
             what="the fleet's revision kept")
    queue_two_uploads(site)
    stored_before = server.device(site.device_id).get("uploads", 0)
    entries = ledger_entries(s)
    kept = kept_state(s)
    cursor = s.cursor()

    deb, sig = publish(site, releases(site)["good"])
    # apt sees the newer release before the fleet orders it: the screen says it is behind
    # (read by the sandboxed agent from apt's lists at its start)
    apt(s, "update", *ONLY_ITS_SOURCE)
    s.run("systemctl", "restart", UNIT)
    repository = wait_online(s)["update"]["repository"]
    assert repository["newest"] == f"{V}-3" and repository["behind"] is True, repository
    assert f"apt offers {V}-3 (newer: not installed yet)" in s.run("edge-agent", "status",
                                                                    check=False).stdout
    rc, result, took = fleet_update(site, deb, sig)
    assert rc == 0 and result["output"].startswith(f"updated from {V}-2 to {V}-3"), result
    assert package_version(s) == f"{V}-3 ii"
    doc = wait_online(s)
    assert doc["update"]["last"]["outcome"] == "committed", doc["update"]
    assert doc["device_id"] == site.device_id and doc["uploads"]["items"] == 2, doc
    assert doc["settings"]["revision"] == 3 and doc["settings"]["state"] == "kept", doc["settings"]
    assert doc["settings"]["origins"]["log.level"] == "fleet", doc["settings"]
    assert kept_state(s) == kept, "device id, credentials or the operator's file changed"
    after = ledger_entries(s)   # the configure and diagnostics kept, and the update order
    assert entries.keys() < after.keys() and len(after) == len(entries) + 1, (entries, after)
    assert all(after[k].state == e.state for k, e in entries.items()), (entries, after)
    assert not [e for e in agent_lines(s, cursor) if "pairing code" in e["MESSAGE"]], \
        "paired again"
    assert_adjusted_and_said(site, cursor)
    # the package the fleet installed is the repository's: apt has nothing to add
    apt(s, "update", *ONLY_ITS_SOURCE)
    policy = s.run("apt-cache", "policy", "edge-agent").stdout
    assert f"Installed: {V}-3" in policy and f"Candidate: {V}-3" in policy, policy
    deliver_the_queue(site, stored_before)
    print(f"\n[{site.release}] fleet-server update with the repository's signed package -> "
          f"committed {V}-3, everything kept: {took:.1f}s")
    assert_purge_leaves_nothing(site)


@step()
def test_power_off_leaves_nothing_behind(site, rootfs):
    s = site.screen
    root = s.root
    s.poweroff()
    assert not s.leftovers(), s.leftovers()
    assert str(root) not in Path("/proc/mounts").read_text()
    assert not root.exists()
    assert not (rootfs / "etc" / "edge-agent").exists(), "the cached rootfs was written to"
