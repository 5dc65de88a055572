"""`edge-agent doctor` (issue #40) against each real failure the real-sites tests make
(tests/test_real_sites.py: its parts, in the test's own network namespace): the step
that fails, its words and its exit status; against a healthy reference fleet server,
every step ok; no secret in what it prints; the judges' words beside the page's."""
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agent.app import doctor as D
from agent.base import reasons as J
from devtools import site
from devtools.harness import REPO, agent_config

PASSWORD = "pr0xy-s3cret"


@pytest.fixture
def parts(tmp_path):
    p = site.Parts(tmp_path / "site")
    (tmp_path / "site").mkdir()
    yield p
    p.close()


def doctor(python, cfg, *, env: dict | None = None, prefix: tuple = (), text: bool = False,
           timeout: float = 90):
    """The doctor's JSON (or its text) and its exit status, as an operator runs it."""
    args = [*prefix, python, "-m", "agent", "doctor", "--config", str(cfg)]
    if not text:
        args.append("--json")
    start = time.monotonic()
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", **(env or {})})
    took = time.monotonic() - start
    assert took < 40, f"the doctor took {took:.0f} s"
    assert r.stderr == "", r.stderr
    return (r.stdout if text else json.loads(r.stdout)), r.returncode


def steps_of(report: dict) -> dict:
    assert [s["name"] for s in report["steps"]] == list(D.STEPS), report
    return {s["name"]: s for s in report["steps"]}


def _config(server, tmp_path, name, server_section=None, network=None, **sections):
    work = tmp_path / name
    work.mkdir()
    (work / "state").mkdir()
    return agent_config(server, work, server=server_section or {}, network=network or {},
                        **sections)


def test_each_real_failure_fails_its_own_step_with_the_links_words_and_its_class(
        netns, fleet, agent_python, parts, tmp_path):
    server = fleet()
    ca = site.SiteCA(tmp_path / "ca")
    future_cert, future_key = ca.issue("future", "20300101000000Z", "20310101000000Z")
    self_cert, self_key = site.self_signed(tmp_path / "self")
    dropped = site.free_port()
    netns.nft(f"add rule inet {netns.TABLE} input tcp dport {dropped} drop\n")
    proxy_port, _ = parts.proxy("site-user", "right", connect_ports=(server.port,))
    closed = site.free_port()
    http = "http://127.0.0.1:{}".format
    https = "https://127.0.0.1:{}".format
    cases = [  # (step, reason, exit, words, server section, network section)
        ("dns", "dns-failed", 4, "getent hosts fleet.invalid", {"url": "http://fleet.invalid:8470"}, {}),
        ("route", "network-unreachable", 4, "ip route", {"url": "http://192.0.2.1:8470"}, {}),
        ("tcp", "connection-refused", 4, "connection refused", {"url": http(closed)}, {}),
        ("tcp", "connect-timeout", 4, "no answer to the TCP handshake", {"url": http(dropped)}, {}),
        ("upgrade", "no-answer", 6, "no answer to the websocket upgrade",
         {"url": http(parts.hung_server())}, {}),
        ("tls", "tls-untrusted", 5, "[server] ca_file",
         {"url": https(parts.tls_box(self_cert, self_key, server.port))}, {}),
        ("tls", "clock-behind", 3, "not valid yet by this device's clock",
         {"url": https(parts.tls_box(future_cert, future_key, server.port)), "ca_file": ca.cert}, {}),
        ("proxy", "proxy-auth", 4, "asks for credentials", {"url": http(server.port)},
         {"proxy": http(proxy_port)}),
        ("proxy", "proxy-auth", 4, "refused the configured credentials", {"url": http(server.port)},
         {"proxy": f"http://site-user:{PASSWORD}@127.0.0.1:{proxy_port}"}),
        ("tcp", "proxy-unreachable", 4, "the proxy's host and port", {"url": http(server.port)},
         {"proxy": http(closed)}),
        ("upgrade", "captive-portal", 6, "login page",
         {"url": http(parts.portal(302, {"Location": "http://portal.example/"}))}, {}),
        ("upgrade", "captive-portal", 6, "a page (200)", {"url": http(parts.portal(200))}, {}),
    ]
    for n, (name, reason, code, words, server_section, network) in enumerate(cases):
        cfg = _config(server, tmp_path, f"case-{n}", server_section, network)
        report, rc = doctor(agent_python, cfg)
        steps = steps_of(report)
        failing = [s for s in report["steps"] if s["verdict"] == "fail"]
        assert [s["name"] for s in failing] == [name], (reason, report)
        assert failing[0]["reason"] == reason, (reason, failing[0])
        assert words in failing[0]["said"] + failing[0]["todo"], (reason, failing[0])
        assert rc == code == report["exit"], (reason, rc, report)
        later = D.STEPS[D.STEPS.index(name) + 1:D.STEPS.index("token")]
        assert all(steps[s]["verdict"] == "not checked" for s in later), (reason, report)
        # what does not need the network is still checked
        assert steps["storage"]["verdict"] == "ok" and steps["token"]["verdict"] == "ok"
        text, _ = doctor(agent_python, cfg, text=True)
        assert PASSWORD not in text + json.dumps(report), "the proxy password was printed"
        assert "t0ken" not in text + json.dumps(report), "the token was printed"


