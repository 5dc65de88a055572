"""polkit's flag for reboot follows [commands] allow: agent/programs/grants.py, as the unit's
root-side ExecStartPre/ExecStopPost run it (a real process, as root, under the unit's
UMask=0077), on real directories, with links planted by a real unprivileged user.
What polkit makes of the flag is proven under real systemd and polkitd
(tests/test_booted_systemd.py)."""
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agent.programs import grants
from agent.config import overlay as overlay_file

REPO = Path(__file__).resolve().parent.parent
USER, GROUP = "nobody", "nogroup"
CONFIG = '[server]\nurl = "http://127.0.0.1:9"\n[commands]\nallow = {allow}\n'


@pytest.fixture
def ground():
    """A root-owned base (0755) with a directory of the unprivileged user's in it."""
    if os.geteuid() != 0:
        pytest.fail("these tests run the grant step as root, as systemd does: they need root")
    base = Path(tempfile.mkdtemp(prefix="edge-agent-grants-", dir="/var/tmp"))
    base.chmod(0o755)
    theirs = base / "theirs"
    theirs.mkdir(mode=0o755)
    shutil.chown(theirs, USER, GROUP)
    yield base, theirs
    shutil.rmtree(base)


def as_user(*cmd):
    subprocess.run(list(cmd), check=True, user=USER, group=GROUP, extra_groups=[], timeout=30)


