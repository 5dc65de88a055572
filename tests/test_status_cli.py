import json
import os
import subprocess
import sys

import pytest

from agent.app import status
from agent.base import status_file
from agent.app.status import line as status_line

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_status(tmp_path, *extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGE_AGENT_")}
    env["RUNTIME_DIRECTORY"] = str(tmp_path)
    env["PYTHONPATH"] = REPO
    return subprocess.run([sys.executable, "-m", "agent", "status", "--config",
                           str(tmp_path / "none.toml"), *extra],
                          capture_output=True, text=True, env=env, timeout=30)


def put(tmp_path, link, pid=None):
    status_file.write(str(tmp_path / "status.json"),
                 {"pid": pid or os.getpid(), "version": "0.1.0", "device_id": "screen-1",
                  "server": "http://127.0.0.1:1", "link": link})


def test_exit_codes(tmp_path):
    r = run_status(tmp_path)
    assert r.returncode == 3 and "no status file" in r.stderr and "Traceback" not in r.stderr
    put(tmp_path, {"state": "online", "rtt_ms": 12.5, "last_ack_age_s": 3.0,
                   "losses_last_hour": ["ack-timeout", "ack-timeout", "silence"]})
    r = run_status(tmp_path)
    assert r.returncode == 0, r.stderr
    assert "online" in r.stdout and "12.5 ms" in r.stdout and "ack-timeout x2" in r.stdout
    put(tmp_path, {"state": "waiting", "reason": "ack-timeout", "next_attempt_in_s": 7.0,
                   "attempts": 3})
    r = run_status(tmp_path)
    assert r.returncode == 1 and "in 7 s" in r.stdout
    r = run_status(tmp_path, "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["link"]["state"] == "waiting"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    put(tmp_path, {"state": "online"}, pid=dead.pid)
    assert run_status(tmp_path).returncode == 3


def test_corrupt_status_file_is_one_line(tmp_path):
    (tmp_path / "status.json").write_bytes(b"\x00{not json")
    r = run_status(tmp_path)
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and "not a valid status file" in r.stderr


def test_status_lines_for_systemd():
    assert status_line({"state": "online", "rtt_ms": 41.6}) == "online rtt=42ms"
    assert status_line({"state": "waiting", "reason": "ack-timeout",
                        "next_attempt_in_s": 7.2}) == "reconnecting in 7s (ack-timeout)"
    assert status_line({"state": "online"}).startswith("online (waiting")
    # before the link thread's first report: a sentence, never "None"
    assert status_line({}) == "starting link"
    assert status_line({"state": "connecting"}) == "connecting"


def test_every_figure_is_true_when_read_or_says_how_old_it_is(tmp_path):
    """The file is rewritten on changes only (no write per heartbeat): a link up for a
    minute is not '0 s', a countdown does not stand still, and an ACK the file last saw
    65 s ago is not 'the last ack 65 s ago' on a link ACKed every 2 s (online and
    proven, it had one within the bound, or the file would say otherwise)."""
    import time
    status_file.write(str(tmp_path / "status.json"),
                 {"pid": os.getpid(), "version": "0.1.0", "device_id": "screen-1",
                  "server": "http://127.0.0.1:1", "updated_at": time.time() - 65,
                  "pairing": {"state": "pairing", "code": "493-463", "expires_in_s": 600},
                  "link": {"state": "online", "since_s": 0.0, "rtt_ms": 3.0,
                           "last_ack_age_s": 0.5, "proven_live": True, "proof": "heartbeat-ack",
                           "proof_within_s": 3.0, "heartbeat_interval_s": 2.0}})
    out = run_status(tmp_path).stdout
    assert "since       65 s in this state" in out, out
    assert "proof       heartbeat-ack, ACKed every 2 s, the last within 3 s" in out, out
    assert "rtt         3.0 ms, measured 66 s ago" in out, out
    assert "expires in 9 min" in out and "last ack" not in out, out
    now = json.loads(run_status(tmp_path, "--json").stdout)["as_read"]
    assert 64 < now["file_age_s"] < 70 and now["proof_within_s"] == 3.0
    assert 64 < now["link_since_s"] < 70 and 65 < now["rtt_measured_s_ago"] < 71
    assert 530 < now["pairing_expires_in_s"] < 536


def test_the_status_file_says_what_the_link_does_before_any_other_thread_runs(tmp_path, monkeypatch):
    """The enroller, the uploads worker and the outbox rewrite the status file too: it
    must carry the link's state before the first of them starts, not an empty link."""
    from types import SimpleNamespace

    from agent.config import load as cfgmod
    from agent.app.daemon import Agent
    from devtools.harness import agent_config

    server = SimpleNamespace(url="http://127.0.0.1:9", devices={"screen-1": "t" * 32})
    agent = Agent(cfgmod.load(str(agent_config(server, tmp_path)), env={}))
    seen = {}

    def first_thread(then):   # the link thread, the first to start: what is there already
        path = agent.config.status_path
        seen["link"] = status_file.read(path).get("link") if os.path.exists(path) else None
        then()

    monkeypatch.setattr(agent.runner, "start", first_thread)
    agent.run()
    assert seen["link"] and seen["link"]["state"] == "waiting", seen
    assert seen["link"]["next_attempt_in_s"] == 0.0


def test_a_token_only_in_memory_is_degraded_and_says_so(tmp_path):
    doc = {"pid": os.getpid(), "version": "0.1.0", "device_id": "screen-1",
           "server": "http://127.0.0.1:1", "link": {"state": "online", "proof": "tcp-ack+ping"},
           "credentials": {"stored": False, "pending": "store", "error": "No space left on device",
                           "failed_attempts": 3, "next_try_at": None}}
    status_file.write(str(tmp_path / "status.json"), doc)
    r = run_status(tmp_path)
    assert r.returncode == 1, r.stdout
    assert ("credentials not stored yet (No space left on device, 3 failed writes): in use "
            "from memory" in r.stdout)
    assert "proof       tcp-ack+ping" in r.stdout
    status_file.write(str(tmp_path / "status.json"), {**doc, "credentials": None})
    assert run_status(tmp_path).returncode == 0


def test_status_never_reads_through_a_link_or_from_a_fifo(tmp_path):
    """The agent's user owns the runtime directory; `edge-agent status` run as root must
    not follow a link planted there, nor hang on a FIFO put in the file's place."""
    secret = tmp_path / "secret.json"
    secret.write_text('{"pid": 1, "link": {"state": "online"}}')
    os.symlink(secret, tmp_path / "status.json")
    r = run_status(tmp_path)
    assert r.returncode == 3 and "a symbolic link, not a status file" in r.stderr, r.stderr
    os.unlink(tmp_path / "status.json")
    os.mkfifo(tmp_path / "status.json")
    r = run_status(tmp_path)   # the 30 s timeout of run_status would fail a hang
    assert r.returncode == 3 and "not a regular file" in r.stderr, r.stderr


def test_status_says_why_the_link_is_down_and_when_the_clock_is_off():
    doc = {"pid": os.getpid(), "link": {
        "state": "waiting", "reason": "proxy-auth", "next_attempt_in_s": 4.0,
        "detail": "the proxy http://***@10.0.0.1:3128 refused the configured credentials (407)"}}
    text = status.render(doc, True)
    assert "last loss: proxy-auth" in text
    assert "why         the proxy http://***@10.0.0.1:3128 refused" in text
    online = {"pid": os.getpid(), "link": {"state": "online", "clock_skew_s": 3600.0,
                                           "detail": "old news"}}
    text = status.render(online, True)
    assert "clock       3600 s behind the server's" in text and "old news" not in text
    online["link"]["clock_skew_s"] = 1.0
    assert "clock" not in status.render(online, True)


def test_status_prints_no_terminal_escape_a_server_chose(tmp_path):
    """The link's why and a command's name are the server's words; an operator runs
    status as root in a terminal: an OSC 52 clipboard write, a colour or a line reset
    reach it escaped, and --json keeps the text as it was."""
    osc52 = "\x1b]52;c;cm0gLXJmIC8K\x07"
    status_file.write(str(tmp_path / "status.json"), {
        "pid": os.getpid(), "version": "0.1.0", "device_id": "screen-1",
        "server": "http://127.0.0.1:1",
        "link": {"state": "waiting", "reason": "refused", "detail": f"refused {osc52}\rok",
                 "next_attempt_in_s": 3.0, "attempts": 1},
        "commands": [{"command": f"\x1b[31mreboot\x9b2J", "result": "error: \x00x"}]})
    r = run_status(tmp_path)
    assert r.returncode == 1
    assert not any(c in r.stdout for c in "\x1b\x07\r\x9b\x00"), repr(r.stdout)
    assert "\\x1b]52;c;cm0gLXJmIC8K\\x07" in r.stdout and "\\x1b[31mreboot" in r.stdout
    doc = json.loads(run_status(tmp_path, "--json").stdout)
    assert doc["link"]["detail"] == f"refused {osc52}\rok"


def test_a_bug_is_one_line_at_priority_err_never_a_traceback(tmp_path, monkeypatch, capsys):
    """The traceback reached the journal at priority 6, as Python's own print: `journalctl
    -p warning` showed only systemd's "Failed", and the fleet heard no cause."""
    from agent import cli
    from agent.base import logs
    put(tmp_path, {"state": "online"})
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(tmp_path))

    def broken(doc, running):
        return {}["a key the code expected"]

    monkeypatch.setattr(status, "render", broken)
    monkeypatch.setattr(logs, "under_journal", lambda stream=None: True)
    assert cli.main(["status", "--config", str(tmp_path / "none.toml")]) == cli.EXIT_CRASHED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("<3>edge-agent status: crashed: KeyError: 'a key the code expected' "
                          "(at agent/cli.py:"), err


def test_figures_no_age_can_hold_are_no_crash(tmp_path):
    status_file.write(str(tmp_path / "status.json"), {
        "pid": os.getpid(), "version": "0.1.0", "device_id": "screen-1", "updated_at": 10 ** 400,
        "server": "x", "link": {"state": "online", "since_s": 10 ** 400, "rtt_ms": 1.0,
                                "last_ack_age_s": 10 ** 400, "next_attempt_in_s": 10 ** 400}})
    for extra in ((), ("--json",)):
        r = run_status(tmp_path, *extra)
        # a number no figure can hold is a damaged file (base/fsutil.py's loader): one line
        assert r.returncode == 3 and "Traceback" not in r.stderr and "crashed" not in r.stderr
        assert r.stderr.strip().endswith("not a valid status file"), r.stderr


@pytest.mark.netns
def test_a_healthy_links_status_read_long_after_the_last_write_is_true(fleet, spawn_agent,
                                                                       agent_python, tmp_path):
    """A real link heartbeating every 2 s: the status file stops changing once the link
    is stable, and `status` read 10 s later says what the server saw."""
    import time

    from devtools.harness import REPO, agent_config, wait_for
    server = fleet()
    cfg = agent_config(server, tmp_path)
    agent = spawn_agent(agent_python, cfg)
    agent.wait_live(15)
    wait_for(lambda: agent.status().get("link", {}).get("rtt_ms"), 10, what="a status with an RTT")

    def quiet_for_10_s():
        # the first minutes of a link still change the board now and then (the
        # telemetry's first sample, the inventory): 10 s without a write is what is read
        written = agent.status()["updated_at"]
        time.sleep(10)
        return written if agent.status()["updated_at"] == written else None
    wait_for(quiet_for_10_s, 60, interval=0, what="10 s without a write to the status file")
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin",
           "RUNTIME_DIRECTORY": str(tmp_path / "run")}
    r = subprocess.run([agent_python, "-m", "agent", "status", "--json", "--config", str(cfg)],
                       capture_output=True, text=True, env=env, timeout=30)
    now = json.loads(r.stdout)["as_read"]
    text = subprocess.run([agent_python, "-m", "agent", "status", "--config", str(cfg)],
                          capture_output=True, text=True, env=env, timeout=30).stdout
    seen = server.device()
    connected_ago = time.time() - seen["connect_times"][-1]
    last_heartbeat_ago = time.time() - seen["heartbeat_times"][-1]
    assert now["file_age_s"] >= 10
    assert abs(now["link_since_s"] - connected_ago) < 2.0, (now, connected_ago)
    assert last_heartbeat_ago <= now["proof_within_s"] == 3.0, (now, last_heartbeat_ago)
    assert now["rtt_measured_s_ago"] >= 10
    assert "ACKed every 2 s, the last within 3 s" in text and "last ack" not in text, text