def test_against_a_healthy_fleet_server_every_step_is_ok_direct_through_tls_and_a_proxy(
        netns, fleet, agent_python, parts, tmp_path):
    server = fleet()
    ca = site.SiteCA(tmp_path / "ca")
    cert, key = ca.issue("box")
    proxy_port, _ = parts.proxy("site-user", PASSWORD, connect_ports=(server.port,))
    ways = {"direct": ({}, {}),
            "tls": ({"url": f"https://127.0.0.1:{parts.tls_box(cert, key, server.port)}",
                     "ca_file": ca.cert}, {}),
            "proxy": ({}, {"proxy": f"http://site-user:{PASSWORD}@127.0.0.1:{proxy_port}"})}
    for name, (server_section, network) in ways.items():
        cfg = _config(server, tmp_path, name, server_section, network)
        report, rc = doctor(agent_python, cfg)
        steps = steps_of(report)
        assert rc == 0 and report["exit"] == 0, report
        assert not [s for s in report["steps"] if s["verdict"] in ("fail", "not checked")], report
        for step in ("configuration", "dns", "tcp", "upgrade", "token", "storage"):
            assert steps[step]["verdict"] in ("ok", "info"), (name, steps[step])
        assert "Engine.IO open" in steps["upgrade"]["said"], steps["upgrade"]
        assert steps["tls"]["verdict"] == ("ok" if name == "tls" else "info"), steps["tls"]
        assert steps["proxy"]["verdict"] == ("ok" if name == "proxy" else "info"), steps["proxy"]
        assert steps["clock"]["verdict"] != "fail", steps["clock"]
        assert "off the server's" in steps["clock"]["said"], "the server's Date was not read"
        assert steps["display"]["verdict"] == "info", steps["display"]   # no screen here
        text, _ = doctor(agent_python, cfg, text=True)
        assert PASSWORD not in text + json.dumps(report), "the proxy password was printed"
        assert "***@" in steps["configuration"]["said"] or name != "proxy"
        if name == "proxy":   # the tunnel's answer, which only the proxy gives
            assert f"http://***@127.0.0.1:{proxy_port} accepted CONNECT" in steps["proxy"]["said"]
    assert server.device() == {}, "the doctor joined a namespace in the device's name"


def test_beside_a_running_agent_the_doctor_disturbs_nothing(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    server = fleet()
    cfg = agent_config(server, tmp_path)
    agent = spawn_agent(agent_python, cfg)
    agent.wait_live(15)
    before = server.device()
    report, rc = doctor(agent_python, cfg)
    assert rc == 0, report
    assert any("an agent runs beside this" in n for n in report["notes"]), report
    assert "the running agent's link is online" in steps_of(report)["token"]["said"]
    after = server.device()
    assert after["connects"] == before["connects"] == 1 and after["sockets"] == 1, after
    assert after["refused"] == 0 and agent.link()["state"] == "online"
    assert agent.link().get("connection", 1) == 1


def test_a_clock_days_behind_the_servers_fails_the_clock_step(
        netns, fleet, agent_python, tmp_path):
    """libfaketime sets this process's clock three days back; the server's Date says so."""
    if shutil.which("faketime") is None:
        pytest.fail("the clock test needs faketime (.ci/run installs the faketime package)")
    server = fleet()
    cfg = _config(server, tmp_path, "behind")
    report, rc = doctor(agent_python, cfg, prefix=("faketime", "-f", "-3d"),
                        env={"FAKETIME_DONT_FAKE_MONOTONIC": "1"})
    clock = steps_of(report)["clock"]
    assert clock["verdict"] == "fail" and clock["reason"] == "clock-behind", clock
    assert "3 days behind the server's" in clock["said"] and "timedatectl" in clock["todo"]
    assert rc == 3 == report["exit"], report


def test_the_stored_token_is_judged_on_disk_and_never_printed(tmp_path, agent_python):
    """No network needed: a name that cannot resolve fails first, the token is still looked at."""
    state = tmp_path / "state"
    state.mkdir()
    token = "t0ken" + "x" * 40
    (state / "credentials.json").write_text(json.dumps({"device_id": "screen-1", "token": token}))
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f'[server]\nurl = "http://fleet.invalid:8470"\n[identity]\n'
                   f'device_id = "screen-1"\nstate_dir = "{state}"\n'
                   f'[runtime]\ndir = "{tmp_path / "run"}"\n')
    os.chmod(state / "credentials.json", 0o644)
    report, _ = doctor(agent_python, cfg)
    found = steps_of(report)["token"]
    assert found["verdict"] == "fail" and "mode 0644" in found["said"], found
    assert "chmod 0600" in found["todo"]
    os.chmod(state / "credentials.json", 0o600)
    report, _ = doctor(agent_python, cfg)
    assert steps_of(report)["token"]["verdict"] == "ok", report
    (state / "credentials.json").write_text(json.dumps({"device_id": "screen-1", "token": "a b"}))
    report, _ = doctor(agent_python, cfg)
    assert steps_of(report)["token"]["verdict"] == "fail", report
    assert (state / "credentials.json").exists(), "the doctor moved the agent's file"
    text, _ = doctor(agent_python, cfg, text=True)
    assert token not in text and token not in json.dumps(report)
    os.unlink(state / "credentials.json")
    report, _ = doctor(agent_python, cfg)
    assert steps_of(report)["token"]["verdict"] == "warn", report
    assert "pairing code" in steps_of(report)["token"]["todo"]


