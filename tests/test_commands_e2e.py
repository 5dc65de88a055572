"""Remote operations against the reference fleet server, with real faults.

Receipt ACK, the result until confirmed (across a silent drop), at most once across
kill -9, expiry, the allow-list, bad arguments, restart-agent, and the operator's
command line. Reboot and journal logs are proven under real systemd
(tests/test_booted_systemd.py).
"""
import json
import os
import subprocess
import sys
import time

import pytest

from agent import __version__ as agent_version
from agent.commands import ledger
from devtools.harness import REPO, agent_config, wait_for

pytestmark = pytest.mark.netns


def commands(server, device="screen-1"):
    return server.admin(f"/api/v1/devices/{device}/commands")


def ask(server, name, args=None, **extra):
    return server.admin("/api/v1/commands", {"device_id": "screen-1", "name": name,
                                             "args": args or {}, **extra})


def result_of(server, cid, timeout=15.0):
    return wait_for(lambda: commands(server)[cid]["result"], timeout, interval=0.1,
                    what=f"the result of command {cid}")


def cfg(server, tmp_path, **commands_section):
    return agent_config(server, tmp_path, commands={"allow": ["diagnostics", "logs", "display",
                                                              "restart-agent"],
                                                    **commands_section})


def test_receipt_then_the_result_and_refusals_that_run_nothing(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    server = fleet()
    agent = spawn_agent(agent_python, cfg(server, tmp_path))
    agent.wait_live(15)
    cid = ask(server, "diagnostics")["id"]
    result = result_of(server, cid)
    record = commands(server)[cid]
    assert record["received"] and record["results"] == 1
    assert result["ok"] and result["name"] == "diagnostics"
    report = json.loads(result["output"])
    assert report["dns"]["addresses"] == ["127.0.0.1"] and report["path_mtu"] > 0
    assert report["status"]["link"]["state"] == "online"
    for name, args, extra, why in (
            ("reboot", {}, {}, "not allowed on this screen"),
            ("logs", {"since_s": "an hour"}, {}, "bad argument: since_s"),
            ("diagnostics", {}, {"expires_at": time.time() - 60}, "expired"),
            ("format-disk", {}, {}, "unknown command")):
        r = result_of(server, ask(server, name, args, **extra)["id"])
        assert r["ok"] is False and why in r["error"], (name, r)
        assert "started_at" not in r, "a refused command ran"
    status = agent.status()["commands"]
    assert [c["result"].split(":")[0] for c in status[-4:]] == ["refused"] * 4
    assert "server command" in agent.log_text()


def test_a_result_goes_again_until_confirmed_across_a_silent_drop(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    server = fleet()
    agent = spawn_agent(agent_python, cfg(server, tmp_path))
    link = agent.wait_live(15, connection=1)
    server.admin("/admin/behaviour", {"result_ack": "none"})  # confirmations get lost
    cid = ask(server, "diagnostics")["id"]
    result_of(server, cid)
    server.admin("/admin/behaviour", {"result_ack": "ok"})
    netns.drop_flow(int(link["local_addr"].rsplit(":", 1)[1]), server.port)
    agent.wait_live(15, connection=2)
    wait_for(lambda: commands(server)[cid]["results"] >= 2, 10, what="the result sent again")
    # the server counts the result before its confirmation is back and written: on CI
    # the ledger was read between the two
    wait_for(lambda: ledger.load(str(tmp_path / "state" / "commands.json"),
                                 time.time()).entries[cid].acked, 10,
             what="the confirmation kept in the ledger")
    netns.restore()
    before = commands(server)[cid]["results"]
    server.admin("/admin/throttle", {"device_id": "screen-1", "retry_after_s": 1})  # reconnect
    agent.wait_live(15, connection=3)
    time.sleep(1.0)
    assert commands(server)[cid]["results"] == before, "a confirmed result was sent again"


def test_at_most_once_across_kill_9_and_restart_agent(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    server = fleet()
    runs = tmp_path / "runs"
    config = cfg(server, tmp_path,
                 display_on_command=f"sh -c 'echo run >> {runs}; sleep 30'")
    agent = spawn_agent(agent_python, config)
    agent.wait_live(15)
    cid = ask(server, "display", {"state": "on"})["id"]
    wait_for(lambda: runs.exists(), 10, what="the command running")
    agent.proc.kill()  # in the middle of it
    agent.proc.wait(5)
    again = spawn_agent(agent_python, config)
    result = result_of(server, cid, 20)
    assert result["ok"] is False and "not run again" in result["error"]
    assert runs.read_text() == "run\n", "ran twice"
    # restart-agent: the process goes (systemd starts the next; here the test does)
    rid = ask(server, "restart-agent")["id"]
    assert again.proc.wait(15) == 0
    spawn_agent(agent_python, config).wait_live(15)
    r = result_of(server, rid, 20)
    assert r["ok"] and r["output"] == "the agent restarted"


def test_the_operator_command_line_waits_and_prints_the_result(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    server = fleet()
    spawn_agent(agent_python, cfg(server, tmp_path)).wait_live(15)
    r = subprocess.run([str(REPO / "scripts" / "fleet-server"), "command", "screen-1",
                        "diagnostics", "--url", server.url, "--wait", "20"],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "EDGE_AGENT_PYTHON": sys.executable})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ok"] is True
    r = subprocess.run([str(REPO / "scripts" / "fleet-server"), "command", "screen-1",
                        "reboot", "--url", server.url, "--wait", "20"],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "EDGE_AGENT_PYTHON": sys.executable})
    assert r.returncode == 2 and "not allowed" in r.stdout


def test_logs_outside_journald_come_from_the_agents_memory_through_the_queue(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    """Under systemd the bundle is the journal's (test_booted_systemd.py); a terminal or
    the demo has no journal, so the agent sends its own last lines, saying so."""
    import gzip
    server = fleet()
    spawn_agent(agent_python, cfg(server, tmp_path)).wait_live(15)
    result = result_of(server, ask(server, "logs", {"since_s": 600, "priority": 7})["id"])
    assert result["ok"] and result["source"].startswith("this process's memory")
    bundle = wait_for(lambda: _bundle(server, result["upload_id"]), 15,
                      what="the bundle through the upload queue")
    lines = [json.loads(x) for x in gzip.decompress(bundle).decode().splitlines()]
    assert len(lines) == result["lines"] > 0
    assert any(x["message"].startswith(f"edge-agent {agent_version} starting") and x["priority"] == 6
               for x in lines)


def _bundle(server, upload_id):
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(f"{server.url}/admin/uploads/screen-1/{upload_id}/content",
                                    timeout=5) as r:
            return r.read()
    except urllib.error.HTTPError:
        return None


def test_screenshot_and_display_run_the_configured_commands(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    import hashlib
    jpeg = tmp_path / "frame.jpg"
    jpeg.write_bytes(b"\xff\xd8\xff\xe0" + bytes(range(256)) * 8)
    marks = tmp_path / "display"
    server = fleet()
    config = agent_config(server, tmp_path, commands={
        "allow": ["screenshot", "display"], "screenshot_command": f"cat {jpeg}",
        "display_on_command": f"sh -c 'echo on > {marks}'",
        "display_off_command": "sh -c 'echo no such output >&2; exit 3'"})
    spawn_agent(agent_python, config).wait_live(15)
    shot = result_of(server, ask(server, "screenshot")["id"])
    assert shot["ok"], shot
    wait_for(lambda: server.device().get("uploads", 0) >= 1, 15, what="the screenshot upload")
    stored = server.admin("/admin/uploads/screen-1")
    assert stored[shot["upload_id"]] == ["screenshot", hashlib.sha256(jpeg.read_bytes()).hexdigest()]
    on = result_of(server, ask(server, "display", {"state": "on"})["id"])
    assert on["ok"] and marks.read_text() == "on\n"
    off = result_of(server, ask(server, "display", {"state": "off"})["id"])
    assert off["ok"] is False and "exited 3: no such output" in off["error"]


def test_a_shell_line_from_the_operators_command_line_runs_as_the_agent_and_answers_its_exit(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    """The agent's own protocol: `fleet-server command ... shell --cmd` runs one line in
    the agent's process's user, answers its output and exit; set-time with no time in
    bounds is refused before anything runs."""
    server = fleet()
    spawn_agent(agent_python, cfg(server, tmp_path, allow=["diagnostics", "shell", "set-time"],
                                  timeout_s=5)).wait_live(15)

    def operator(*argv):
        return subprocess.run([str(REPO / "scripts" / "fleet-server"), "command", "screen-1",
                               *argv, "--url", server.url, "--wait", "20"],
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "EDGE_AGENT_PYTHON": sys.executable})
    r = operator("shell", "--cmd", "id -u; echo to-stderr >&2; exit 5")
    result = json.loads(r.stdout)
    assert (result["ok"], result["exit"], result["error"]) == (False, 5, "exited 5"), result
    assert result["output"] == f"{os.getuid()}\nto-stderr\n"
    r = operator("shell", "--cmd", "echo $((40 + 2))")
    assert r.returncode == 0 and json.loads(r.stdout)["output"] == "42\n", r
    r = operator("set-time", "--time", "2027-01-15T08:00:00")   # no offset
    result = json.loads(r.stdout)
    assert result["ok"] is False and "started_at" not in result
    assert "bad argument: time: ISO 8601 needs its offset" in result["error"]