@pytest.mark.parametrize("pairing, code, said", [
    # the native profile: the server's code and its deadline
    ({"state": "waiting-for-pairing", "code": "493-463", "expires_in_s": 600, "error": None},
     4, "unclaimed: code 493-463 (enter it on the fleet server; expires in 10 min)"),
    # ScreenTinker: the device makes the code and the server sets no deadline on it
    ({"state": "registered-waiting-for-pairing", "code": "493-463", "expires_in_s": None,
      "expiry": "no expiry while this screen stays connected",
      "where": "the ScreenTinker dashboard (Add display)"},
     4, "unclaimed: code 493-463 (enter it on the ScreenTinker dashboard (Add display); "
        "no expiry while this screen stays connected)"),
    ({"state": "need-code", "error": "HTTP 503"}, 4, "unclaimed (need-code: HTTP 503)"),
    ({"state": "paired", "error": None}, 0, "claimed (paired)"),
    ({"state": "pre-provisioned"}, 0, "claimed (pre-provisioned)"),
])
def test_status_says_claimed_or_unclaimed_and_its_exit_code_tells_them_apart(
        tmp_path, pairing, code, said):
    status_file.write(str(tmp_path / "status.json"),
                 {"pid": os.getpid(), "version": "0.1.0", "device_id": "screen-1",
                  "server": "http://127.0.0.1:1", "pairing": pairing,
                  "link": {"state": "online", "proof": "tcp-ack+ping"}})
    r = run_status(tmp_path)
    assert r.returncode == code, r.stdout
    assert f"pairing     {said}\n" in r.stdout, r.stdout
    assert "None" not in r.stdout
    assert json.loads(run_status(tmp_path, "--json").stdout)["claimed"] is (code == 0)