def test_a_state_directory_its_owner_cannot_write_fails_storage_with_its_class(
        tmp_path, agent_python):
    """As root the probe becomes the directory's owner, as the agent would be: nobody's
    directory, mode 0500, refuses it the write root could have made."""
    nobody = pwd.getpwnam("nobody")
    home = tempfile.mkdtemp(prefix="doctor-", dir="/tmp")   # nobody may enter, not write
    try:
        os.chmod(home, 0o755)
        state = os.path.join(home, "state")
        os.mkdir(state, 0o500)
        os.chown(state, nobody.pw_uid, nobody.pw_gid)
        cfg = tmp_path / "agent.toml"
        cfg.write_text(f'[server]\nurl = "http://fleet.invalid:8470"\n[identity]\n'
                       f'device_id = "screen-1"\ntoken = "t0ken{"x" * 40}"\n'
                       f'state_dir = "{state}"\n[runtime]\ndir = "{tmp_path / "run"}"\n')
        report, rc = doctor(agent_python, cfg)
        storage = steps_of(report)["storage"]
        assert storage["verdict"] == "fail" and "as nobody" in storage["said"], storage
        assert "Permission denied" in storage["said"], storage
        assert rc == 4, "the first failing step's class is the network's"
        os.chmod(state, 0o700)
        report, _ = doctor(agent_python, cfg)
        storage = steps_of(report)["storage"]
        assert storage["verdict"] == "ok" and "as nobody" in storage["said"], storage
        assert os.listdir(state) == [], "the probe file was left behind"
    finally:
        shutil.rmtree(home)


def _connector(root, name="card0-HDMI-A-1", status="connected", dpms="On"):
    path = root / "class" / "drm" / name
    path.mkdir(parents=True, exist_ok=True)
    for attribute, value in (("status", status), ("dpms", dpms), ("enabled", "enabled")):
        (path / attribute).write_text(value + "\n")


def test_the_display_on_is_ok_off_or_unplugged_fails_with_its_class(tmp_path, xvfb):
    """DRM's connector in a sysfs tree of real files (as tests/test_screen.py reads it),
    beside a real X server, which Xvfb builds without DPMS: that source says it cannot
    read, and the DRM reading decides."""
    from agent.app import doctor_probes
    from agent.config import load as cfgmod
    display, _ = xvfb
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f'[server]\nurl = "http://fleet.invalid:8470"\n[identity]\n'
                   f'state_dir = "{tmp_path / "state"}"\n[runtime]\ndir = "{tmp_path / "run"}"\n'
                   f'[screen]\nx_display = "{display}"\ncec_device = "{tmp_path / "no-cec"}"\n')
    config = cfgmod.load(str(cfg), env={})
    sysfs = tmp_path / "sys"
    _connector(sysfs)
    shown = D.judge_display(doctor_probes.display(config, str(sysfs)))
    assert shown.verdict == "ok" and "DRM: card0-HDMI-A-1 enabled, On" in shown.said, shown
    _connector(sysfs, dpms="Off")
    shown = D.judge_display(doctor_probes.display(config, str(sysfs)))
    assert shown.verdict == "fail" and shown.exit == 8 and "reads off" in shown.said, shown
    assert "working hours" in shown.todo
    _connector(sysfs, status="disconnected")
    shown = D.judge_display(doctor_probes.display(config, str(sysfs)))
    assert shown.verdict == "fail" and "no display is connected" in shown.said, shown
    assert "HDMI cable" in shown.todo
    shown = D.judge_display(doctor_probes.display(config, str(tmp_path / "no-sysfs")))
    assert shown.verdict == "info" and "no display source" in shown.said, shown