def step(base: Path, *args, allow='["diagnostics", "logs"]', config_text=None):
    """`python3 -m agent.programs.grants`, as root, with the unit's umask."""
    cfg = base / "agent.toml"
    cfg.write_text(config_text if config_text is not None else CONFIG.format(allow=allow))
    return subprocess.run([sys.executable, "-m", "agent.programs.grants", "--config", str(cfg),
                           "--dir", str(base / "grants"),
                           "--watchdog-dir", str(base / "system.conf.d"), *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO, umask=0o077,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def listing(d: Path) -> dict:
    return {p.name: (stat.S_IMODE(p.lstat().st_mode), p.lstat().st_uid) for p in d.iterdir()}


def test_only_a_configuration_that_allows_reboot_gets_the_flag(ground):
    base, _ = ground
    grants_dir = base / "grants"
    r = step(base)
    assert r.returncode == 0 and not r.stdout and not r.stderr, r
    assert not grants_dir.exists(), "a configuration without reboot made the directory"

    r = step(base, allow='["diagnostics", "logs", "reboot"]')
    assert r.returncode == 0, r
    # root's file, 0644 in root's 0755 directory, though the unit's umask is 0077:
    # polkitd's own user runs the test on it
    assert stat.S_IMODE(grants_dir.stat().st_mode) == 0o755 and grants_dir.stat().st_uid == 0
    assert listing(grants_dir) == {"reboot": (0o644, 0)}
    assert "allow" in (grants_dir / "reboot").read_text()
    assert r.stdout == ("edge-agent: polkit grants this service reboot: [commands] allow in "
                        f"{base / 'agent.toml'} lists it\n"), r.stdout

    r = step(base, allow='["diagnostics", "logs", "reboot"]')  # a restart: nothing to say
    assert r.returncode == 0 and not r.stdout and listing(grants_dir) == {"reboot": (0o644, 0)}

    r = step(base)  # the operator took reboot out and restarted the agent
    assert r.returncode == 0 and not r.stdout, r
    assert listing(grants_dir) == {}


def test_a_stop_revokes_and_a_configuration_that_does_not_load_grants_nothing(ground):
    base, _ = ground
    grants_dir = base / "grants"
    assert step(base, allow='["reboot"]').returncode == 0
    r = step(base, "--revoke", allow='["reboot"]')   # ExecStopPost: the file is not read
    assert r.returncode == 0 and listing(grants_dir) == {}, r

    assert step(base, allow='["reboot"]').returncode == 0
    # a typo: the agent's own start reports it (exit 2, not restarted); the grant step
    # fails closed, says nothing, and does not fail the unit before the agent can say why
    r = step(base, config_text=CONFIG.format(allow='["reboot"]') + "[link]\nack_timeout_s = 99\n")
    assert r.returncode == 0 and not r.stdout and not r.stderr, r
    assert listing(grants_dir) == {}
    r = step(base, config_text="this is not toml = = =")
    assert r.returncode == 0 and listing(grants_dir) == {}


def test_root_never_writes_through_a_link_the_unprivileged_user_planted(ground):
    base, theirs = ground
    target = base / "roots-dir"
    target.mkdir(mode=0o755)
    as_user("ln", "-s", str(target), str(theirs / "grants"))
    with pytest.raises(grants.GrantError, match=re.escape(f"{theirs / 'grants'}: not a directory of ours")):
        grants.sync(frozenset({"reboot"}), str(theirs / "grants"))
    assert listing(target) == {}, "a grant was written through the planted link"


def test_a_directory_someone_else_made_is_refused(ground):
    base, theirs = ground
    as_user("mkdir", "-m", "755", str(theirs / "grants"))
    with pytest.raises(grants.GrantError, match=r"owned by uid \d+ with mode 755, not ours alone"):
        grants.sync(frozenset({"reboot"}), str(theirs / "grants"))
    assert listing(theirs / "grants") == {}
    # and the CLI says so in one line at priority err, and leaves the agent to run
    cfg = base / "agent.toml"
    cfg.write_text(CONFIG.format(allow='["reboot"]'))
    r = subprocess.run([sys.executable, "-m", "agent.programs.grants", "--config", str(cfg),
                        "--dir", str(theirs / "grants")], capture_output=True, text=True,
                       timeout=60, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 1, r
    assert r.stdout.startswith(f"edge-agent: grants: {theirs / 'grants'}: owned by uid"), r.stdout


def test_a_flag_that_is_a_link_is_replaced_not_written_through(ground):
    base, _ = ground
    grants_dir = base / "grants"
    grants_dir.mkdir(mode=0o755)
    precious = base / "precious"
    precious.write_text("root's own bytes\n")
    os.symlink(precious, grants_dir / "reboot")
    assert grants.sync(frozenset({"reboot"}), str(grants_dir)) == ["+reboot"]
    assert precious.read_text() == "root's own bytes\n"
    assert not (grants_dir / "reboot").is_symlink() and listing(grants_dir) == {"reboot": (0o644, 0)}
    # anything else in the directory is no grant of ours: it goes
    (grants_dir / "shutdown").write_text("")
    assert grants.sync(frozenset(), str(grants_dir)) == ["-reboot", "-shutdown"]
    assert listing(grants_dir) == {}


def test_the_polkit_rule_and_the_unit_name_the_flag_this_module_writes():
    rule = (REPO / "systemd" / "50-edge-agent.rules").read_text()
    assert f'"{grants.GRANTS_DIR}/" + name' in rule
    # each grant is asked for by name, and what it is not granted is refused
    for name in grants.GRANTABLE:
        assert f'edgeAgentGranted("{name}") ? polkit.Result.YES : polkit.Result.NO' in rule
    # and the player's restart, whose flag names the unit
    # and the network's healer's two: its bounce, its manager's restart
    # and the network's healer's three: its manager's bounce (networkd's or
    # NetworkManager's), its manager's restart; the flag names the manager
    assert rule.count("polkit.Result.YES") == len(grants.GRANTABLE) + 1 + 3
    assert f'"{grants.GRANTS_DIR}/{grants.NETWORK}"' in rule
    from agent.device.netprobe import MANAGER_UNITS   # the one list of the managers' units
    for manager, unit in MANAGER_UNITS.items():
        assert re.search(rf'"{manager}": "{re.escape(unit)}"', rule), manager
    assert f'"{grants.GRANTS_DIR}/{grants.PLAYER}"' in rule
    assert 'action.lookup("unit") == "edge-agent-update.service"' in rule
    unit = (REPO / "systemd" / "edge-agent.service").read_text()
    assert "ExecStartPre=-+/usr/bin/python3 -I -m agent.programs.grants --config /etc/edge-agent/agent.toml" in unit
    assert "ExecStopPost=-+/usr/bin/python3 -I -m agent.programs.grants --revoke" in unit
    assert grants.wanted(frozenset({"diagnostics", "logs"})) == frozenset()
    assert grants.wanted(frozenset({"logs", "reboot"})) == frozenset({"reboot"})
    assert grants.wanted(frozenset({"update"})) == frozenset({"update"})
    assert grants.wanted(frozenset({"poweroff", "volume"})) == frozenset({"poweroff"})
    # timedated's two actions, each by its own command; the shell needs no grant (it
    # runs as the agent's user, in its sandbox)
    assert grants.wanted(frozenset({"shell", "set-timezone"})) == frozenset({"set-timezone"})
    assert grants.wanted(frozenset({"set-time"})) == frozenset({"set-time"})
    assert 'action.id == "org.freedesktop.timedate1.set-time")' in rule
    assert 'action.id == "org.freedesktop.timedate1.set-timezone")' in rule


def test_root_runs_the_installed_module_not_one_planted_in_its_working_directory(ground):
    """The step runs as root in the unit's working directory, which an operator may set
    to the agent's own state directory (the booted-system test's drop-in does): with
    `-I`, as the unit runs it, Python does not look there for `agent`."""
    base, theirs = ground
    marker = base / "planted-code-ran"
    as_user("mkdir", str(theirs / "agent"))
    for name in ("__init__.py", "grants.py"):
        as_user("sh", "-c", 'printf "%s\\n" "$1" > "$2"', "sh",
                f"open({str(marker)!r}, 'w').close()", str(theirs / "agent" / name))
    cfg = base / "agent.toml"
    cfg.write_text(CONFIG.format(allow='["reboot"]'))
    argv = [a for a in _unit_command("ExecStartPre") if a != "/usr/bin/python3"]
    argv = [sys.executable, *argv[:argv.index("--config") + 1], str(cfg), "--dir", str(base / "grants")]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=theirs,
                       env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r
    assert not marker.exists(), "root ran code the agent's user planted"
    assert listing(base / "grants") == {"reboot": (0o644, 0)}


def _unit_command(directive: str) -> list[str]:
    unit = (REPO / "systemd" / "edge-agent.service").read_text()
    line = re.search(rf"^{directive}=[-+]*(.*)$", unit, re.M).group(1)
    return line.split()


def test_a_fleet_managed_allow_list_grants_only_where_the_file_lets_the_fleet_manage_it(ground):
    """The overlay the agent's user writes in its state directory is read by this root
    step: it grants reboot only where the operator's file says the fleet manages the
    list, and it says whose list it was."""
    base, theirs = ground
    overlay = overlay_file.Overlay(overlay_file.Revision(7, {"commands.allow": ["diagnostics", "reboot"]}))
    (theirs / overlay_file.FILE).write_text(json.dumps(overlay.to_dict()))
    shutil.chown(theirs / overlay_file.FILE, USER, GROUP)
    state = f'[identity]\nstate_dir = "{theirs}"\n'
    r = step(base, config_text=CONFIG.format(allow='["diagnostics"]') + state)
    assert r.returncode == 0 and not (base / "grants").exists(), r   # not the fleet's to set
    r = step(base, config_text=CONFIG.format(allow='["diagnostics"]') + state
             + "[fleet]\nmanage_commands_allow = true\n")
    assert listing(base / "grants") == {"reboot": (0o644, 0)}
    assert "the fleet's settings revision 7" in r.stdout, r.stdout
    assert "revision 7" in (base / "grants" / "reboot").read_text()


def test_the_fleet_cannot_turn_on_the_ladder_that_would_grant_a_restart(ground):
    """[screen] recovery lets root grant the player's restart: the operator's key
    alone. An overlay that sets it is no overlay root takes: no grant."""
    base, theirs = ground
    overlay = overlay_file.Overlay(overlay_file.Revision(8, {"screen.recovery": True}))
    (theirs / overlay_file.FILE).write_text(json.dumps(overlay.to_dict()))
    shutil.chown(theirs / overlay_file.FILE, USER, GROUP)
    r = step(base, config_text=CONFIG.format(allow='["diagnostics"]')
             + f'[identity]\nstate_dir = "{theirs}"\n[screen]\nplayer_unit = "kiosk.service"\n')
    assert r.returncode == 0 and not (base / "grants").exists(), r


# -- poweroff and the player's restart --------------------------------------------------
PLAYER_CONFIG = CONFIG + '[screen]\nplayer_unit = "kiosk.service"\nrecovery = {recovery}\n'


def test_poweroff_is_granted_as_reboot_is(ground):
    base, _ = ground
    r = step(base, allow='["poweroff"]')
    assert r.returncode == 0 and listing(base / "grants") == {"poweroff": (0o644, 0)}, r
    assert "poweroff: [commands] allow" in r.stdout


@pytest.mark.parametrize("allow, recovery, granted", [
    ('["diagnostics"]', "false", False),       # the unit set, nothing asks to restart it
    ('["restart-player"]', "false", True),     # the command
    ('["diagnostics"]', "true", True),         # the ladder
])
def test_the_player_grant_needs_the_unit_and_the_command_or_the_ladder(ground, allow,
                                                                      recovery, granted):
    base, _ = ground
    r = step(base, config_text=PLAYER_CONFIG.format(allow=allow, recovery=recovery))
    assert r.returncode == 0, r
    if not granted:
        assert not (base / "grants").exists() and not r.stdout
        return
    assert listing(base / "grants") == {"restart-player": (0o644, 0)}
    text = (base / "grants" / "restart-player").read_text()
    assert text.splitlines()[0] == "kiosk.service"
    assert all(" " in line for line in text.splitlines()[1:])   # no other line is a unit
    assert r.stdout == ("edge-agent: polkit grants this service a restart of kiosk.service: "
                        f"as {base / 'agent.toml'} configures it\n"), r.stdout
    # no unit, no grant, whatever else allows it
    r = step(base, config_text=CONFIG.format(allow='["restart-player"]')
             + "[screen]\nrecovery = true\n")
    assert r.returncode == 0 and listing(base / "grants") == {}


def test_another_player_unit_is_a_new_flag_and_the_agents_own_units_never_are(ground):
    base, _ = ground
    cfg = PLAYER_CONFIG.format(allow='["restart-player", "reboot"]', recovery="false")
    assert step(base, config_text=cfg).returncode == 0
    r = step(base, config_text=cfg.replace("kiosk.service", "cage@tty1.service"))
    assert r.returncode == 0 and "a restart of cage@tty1.service" in r.stdout, r
    assert (base / "grants" / "restart-player").read_text().splitlines()[0] == "cage@tty1.service"
    assert sorted(listing(base / "grants")) == ["reboot", "restart-player"]
    for own in ("edge-agent.service", "edge-agent-update.service"):
        r = step(base, config_text=cfg.replace("kiosk.service", own))
        assert r.returncode == 0 and sorted(listing(base / "grants")) == ["reboot"], r


NODE_POLKIT = r"""
// the rule under a stub of polkitd's JavaScript API: spawn runs the real program, as
// polkitd does, with the grants directory moved to the test's
const fs = require("fs"), child = require("child_process");
const [rules, dir, casesJson] = process.argv.slice(1);
let rule = null;
const polkit = {
  Result: {YES: "yes", NO: "no", NOT_HANDLED: "not_handled"},
  addRule(f) { rule = f; },
  spawn(argv) {
    argv = argv.map(a => a.startsWith("/run/edge-agent-grants/")
                    ? dir + a.slice("/run/edge-agent-grants".length) : a);
    return child.execFileSync(argv[0], argv.slice(1), {encoding: "utf8"});
  },
};
new Function("polkit", fs.readFileSync(rules, "utf8"))(polkit);
const out = JSON.parse(casesJson).map(c => rule(
  {id: c.id, lookup: k => (c.details[k] === null ? undefined : c.details[k])},
  {user: c.user}));
process.stdout.write(JSON.stringify(out));
"""
MANAGE = "org.freedesktop.systemd1.manage-units"


def polkit_answers(grants_dir: Path, cases: list) -> list:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is needed to run the polkit rule: .ci/run must install nodejs "
                    "(TEST_DEBS in scripts/_env.sh)")
    r = subprocess.run([node, "-e", NODE_POLKIT, "--", str(REPO / "systemd" / "50-edge-agent.rules"),
                        str(grants_dir), json.dumps(cases)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def restart(unit, verb="restart", user="edge-agent"):
    return {"id": MANAGE, "user": user, "details": {"unit": unit, "verb": verb}}


def test_polkit_lets_the_agent_restart_that_one_unit_and_nothing_else(ground):
    """The rule itself, run by a JavaScript engine on the flags this module writes: the
    agent chooses the unit it asks about, so every name it could pass is tried."""
    base, _ = ground
    grants_dir = base / "grants"
    assert step(base, config_text=PLAYER_CONFIG.format(
        allow='["reboot", "poweroff"]', recovery="true")).returncode == 0
    assert sorted(listing(grants_dir)) == ["poweroff", "reboot", "restart-player"]
    flag_lines = (grants_dir / "restart-player").read_text().splitlines()
    hostile = ["kiosk.service\n", "kiosk.service\nkiosk.service", "", None, 7, "kiosk",
               "../kiosk.service", "/run/edge-agent-grants/restart-player", "-kiosk.service",
               " kiosk.service", "kiosk.service ", "KIOSK.service", "kiosk.service#",
               "kiosk.servic", "kiosk.service.service", "other.service", "*.service",
               "edge-agent.service", "edge-agent-update.service", "x" * 200 + ".service",
               "kiosk@.service", *flag_lines[1:]]
    cases = [restart("kiosk.service"),
             *[restart(unit) for unit in hostile],
             *[restart("kiosk.service", verb) for verb in
               ("start", "stop", "reload", "try-restart", "reload-or-restart", "kill", "")],
             restart("kiosk.service", user="pi"),
             {"id": "org.freedesktop.login1.reboot", "user": "edge-agent", "details": {}},
             {"id": "org.freedesktop.login1.power-off", "user": "edge-agent", "details": {}},
             {"id": "org.freedesktop.login1.power-off-multiple-sessions", "user": "edge-agent",
              "details": {}},
             {"id": MANAGE, "user": "edge-agent",
              "details": {"unit": "edge-agent-update.service", "verb": "start"}}]
    answers = polkit_answers(grants_dir, cases)
    assert answers[0] == "yes"
    assert answers[1:len(hostile) + 1] == ["not_handled"] * len(hostile), list(zip(hostile, answers[1:]))
    rest = answers[len(hostile) + 1:]
    assert rest == ["not_handled"] * 7 + ["not_handled", "yes", "yes", "yes", "no"]

    # the configuration takes the restart away (no unit): the flag goes, polkit says no
    assert step(base, allow='["reboot"]').returncode == 0
    assert polkit_answers(grants_dir, [restart("kiosk.service"), cases[-2]]) == [
        "not_handled", "no"]


# -- node_exporter's link to the metrics ---------------------------------------------------
def test_node_exporters_link_exists_only_while_the_agent_writes_its_metrics(ground):
    """Debian's node_exporter reads every file of its textfile directory: a link there to
    a file no agent writes (metrics off, the agent stopped) is a scrape error on every
    screen. Root's start step makes it for an agent with metrics on and its stop step
    takes it away; a file of that name that is not the agent's link is left alone."""
    base, _ = ground
    reader = base / "node-exporter"
    reader.mkdir()
    link = reader / "edge-agent.prom"
    run = base / "run"
    metrics_on = CONFIG.format(allow='["diagnostics"]') + \
        f'[runtime]\ndir = "{run}"\n[metrics]\nenabled = true\n'
    on = ("--node-exporter-dir", str(reader), "--user", USER)
    r = step(base, *on)
    assert r.returncode == 0 and not os.path.lexists(link), r     # metrics off: none
    # no mount of root's there (systemd's mount unit did not run): no link
    (base / "run-metrics").mkdir()
    r = step(base, *on, config_text=metrics_on)
    assert r.returncode == 0 and not os.path.lexists(link) and "not a mount" in r.stdout, r
    mount_as_systemd(base / "run-metrics")
    r = step(base, *on, config_text=metrics_on)
    assert os.readlink(link) == f"{run}-metrics/edge-agent.prom", r
    assert "node_exporter reads the metrics" in r.stdout
    r = step(base, "--revoke", "--node-exporter-dir", str(reader), config_text=metrics_on)
    assert r.returncode == 0 and not os.path.lexists(link), r
    link.write_text("someone else's numbers\n")
    step(base, *on, config_text=metrics_on)
    step(base, "--revoke", "--node-exporter-dir", str(reader))
    assert link.read_text() == "someone else's numbers\n"
    subprocess.run(["umount", f"{run}-metrics"], capture_output=True, timeout=30)


MOUNT_UNIT = REPO / "systemd" / "run-edge\\x2dagent\\x2dmetrics.mount"


def mount_as_systemd(directory: Path) -> None:
    """What run-edge\\x2dagent\\x2dmetrics.mount does, at ``directory``."""
    options = re.search(r"^Options=(.*)$", MOUNT_UNIT.read_text(), re.M)[1]
    assert options == grants.METRICS_FS, "the unit mounts what the step checks"
    directory.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "edge-agent-metrics", str(directory)],
                   check=True, timeout=30)


HOSTILE = r"""
import os, sys
op, target, secret = sys.argv[1:4]
try:
    if op == "fifo":
        os.unlink(target); os.mkfifo(target)
    elif op == "link":
        os.unlink(target); os.symlink(secret, target)
    elif op == "dir":
        os.unlink(target); os.mkdir(target)
    elif op == "rename":
        os.rename(target, target + ".x")
    elif op == "beside":
        os.mkfifo(os.path.join(os.path.dirname(target), "other.prom"))
    elif op == "big":
        line = b"".join(b"big_%d 1\n" % i for i in range(20000))
        with open(target, "r+b") as f:
            n = 0
            try:
                while n < 64 << 20:
                    n += f.write(line); f.flush()
            finally:
                print(n)
    elif op == "chmod":
        os.chmod(target, 0)
    print("done")
except OSError as e:
    print(e.strerror)
"""


def hostile(op: str, target: str, secret: str) -> str:
    """What the agent's user (if it were taken over) manages at the link's target."""
    return subprocess.run(["/usr/bin/python3", "-c", HOSTILE, op, target, secret], user=USER,
                          group=GROUP, extra_groups=[], capture_output=True, text=True,
                          timeout=120).stdout.strip()


def test_nothing_the_agents_user_does_hangs_node_exporter_or_shows_it_a_root_file(ground, tmp_path):
    """The link root's start step makes in node_exporter's directory reaches a file the
    agent writes: the agent's user, taken over, cannot make it a FIFO (node_exporter's
    scrape, every collector's, would wait forever, a thread kept per scrape), a link to
    a file node_exporter may read and the agent may not, a directory, or larger than the
    tmpfs it lives on. A real node_exporter, as its own user, answers every scrape."""
    from devtools.prometheus import node_exporter, scrape
    base, _ = ground
    reader = base / "node-exporter"
    reader.mkdir()
    run = base / "run"
    run.mkdir(mode=0o755)
    agent_run = run / "edge-agent"     # the unit's RuntimeDirectory: the agent's own
    agent_run.mkdir(mode=0o755)
    shutil.chown(agent_run, USER, GROUP)
    secret = base / "secret.prom"   # root's and node_exporter's to read, not the agent's
    secret.write_text("root_only_secret 42\n")
    os.chmod(secret, 0o640)
    shutil.chown(secret, "root", "prometheus")
    config = CONFIG.format(allow='["diagnostics"]') + \
        f'[runtime]\ndir = "{agent_run}"\n[metrics]\nenabled = true\n'
    mount_as_systemd(run / "edge-agent-metrics")
    r = step(base, "--node-exporter-dir", str(reader), "--user", USER, config_text=config)
    assert r.returncode == 0 and "node_exporter reads the metrics" in r.stdout, r
    target = os.readlink(reader / "edge-agent.prom")
    assert target == f"{run}/edge-agent-metrics/edge-agent.prom"
    try:
        st = os.stat(target)
        assert stat.S_ISREG(st.st_mode) and st.st_uid == pwd.getpwnam(USER).pw_uid
        assert stat.S_IMODE(st.st_mode) == 0o644
        with node_exporter(reader, tmp_path / "node_exporter.log") as (ne, port):
            threads = ne.threads()
            rss = ne.rss_kib()
            for op in ("fifo", "link", "dir", "rename", "beside"):
                said = hostile(op, target, str(secret))
                t = time.monotonic()
                out = scrape(port, 5)
                took = time.monotonic() - t
                assert out is not None, f"{op}: {said}; node_exporter's scrape hung"
                assert said == "Permission denied", (op, said)
                assert "root_only_secret" not in out and took < 2, (op, took)
            # as large as it can make it: the tmpfs' size, read in a moment
            said = hostile("big", target, str(secret)).splitlines()
            assert said[-1] == "No space left on device", said
            assert int(said[0]) <= grants.METRICS_FS_BYTES
            for _ in range(3):
                t = time.monotonic()
                out = scrape(port, 5)
                assert out is not None and time.monotonic() - t < 2
            assert re.search(r"^node_textfile_scrape_error [01]$", out, re.M)   # read, whole
            assert ne.rss_kib() - rss < 64 << 10, "node_exporter's memory bounded"
            assert hostile("chmod", target, str(secret)) == "done"
            out = scrape(port, 5)
            assert out is not None and re.search(r"^node_textfile_scrape_error 1$", out, re.M)
            assert ne.threads() <= threads + 4, "no thread kept per scrape"
        # the agent's own writer, in place, as its user: read back
        os.chmod(target, 0o644)
        write = ("import sys; from agent.base.fsutil import write_in_place; "
                 "write_in_place(sys.argv[1], b'edge_agent_link_up 1\\n')")
        subprocess.run(["/usr/bin/python3", "-c", write, target], user=USER, group=GROUP,
                       extra_groups=[], check=True, timeout=60, cwd=REPO,
                       env={"PYTHONPATH": str(REPO)})
        assert open(target).read().startswith("edge_agent_link_up 1\n")
    finally:
        step(base, "--revoke", "--node-exporter-dir", str(reader))
        subprocess.run(["umount", f"{run}/edge-agent-metrics"], capture_output=True, timeout=30)
    assert not os.path.lexists(reader / "edge-agent.prom")


def test_an_operators_own_textfile_gets_no_tmpfs_over_its_directory_and_no_link(ground):
    base, _ = ground
    reader = base / "node-exporter"
    reader.mkdir()
    theirs = base / "textfiles"
    theirs.mkdir()
    (theirs / "other.prom").write_text("other 1\n")
    config = CONFIG.format(allow='["diagnostics"]') + \
        f'[metrics]\nenabled = true\ntextfile = "{theirs}/edge-agent.prom"\n'
    r = step(base, "--node-exporter-dir", str(reader), "--user", USER, config_text=config)
    assert r.returncode == 0 and "no link for node_exporter" in r.stdout, r
    assert not os.path.lexists(reader / "edge-agent.prom")
    assert os.listdir(theirs) == ["other.prom"] and os.stat(theirs).st_dev == os.stat(base).st_dev


NETWORK_CONFIG = CONFIG + "[device]\nheal_network = {heal}\n"


def network_cases(user="edge-agent"):
    act = lambda action: {"id": action, "user": user, "details": {}}   # noqa: E731
    return [act("org.freedesktop.network1.reconfigure"), act("org.freedesktop.network1.renew"),
            act("org.freedesktop.NetworkManager.network-control"),
            restart("systemd-networkd.service", user=user),
            restart("NetworkManager.service", user=user),
            restart("networking.service", user=user), restart("ifup@eth0.service", user=user)]


def test_the_networks_healer_is_granted_its_acts_only_while_its_key_is_on(ground):
    """[device] heal_network off (the default): no flag, and polkit answers no to the
    bounce and leaves the restarts to the system's own policy. On: the flag, and the
    bounce and the three managers' restarts, nothing else (another unit, another verb,
    an interface's unit that is a pattern or a path, another user)."""
    base, _ = ground
    grants_dir = base / "grants"
    assert step(base, config_text=NETWORK_CONFIG.format(allow='["reboot"]',
                                                         heal="false")).returncode == 0
    assert sorted(listing(grants_dir)) == ["reboot"]
    off = polkit_answers(grants_dir, network_cases())
    assert off == ["no"] * 3 + ["not_handled"] * 4
    r = step(base, *managed_by(base, networkd=True),
             config_text=NETWORK_CONFIG.format(allow='["reboot"]', heal="true"))
    assert r.returncode == 0 and "network's bounce through systemd-networkd" in r.stdout, r
    assert sorted(listing(grants_dir)) == ["network-heal", "reboot"]
    assert listing(grants_dir)["network-heal"] == (0o644, 0)
    assert (grants_dir / "network-heal").read_text().splitlines()[0] == "systemd-networkd"
    # networkd's own acts and its restart; NetworkManager's, ifupdown's refused
    assert polkit_answers(grants_dir, network_cases()) == \
        ["yes", "yes", "no", "yes", "not_handled", "not_handled", "not_handled"]
    hostile = [restart(u) for u in ("ifup@.service", "ifup@eth0 .service", "ifup@../x.service",
                                    "ifup@*.service", "ifup@" + "e" * 16 + ".service",
                                    "systemd-resolved.service", "ssh.service", None)]
    hostile += [restart("systemd-networkd.service", verb) for verb in ("stop", "start", "kill")]
    assert polkit_answers(grants_dir, hostile + network_cases(user="pi")) == \
        ["not_handled"] * (len(hostile) + 7)
    # the device part off takes the healer with it
    cfg = NETWORK_CONFIG.format(allow='["reboot"]', heal="true") + "enabled = false\n"
    assert step(base, *managed_by(base, networkd=True), config_text=cfg).returncode == 0
    assert sorted(listing(grants_dir)) == ["reboot"]
    assert polkit_answers(grants_dir, network_cases()) == off


def managed_by(base: Path, networkd=False, ifstate=None) -> tuple:
    """The step's hidden paths to networkd's links and ifupdown's state, made here."""
    links = base / "netif-links"
    links.mkdir(exist_ok=True)
    for old in links.iterdir():
        old.unlink()
    if networkd:
        (links / "7").write_text("ADMIN_STATE=configured\nOPER_STATE=routable\n")
    state = base / "ifstate"
    state.unlink(missing_ok=True)
    if ifstate is not None:
        state.write_text(ifstate)
    return "--networkd-dir", str(links), "--ifstate", str(state)


def test_the_networks_healer_is_granted_its_own_managers_acts_and_no_other(ground):
    """The flag names the manager root's start step finds (netprobe.py): polkit lets the
    agent act through that one alone. ifupdown: its interfaces' units, each by name,
    and networking.service; no other interface's, no other manager's act or restart.
    NetworkManager: its network-control and its restart. No manager found: no flag,
    said, and nothing allowed."""
    base, _ = ground
    grants_dir = base / "grants"
    heal = NETWORK_CONFIG.format(allow='["reboot"]', heal="true")
    r = step(base, *managed_by(base, ifstate="lo=lo\neth0=eth0\nwlan1=wlan1\n"),
             config_text=heal)
    assert r.returncode == 0 and "through ifupdown and its restart (eth0, wlan1)" in r.stdout, r
    assert (grants_dir / "network-heal").read_text().splitlines()[0] == "ifupdown eth0 wlan1"
    cases = network_cases() + [restart(u) for u in (
        "ifup@wlan1.service", "ifup@wlan0.service", "ifup@lo.service", "ifup@eth.service",
        "ifup@eth0 wlan1.service", "ifup@ifupdown.service")]
    assert polkit_answers(grants_dir, cases) == \
        ["no", "no", "no", "not_handled", "not_handled", "yes", "yes",
         "yes", "not_handled", "not_handled", "not_handled", "not_handled", "not_handled"]

    # NetworkManager (found by nmcli, which this machine has not): the flag as it is written
    assert "+network-heal" in grants.sync(grants.flags(
        frozenset({"reboot"}), network=("NetworkManager", ())), str(grants_dir))
    assert polkit_answers(grants_dir, network_cases()) == \
        ["no", "no", "yes", "not_handled", "yes", "not_handled", "not_handled"]

    r = step(base, *managed_by(base), config_text=heal)
    assert r.returncode == 0 and "no network manager" in r.stdout, r
    assert sorted(listing(grants_dir)) == ["reboot"]
    assert polkit_answers(grants_dir, cases) == ["no"] * 3 + ["not_handled"] * 10