def test_status_help_names_every_exit_code():
    r = subprocess.run([sys.executable, "-m", "agent", "status", "--help"], capture_output=True,
                       text=True, env={"PYTHONPATH": REPO}, timeout=30)
    for code, meaning in (("0", "online and claimed"), ("1", "degraded"), ("3", "not running"),
                          ("4", "running but unclaimed")):
        assert f"  {code}  {meaning}" in r.stdout, r.stdout



def test_status_says_what_the_screen_shows_with_ages_as_they_stand_now():
    """The display's last read-back, the picture's verdict and the player: ages in the
    file grow by the file's own age (it is written on changes only), and a figure no
    age can hold is said as unknown, never a crash."""
    import time
    doc = {"pid": os.getpid(), "updated_at": time.time() - 60, "link": {"state": "online"},
           "screen": {"display": {"asked": "off", "confirmed": True, "age_s": 120.0,
                                  "said": "confirmed by X11 DPMS (Off)"},
                      "picture": {"verdict": "black", "since_s": 30.0, "checked_s_ago": 5.0},
                      "player": {"unit": "kiosk.service", "state": "failed", "restarts": 2,
                                 "recovery": "restarting the player"}}}
    text = status.render(doc, True)
    assert "display     off 3 min ago: confirmed by X11 DPMS (Off)" in text, text
    assert "picture     black for 90 s, checked 65 s ago" in text, text
    assert "player      kiosk.service failed, 2 restarts; recovery restarting the player" in text
    doc["screen"]["display"]["age_s"] = "x" * 10
    doc["screen"]["picture"] = {"verdict": "ok", "since_s": float("inf")}
    text = status.render(doc, True)
    assert "display     off at an unknown time" in text and "picture     ok\n" in text + "\n"