def test_a_configuration_that_does_not_load_fails_first_and_nothing_else_is_checked(
        tmp_path, agent_python):
    cfg = tmp_path / "agent.toml"
    cfg.write_text('[server]\nurl = "http://fleet.example:8470"\n[link]\nheartbeat_interval_s = "x"\n')
    report, rc = doctor(agent_python, cfg)
    steps = steps_of(report)
    assert steps["configuration"]["verdict"] == "fail" and rc == 2, report
    assert "heartbeat_interval_s" in steps["configuration"]["said"]
    assert all(s["verdict"] == "not checked" for s in report["steps"][1:]), report


def _unreachable_config(tmp_path, state, token: str | None = None) -> Path:
    """A configuration whose server name cannot resolve (the network steps fail first,
    exit 4) over ``state``; the runtime directory (the status file's) beside it."""
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f'[server]\nurl = "http://fleet.invalid:8470"\n[identity]\n'
                   f'device_id = "screen-1"\nstate_dir = "{state}"\n'
                   + (f'token = "{token}"\n' if token else "")
                   + f'[runtime]\ndir = "{tmp_path / "run"}"\n')
    return cfg


def _inotify_opens(path: str):
    """A watch on ``path`` for opens and reads (inotify(7), through libc): call the
    result to learn whether anything opened or read the file since."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert fd >= 0 and libc.inotify_add_watch(fd, path.encode(), 0x20 | 0x01) >= 0

    def opened() -> bool:
        try:
            return bool(os.read(fd, 4096))
        except BlockingIOError:
            return False
        finally:
            os.close(fd)
    return opened


def test_as_root_a_credentials_link_the_agents_user_planted_is_never_opened(
        tmp_path, agent_python):
    """Security #49.5: the state directory is the agent's user's (nobody here); a
    credentials.json it made a link to a root-only file is a finding, never read by root."""
    assert os.geteuid() == 0, "this test proves what root does"
    nobody = pwd.getpwnam("nobody")
    secret = tmp_path / "root-only.json"
    content = "r00t-only-" + "s" * 40
    secret.write_text(json.dumps({"device_id": "screen-1", "token": content}))
    os.chmod(secret, 0o600)
    home = tempfile.mkdtemp(prefix="doctor-", dir="/tmp")
    try:
        os.chmod(home, 0o755)
        state = os.path.join(home, "state")
        os.mkdir(state, 0o700)
        os.symlink(secret, os.path.join(state, "credentials.json"))
        os.lchown(os.path.join(state, "credentials.json"), nobody.pw_uid, nobody.pw_gid)
        os.chown(state, nobody.pw_uid, nobody.pw_gid)
        cfg = _unreachable_config(tmp_path, state)
        opened = _inotify_opens(str(secret))
        report, rc = doctor(agent_python, cfg)
        text, _ = doctor(agent_python, cfg, text=True)
        assert not opened(), "the doctor opened the file the link points to"
        found = steps_of(report)["token"]
        assert found["verdict"] == "fail" and "link" in found["said"], found
        assert content not in text + json.dumps(report)
        assert rc == 4 == report["exit"], report   # the network's class comes first
    finally:
        shutil.rmtree(home)


def test_a_server_that_upgrades_then_only_pings_ends_the_upgrade_step_at_its_deadline(
        tmp_path, agent_python):
    """Security #49.6: each websocket ping would restart a read timeout; the step has one
    deadline whatever arrives."""
    from devtools.hostile_http import pinging_upgrade_server
    state = tmp_path / "state"
    state.mkdir()
    with pinging_upgrade_server(every_s=0.5) as url:
        cfg = _unreachable_config(tmp_path, state, token="t0ken" + "x" * 40)
        cfg.write_text(cfg.read_text().replace("http://fleet.invalid:8470", url))
        start = time.monotonic()
        report, rc = doctor(agent_python, cfg, timeout=40)
        took = time.monotonic() - start
    upgrade = steps_of(report)["upgrade"]
    assert upgrade["verdict"] == "fail" and rc == 6, report
    assert "Engine.IO" in upgrade["said"], upgrade
    print(f"the doctor against a server that only pings: {took:.1f} s")
    assert took < 12, f"{took:.1f} s: past the step's deadline"


@pytest.mark.parametrize("link", ["x", [1], 3, None, {"state": 5}, {"reason": ["refused"]}])
def test_a_damaged_status_file_is_a_finding_and_every_step_is_still_shown(
        tmp_path, agent_python, link):
    """Security #49.7: the running agent's status file (its pid alive: this test's) with
    a link of the wrong type."""
    state = tmp_path / "state"
    state.mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "status.json").write_text(json.dumps({"pid": os.getpid(),
                                                              "link": link}))
    cfg = _unreachable_config(tmp_path, state, token="t0ken" + "x" * 40)
    report, rc = doctor(agent_python, cfg)
    token = steps_of(report)["token"]
    if link is None:   # no link yet: a starting agent's file, nothing damaged
        assert token["verdict"] == "ok", token
    else:
        assert token["verdict"] == "warn" and "status file" in token["said"], token
        assert "link" in token["said"], token
    assert rc == 4 == report["exit"], report


# -- the words, the help and the page -------------------------------------------------
def test_each_reasons_advice_is_the_troubleshooting_pages_own():
    page = (REPO / "docs" / "troubleshooting.md").read_text()
    for reason, advice in J.WHAT_TO_DO.items():
        row = re.search(rf"^\| `{re.escape(reason)}` \|[^|]*\|(.*)\|$", page, re.M)
        assert row, f"no row for {reason}"
        cell = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", row.group(1)).replace("`", "")
        assert advice in cell, f"{reason}: the doctor says {advice!r}, the page {cell!r}"
    # every reason a step can fail with has its advice ("connect-failed": the system's words)
    assert set(D.STEP_OF_REASON) - {J.CONNECT_FAILED} <= set(J.WHAT_TO_DO)


def test_the_help_and_the_man_page_name_every_exit_status():
    r = subprocess.run([sys.executable, "-m", "agent", "doctor", "--help"], capture_output=True,
                       text=True, env={"PYTHONPATH": str(REPO)}, timeout=30)
    man = (REPO / "debian" / "edge-agent.1").read_text()
    for code, meaning in (("0", "ok"), ("2", "configuration"), ("3", "clock"), ("4", "network"),
                          ("5", "TLS"), ("6", "server"), ("7", "storage"), ("8", "display"),
                          ("9", "packages")):
        assert f"  {code}  {meaning}" in r.stdout, r.stdout
        assert f"{code} {meaning}" in man.replace("\n", " ")
    assert ".B edge-agent doctor" in man
    # what it checks, before the codes: the steps this release added among them
    assert "the server's kind" in r.stdout and "clone\ncheck" in r.stdout, r.stdout


def test_the_runbooks_exit_table_names_every_step_in_its_class_row():
    """operate.md's exit table is what an operator reads for a failed step's code: each
    step that can fail is named in the row of its class (the profile step, exit 6, was
    missing there and from the man page)."""
    page = (REPO / "docs" / "operate.md").read_text().split("`edge-agent doctor`", 1)[1]
    man = (REPO / "debian" / "edge-agent.1").read_text().replace("\n", " ")
    for name in D.STEPS:
        if name == "upload" or name not in D.EXIT_OF:   # never sent, or never a failure
            continue
        code = D.EXIT_OF[name]
        row = re.search(rf"^\| {code} \|(.*)\|$", page, re.M)
        assert row and re.search(rf"\b{name}\b", row.group(1)), (name, code, row)
    assert "6 server (the upgrade, the server's kind, the token)" in man


def test_storage_as_another_user_than_the_directorys_owner_is_a_warning_saying_whom():
    other = D.judge_storage({"dir": "/var/lib/edge-agent", "as": "pi", "owner": "edge-agent",
                             "error": "Permission denied"})
    assert other.verdict == "warn" and "sudo -u edge-agent edge-agent doctor" in other.todo
    own = D.judge_storage({"dir": "/var/lib/edge-agent", "as": "edge-agent",
                           "owner": "edge-agent", "error": "Read-only file system"})
    assert own.verdict == "fail" and own.exit == 7, own


def test_the_judges_say_the_clock_a_proxy_that_does_not_answer_and_a_silent_server():
    assert D.judge_clock(True, "timedatectl", 2.0).verdict == "ok"
    assert D.judge_clock(False, "timedatectl", None).verdict == "warn"
    assert D.judge_clock(None, "x", 45.0).verdict == "warn"
    ahead = D.judge_clock(True, "timedatectl", -7200.0)
    assert ahead.verdict == "fail" and "2 hours ahead of" in ahead.said and ahead.exit == 3
    # reached, then no answer to CONNECT: the proxy's step, not the TCP handshake's
    steps = D.judge_connect({"phases": {"dns_s": 0.0, "tcp_s": 0.001},
                             "reason": J.PROXY_UNREACHABLE, "detail": "did not answer"},
                            "http://p:3128", False)
    assert [s.verdict for s in steps] == ["ok", "fail", "not checked", "not checked"]
    silent = D.judge_connect({"phases": {"tcp_s": 0.0, "upgrade_s": 0.0},
                              "eio_problem": "WebSocketTimeoutException"}, None, False)
    assert silent[-1].verdict == "fail" and silent[-1].exit == 6
    assert D.exit_status(steps) == 4


def test_the_failing_step_is_where_the_dial_stopped_not_what_the_reason_word_guesses():
    """A TLS handshake nobody answers is no-answer (a word the upgrade uses too), and a
    connection cut after the upgrade is connect-failed (a word TCP uses too): the step
    that failed is the first phase the dial did not finish."""
    from agent.app import doctor
    from agent.base import reasons as J
    in_tls = doctor.judge_connect({"phases": {"tcp_s": 0.01}, "reason": J.NO_ANSWER,
                                   "detail": "no answer to the TLS handshake"}, None, True)
    assert [(s.name, s.verdict) for s in in_tls] == [
        ("tcp", doctor.OK), ("proxy", doctor.INFO), ("tls", doctor.FAIL),
        ("upgrade", doctor.NOT_CHECKED)], in_tls
    after = doctor.judge_connect({"phases": {"tcp_s": 0.01, "tls_s": 0.02, "upgrade_s": 0.03},
                                  "reason": J.CONNECT_FAILED, "detail": "cut"}, None, True)
    assert [(s.name, s.verdict) for s in after][-1] == ("upgrade", doctor.FAIL), after
    assert all(s.verdict != doctor.FAIL for s in after[:-1]), after


def test_the_doctors_text_carries_no_terminal_escape_a_server_chose():
    """The link's detail is a server's words; a technician runs doctor as root."""
    from agent.app import doctor
    osc52 = "\x1b]52;c;cm0gLXJmIC8K\x07"
    text = doctor.render([doctor.step("upgrade", doctor.FAIL, f"refused {osc52}\rok",
                                      "ask the server")], [f"note \x9b2J"])
    assert not any(c in text for c in "\x1b\x07\r\x9b"), repr(text)
    assert "\\x1b]52" in text


# -- the environment the unit gives the agent (operator #50.2) ------------------------
def test_an_environment_file_is_read_by_systemds_rules():
    """systemd.exec(5)'s EnvironmentFile= (src/basic/env-file.c): the booted tier
    proves the same file against systemd itself."""
    from agent.app.unit_env import parse_env_file
    text = ("# a comment\n; another\n  https_proxy = http://p:3128  \n"
            "EDGE_AGENT_LOG_LEVEL='debug'\n"
            'no_proxy="a,b \\"c\\" \\$d \\x"\n'
            "SPLIT=one\\\ntwo\n"
            "ESCAPED=a\\ b\\\\c\n"
            "EMPTY=\n"
            "http_proxy=late")
    assert parse_env_file(text) == [
        ("https_proxy", "http://p:3128"), ("EDGE_AGENT_LOG_LEVEL", "debug"),
        ("no_proxy", 'a,b "c" $d \\x'), ("SPLIT", "onetwo"), ("ESCAPED", "a b\\c"),
        ("EMPTY", ""), ("http_proxy", "late")]


def test_systemctls_show_and_the_units_files_say_each_value_and_where_it_was_set():
    from agent.app import unit_env
    shown = ('LoadState=loaded\nEnvironment=PYTHONNOUSERSITE=1 "https_proxy=http://u:p w@h:1" '
             '"EDGE_AGENT_X=a\\"b"\n'
             'EnvironmentFiles=/etc/edge-agent/site.env (ignore_errors=yes)\n'
             'EnvironmentFiles=/etc/default/x y (ignore_errors=no)\n'
             'FragmentPath=/usr/lib/systemd/system/edge-agent.service\n'
             'DropInPaths=/etc/systemd/system/edge-agent.service.d/a.conf\n')
    props = unit_env.parse_show(shown)
    assert props["EnvironmentFiles"] == [("/etc/edge-agent/site.env", True),
                                         ("/etc/default/x y", False)]
    assert unit_env.parse_assignments(props["Environment"]) == [
        ("PYTHONNOUSERSITE", "1"), ("https_proxy", "http://u:p w@h:1"), ("EDGE_AGENT_X", 'a"b')]
    files = [("/usr/lib/systemd/system/edge-agent.service", "[Service]\nEnvironment=https_proxy=x\n"),
             ("/etc/systemd/system/edge-agent.service.d/a.conf",
              '[Service]\nEnvironment="https_proxy=http://u:p w@h:1" PYTHONNOUSERSITE=1\n')]
    assert unit_env.setter("https_proxy", files) == files[1][0]
    assert unit_env.setter("EDGE_AGENT_X", files) is None
    env = unit_env.UnitEnvironment(values={"https_proxy": "http://h:1"},
                                   origins={"https_proxy": "Environment= in a.conf"})
    # the shell's proxy is not the agent's; its other variables stay
    assert env.over({"http_proxy": "http://shell:1", "PATH": "/bin"}) == {
        "https_proxy": "http://h:1", "PATH": "/bin"}
    assert "https_proxy from Environment= in a.conf" in env.said()
    outside = unit_env.UnitEnvironment(problem="not booted with systemd")
    assert outside.over({"http_proxy": "x"}) == {"http_proxy": "x"}
    assert "not read (not booted with systemd)" in outside.said()


# -- the screen's means (operator #50.5) ----------------------------------------------
def test_an_x_screen_without_dpms_is_said_so_and_the_screen_step_lists_its_means(
        tmp_path, xvfb):
    """A real X server (Xvfb has no DPMS) configured, xwd there to capture it: the display
    step says DPMS is what is missing, not "no display source here"; the screen step
    lists each means, the running agent's last verdict and its age, the player's state."""
    from agent.app import doctor_probes
    from agent.config import load as cfgmod
    display, _ = xvfb
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f'[server]\nurl = "http://fleet.invalid:8470"\n[identity]\n'
                   f'state_dir = "{tmp_path / "state"}"\n[runtime]\ndir = "{tmp_path / "run"}"\n'
                   f'[screen]\nx_display = "{display}"\ncec_device = "{tmp_path / "no-cec"}"\n'
                   f'player_unit = "kiosk.service"\n')
    config = cfgmod.load(str(cfg), env={})
    env = {"PATH": "/usr/bin:/bin"}
    readings = doctor_probes.display(config, str(tmp_path / "no-sysfs"), environ=env)
    shown = D.judge_display(readings)
    assert "the X server has no DPMS" in shown.said and "here" not in shown.said, shown
    agent = {"pid": os.getpid(), "updated_at": time.time() - 20,
             "screen": {"picture": {"verdict": "black", "checked_s_ago": 40}}}
    screen = D.judge_screen(doctor_probes.screen(config, env, agent, readings))
    assert screen.name == "screen" and screen.verdict == "warn", screen
    assert f"capture: xwd on {display}" in screen.said, screen
    assert "X11 DPMS: none (the X server has no DPMS)" in screen.said, screen
    assert "DRM: none (no DRM connector in sysfs)" in screen.said, screen
    assert "CEC: none" in screen.said, screen
    assert "picture: black, checked 1 minute ago" in screen.said, screen
    assert "player kiosk.service: " in screen.said, screen
    for damaged in ({"screen": "x"}, {"screen": {"picture": {"verdict": 3}}}):
        found = doctor_probes.screen(config, env, {"pid": 1, **damaged}, readings)
        assert D.judge_screen(found).verdict == "warn" and found["status_problem"], found
    quiet = D.judge_screen(doctor_probes.screen(config, env, None, readings))
    assert "picture: no agent runs here" in quiet.said, quiet


def test_a_failed_player_unit_fails_the_screen_step_with_the_displays_class():
    found = {"capture": "xwd on :0", "can_capture": True, "means": [("DRM", True, "On")],
             "player": "kiosk.service", "player_said": "failed (exit-code, status 1)",
             "player_state": "failed", "picture_why": "not checked yet"}
    failed = D.judge_screen(found)
    assert failed.verdict == "fail" and failed.exit == 8, failed
    assert "journalctl -u kiosk.service" in failed.todo


# -- the project's repository the way apt reaches it (operator #50.3) -------------------
@pytest.fixture
def repository(tmp_path):
    """An HTTP server holding a repository's dists/stable/InRelease: its base URL."""
    import http.server
    import threading
    root = tmp_path / "www"
    (root / "edge-agent" / "dists" / "stable").mkdir(parents=True)
    (root / "edge-agent" / "dists" / "stable" / "InRelease").write_text(
        "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA512\n\nOrigin: edge-agent\n")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(root), **kw)

        def log_message(self, *a):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/edge-agent"
    server.shutdown()