def test_ages_are_counted_on_the_monotonic_clock_in_the_same_boot_and_none_is_never_said():
    """A file written in this boot is aged by the monotonic clock: a wall clock set by
    NTP after it was written (a Pi has no RTC) moves no age. A picture not judged yet
    says so and why, never "None"."""
    import time
    doc = {"pid": os.getpid(), "link": {"state": "online"},
           "updated_at": time.time() - 10 * 365 * 86400,   # written before NTP set the clock
           "boot_id": status.this_boot(), "monotonic": time.monotonic() - 30,
           "screen": {"picture": {"verdict": "black", "since_s": 30.0, "checked_s_ago": 5.0}}}
    assert 29 < status.as_read(doc, True)["file_age_s"] < 33
    assert "picture     black for 60 s, checked 35 s ago" in status.render(doc, True)
    other_boot = {**doc, "boot_id": "another boot", "updated_at": time.time() - 30}
    assert 29 < status.as_read(other_boot, True)["file_age_s"] < 33
    doc["screen"]["picture"] = {"verdict": None, "pending": "the first check is under way"}
    text = status.render(doc, True)
    assert "picture     not checked yet (the first check is under way)" in text, text
    assert "None" not in text
    doc["screen"]["picture"] = {"verdict": None}
    doc["screen"]["player"] = {"unit": "kiosk.service", "state": None}
    text = status.render(doc, True)
    assert "None" not in text and "player      kiosk.service not read yet" in text, text


@pytest.mark.parametrize("how", [["recorded"], {"a": 1}, 5, None])
def test_the_profile_section_of_any_shape_is_said_never_a_crash(how):
    """The status file is the agent user's: profile.how a list was a TypeError
    (unhashable) in edge-agent status."""
    said = status.render({"pid": 1, "version": "x", "device_id": "d", "server": "s",
                          "link": {}, "profile": {"profile": "edge-agent", "how": how,
                                                  "why": "w"}}, running=False)
    assert "profile     edge-agent (w)" in said


def test_each_status_line_names_one_thing():
    """An operator reads a line by its label: the card's health (device) and the clone
    check (board) both said `card`, one `card  ok` above `card  made from another
    screen's card`."""
    doc = {"link": {"state": "online"},
           "board": {"clone_check": "cloned", "todo": "give this screen its own identity"},
           "device": {"storage": {"verdict": "ok"}}}
    labels = [line[:12].strip() for line in status.render(doc, True).splitlines()[1:]]
    assert len(labels) == len(set(labels)), labels