def test_the_repository_is_fetched_through_apts_proxy_or_fails_with_the_packages_class(
        netns, fleet, agent_python, repository, tmp_path):
    """apt's own configuration (APT_CONFIG: apt-config reads it) names the proxy and the
    sources; the InRelease goes through the proxy (its log shows it), a proxy that
    refuses the credentials fails the step (exit 9), no sources file skips it."""
    server = fleet()
    work = Path(tempfile.mkdtemp(prefix="doctor-apt-", dir="/tmp"))   # tinyproxy (nobody)
    os.chmod(work, 0o755)                                              # writes its log here
    parts = site.Parts(work)
    try:
        port, log = parts.proxy("site-user", PASSWORD)
        sources = work / "sources.list.d"
        sources.mkdir()
        apt_conf = work / "apt.conf"
        cfg = _config(server, tmp_path, "apt")

        def with_apt(password: str):
            apt_conf.write_text(f'Dir::Etc::sourceparts "{sources}";\n'
                                f'Acquire::http::Proxy "http://site-user:{password}'
                                f'@127.0.0.1:{port}/";\n')
            report, rc = doctor(agent_python, cfg, env={"APT_CONFIG": str(apt_conf)})
            text, _ = doctor(agent_python, cfg, env={"APT_CONFIG": str(apt_conf)}, text=True)
            assert password not in text + json.dumps(report), "the proxy password was printed"
            return steps_of(report)["repository"], rc
        found, rc = with_apt(PASSWORD)
        assert found["verdict"] == "info" and "no project repository configured" in \
            found["said"], found
        assert rc == 0, found
        (sources / "edge-agent.list").write_text(
            f"# the project's\ndeb [signed-by=/etc/apt/keyrings/edge-agent.gpg] {repository} "
            f"stable main\n")
        found, rc = with_apt(PASSWORD)
        assert found["verdict"] == "ok" and rc == 0, found
        assert f"{repository}/dists/stable/InRelease fetched via http://***@127.0.0.1:{port}" \
            in found["said"], found
        assert f"GET {repository}/dists/stable/InRelease" in log.read_text(), \
            "the InRelease did not go through apt's proxy"
        found, rc = with_apt("wrong")
        assert found["verdict"] == "fail" and rc == 9, (found, rc)
        assert "Acquire::http::Proxy" in found["todo"] and "CAInfo" in found["todo"], found
    finally:
        parts.close()
        shutil.rmtree(work)


def test_apts_sources_and_proxy_are_read_as_apt_writes_them():
    from agent.app import apt_repository as A
    deb822 = ("Types: deb\nURIs: https://apt.example.org/edge-agent\nSuites: stable\n"
              "Components: main\nSigned-By: /etc/apt/keyrings/edge-agent.gpg\n")
    repo = A.parse_sources("edge-agent.sources", deb822)
    assert repo.inrelease == "https://apt.example.org/edge-agent/dists/stable/InRelease"
    flat = A.parse_sources("edge-agent.list", "deb [trusted=no] http://h/r ./\n")
    assert flat.inrelease == "http://h/r/InRelease", flat
    config = A.parse_dump('Acquire::http::Proxy "http://p:3128";\n'
                          'Acquire::http::Proxy::apt.example.org "DIRECT";\n'
                          'Acquire::https::CAInfo "/etc/ssl/site.pem";\n')
    assert A.apt_proxy(config, "https://apt.example.org/x") == (None, "Acquire::http::Proxy::apt.example.org")
    assert A.apt_proxy(config, "https://other.example/x") == ("http://p:3128", "Acquire::http::Proxy")
    assert A.apt_ca(config, "https://other.example/x") == "/etc/ssl/site.pem"
    # apt's keys are case-insensitive and apt-config dump prints them as written:
    # upgrading.md's recipe writes CaInfo, an operator may write the host in capitals
    written = A.parse_dump('Acquire::https::apt.example.org::CaInfo "/etc/apt/certs/site-ca.pem";\n'
                           'Acquire::HTTP::Proxy::APT.example.org "http://p:3128";\n'
                           'Dir::Etc::SourceParts "parts.d";\n')
    assert A.apt_ca(written, "https://apt.example.org/x") == "/etc/apt/certs/site-ca.pem"
    assert A.apt_proxy(written, "https://apt.example.org/x")[0] == "http://p:3128"
    assert A.sources_dir(written).endswith("/parts.d")