@pytest.mark.parametrize("layers", [
    {}, {"RUNTIME_DIRECTORY": "/run/a:/run/b"}, {"file": "/srv/f"}, {"vendor": "/srv/v"},
    {"vendor": "/srv/v", "file": "/srv/f"}, {"env": "/srv/e", "file": "/srv/f", "vendor": "/srv/v"},
    {"no_file": True, "vendor": "/srv/v"}, {"file": "/srv/f", "RUNTIME_DIRECTORY": "/run/a"}])
def test_status_finds_the_status_file_where_the_agent_writes_it(tmp_path, layers):
    """`status` reads [runtime] dir alone (config/files.py), not the whole validated
    configuration: from the same layers, in the same order, as the agent's load()."""
    from agent.config import files, load as cfgmod
    env = {"EDGE_AGENT_SERVER_URL": "http://fleet.example:8080"}
    if "RUNTIME_DIRECTORY" in layers:
        env["RUNTIME_DIRECTORY"] = layers["RUNTIME_DIRECTORY"]
    if "env" in layers:
        env["EDGE_AGENT_RUNTIME_DIR"] = layers["env"]
    path, vendor = tmp_path / "agent.toml", tmp_path / "vendor.toml"
    path.write_text(f'[runtime]\ndir = "{layers["file"]}"\n' if "file" in layers else "")
    vendor.write_text(f'[runtime]\ndir = "{layers["vendor"]}"\n' if "vendor" in layers else "")
    given = "-" if layers.get("no_file") else str(path)
    agent_reads = cfgmod.load(given, env=env, vendor=str(vendor)).status_path
    assert files.status_path(given, env=env, vendor=str(vendor)) == agent_reads


def test_status_takes_the_runtime_dir_the_schema_takes_and_no_other():
    """One rule for an absolute path: the schema's ABS_PATH is built on the one status
    reads it with (config/files.py), so the two cannot drift (an empty component, `//`,
    was taken by status and refused by the schema)."""
    from agent.config import files, schema
    for value in ["/", "/run/edge-agent", "/run/edge-agent/", "/run//a", "//", "", "rel",
                  "/a\x7fb", "/a\nb", "/" + "a" * 1023, "/" + "a" * 1024, 5, None]:
        try:
            schema.ABS_PATH.check("runtime.dir", value)
            taken = True
        except (schema.ConfigError, TypeError):
            taken = False
        assert files.usable_dir(value) is taken, repr(value)


def test_status_reads_the_configured_runtime_dir_past_a_bad_key_elsewhere(tmp_path, monkeypatch):
    """An operator's typo in another key does not stop the running agent (it read the file
    before); status still finds its status file, where the whole load used to fail over
    to /run/edge-agent."""
    from agent import cli
    put(tmp_path, {"state": "online"})
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    conf = tmp_path / "agent.toml"
    conf.write_text(f'[server]\nurl = "http://fleet.example:8080"\nnot_a_key = 1\n'
                    f'[runtime]\ndir = "{tmp_path}"\n')
    assert cli.main(["status", "--config", str(conf)]) == cli.EXIT_OK



@pytest.mark.parametrize("configured", ["/x\u001b]0;pwn\u0007\u001b[2J", "rel", "/a\x00b", "/run//a"])
def test_a_runtime_dir_the_agent_refuses_is_neither_read_nor_printed(tmp_path, configured):
    """`status` reads [runtime] dir without the schema: a value the agent would refuse
    (terminal escapes, a relative path) is passed over for the default, as the agent
    would not start with it, and nothing of it reaches the terminal."""
    from agent.config import files
    for where in ("file", "env"):
        path = tmp_path / "agent.toml"
        env = {"RUNTIME_DIRECTORY": str(tmp_path / "run")}
        if where == "file":
            path.write_text("[runtime]\ndir = " + json.dumps(configured) + "\n")
        else:
            path.write_text("")
            env["EDGE_AGENT_RUNTIME_DIR"] = configured
        assert files.status_path(str(path), env, vendor=None) == str(tmp_path / "run" / "status.json")
    r = subprocess.run([sys.executable, "-m", "agent", "status", "--config", str(path)],
                       capture_output=True, text=True, timeout=30, cwd=REPO,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin",
                            "EDGE_AGENT_RUNTIME_DIR": "/nowhere\u001b[31m"})
    assert "\x1b" not in r.stdout + r.stderr and r.returncode != 0, r