def test_a_repository_that_trickles_its_answer_ends_the_step_at_its_deadline(
        agent_python, tmp_path):
    """Headers a byte at a time, each well within any read timeout: one deadline over the
    whole exchange ends the repository step, a failure of its class."""
    from devtools.hostile_http import trickle_server
    from agent.app.apt_repository import FETCH_TIMEOUT_S
    state = tmp_path / "state"
    state.mkdir()
    sources = tmp_path / "sources.list.d"
    sources.mkdir()
    apt_conf = tmp_path / "apt.conf"
    apt_conf.write_text(f'Dir::Etc::sourceparts "{sources}";\n')
    cfg = _unreachable_config(tmp_path, state, token="t0ken" + "x" * 40)
    with trickle_server(0.2) as url:
        (sources / "edge-agent.sources").write_text(
            f"Types: deb\nURIs: {url}/edge-agent\nSuites: stable\nComponents: main\n")
        start = time.monotonic()
        report, rc = doctor(agent_python, cfg, env={"APT_CONFIG": str(apt_conf)})
        took = time.monotonic() - start
    found = steps_of(report)["repository"]
    assert found["verdict"] == "fail" and "via direct" in found["said"], found
    print(f"the doctor against a trickling repository: {took:.1f} s")
    assert took < FETCH_TIMEOUT_S + 8, took
    assert rc == 4, "the network's class comes first"
