"""The journal gate (agent/programs/journal_gate.py): the request the helper takes, the reply the
agent reads, over a real UNIX socket, with the helper's real process (`python3 -m
agent.programs.journal_gate`, the connection as its stdin and stdout, as systemd's Accept=yes
gives it) running a journalctl that prints what it was asked. The real journalctl,
socket unit and sandbox are proven under real systemd (tests/test_booted_systemd.py)."""
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent.base import journal_wire as wire
from agent.programs import journal_gate as gate

REPO = Path(__file__).resolve().parent.parent
# stands in for journalctl: one JSON line per argument, and a failure when asked
FAKE_JOURNALCTL = """#!/bin/sh
if [ -n "$FAIL" ]; then echo "Failed to open journal: $FAIL" >&2; exit 1; fi
for a in "$@"; do printf '{"MESSAGE": "%s", "PRIORITY": "6", "_PID": "7"}\\n' "$a"; done
"""


@pytest.fixture
def helper(tmp_path):
    """A listening socket whose connections each get a real helper process."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "journalctl").write_text(FAKE_JOURNALCTL)
    (bin_dir / "journalctl").chmod(0o755)
    path = str(tmp_path / "gate.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)
    env = {"PYTHONPATH": str(REPO), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    procs = []

    def accept_loop():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                procs.append(subprocess.Popen([sys.executable, "-m", "agent.programs.journal_gate"],
                                              stdin=conn, stdout=conn, cwd=REPO, env=env,
                                              stderr=subprocess.PIPE))

    t = threading.Thread(target=accept_loop, daemon=True)
    t.start()
    yield path, env, procs
    listener.close()
    for p in procs:
        p.wait(10)


def test_the_agent_gets_journalctl_for_exactly_its_unit_and_window(helper):
    path, _, procs = helper
    body = wire.fetch(wire.Request(1_700_000_000, 4, 500), timeout=10, path=path)
    argv = [json.loads(line)["MESSAGE"] for line in body.splitlines()]
    assert argv == ["--no-pager", "--quiet", "--output=json",
                    "--output-fields=MESSAGE,PRIORITY,_PID", "--unit=edge-agent.service",
                    "--since=@1700000000", "--priority=4", "--lines=500"]
    procs[0].wait(10)
    assert procs[0].returncode == 0


@pytest.mark.parametrize("raw, error", [
    (b"1700000000 6 100", "request: not one line ending in a newline"),
    (b"1700000000 8 100\n", "priority: 8 is not 0-7"),
    (b"1700000000 6 0\n", "lines: 0 is not 1-20000"),
    (b"1700000000 6 20001\n", "lines: 20001 is not 1-20000"),
    (b"-5 6 100\n", "request: expected '<since> <priority> <lines>', decimal integers"),
    (b"1700000000 6 100 --unit=ssh.service\n", "request: expected"),
    (b"1700000000 6 1e3\n", "request: expected"),
    (b"\xff\xfe 6 1\n", "request: expected"),
    (b"1" * 200 + b"\n", "request: not one line ending in a newline"),
])
def test_the_helper_refuses_a_bad_request_in_one_line_naming_the_field(helper, raw, error):
    path, _, procs = helper
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(raw)
        s.shutdown(socket.SHUT_WR)
        reply = b"".join(iter(lambda: s.recv(4096), b""))
    assert reply.startswith(b"error " + error.encode()) and reply.count(b"\n") == 1, reply
    procs[0].wait(10)
    stderr = procs[0].stderr.read().decode()
    assert procs[0].returncode == 1 and "edge-agent-logs: refused: " in stderr, stderr
    assert "Traceback" not in stderr


def test_a_failing_journalctl_reaches_the_agent_as_one_line(helper):
    path, env, _ = helper
    env["FAIL"] = "Permission denied"
    with pytest.raises(wire.GateError, match="journalctl exited 1: Failed to open journal: "
                                             "Permission denied"):
        wire.fetch(wire.Request(0, 6, 10), timeout=10, path=path)


def test_no_gate_a_silent_gate_and_a_cut_reply_are_clear_errors(tmp_path):
    with pytest.raises(wire.GateError, match="no such socket"):
        wire.fetch(wire.Request(0, 6, 10), timeout=1, path=str(tmp_path / "absent.sock"))

    path = str(tmp_path / "g.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)
    replies = [None, b"ok 100 0\n" + b"x" * 10, b"HTTP/1.1 200 OK\r\n"]

    def serve():
        for reply in replies:
            conn, _ = listener.accept()
            conn.recv(100)
            if reply is None:
                time.sleep(1.0)   # never answers within the agent's timeout
            else:
                conn.sendall(reply)
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    t0 = time.monotonic()
    with pytest.raises(wire.GateError, match=r"no answer in 0.3s"):
        wire.fetch(wire.Request(0, 6, 10), timeout=0.3, path=path)
    assert time.monotonic() - t0 < 0.9
    with pytest.raises(wire.GateError, match=r"the reply was cut short \(10 of 100 bytes\)"):
        wire.fetch(wire.Request(0, 6, 10), timeout=5, path=path)
    with pytest.raises(wire.GateError, match="not a reply"):
        wire.fetch(wire.Request(0, 6, 10), timeout=5, path=path)
    t.join(5)
    listener.close()


def test_the_socket_unit_listens_where_the_agent_connects():
    unit = (REPO / "systemd" / "edge-agent-logs.socket").read_text()
    assert f"ListenStream={wire.SOCKET}\n" in unit
    for directive in ("Accept=yes", "SocketUser=edge-agent", "SocketGroup=edge-agent",
                      "SocketMode=0600", "RemoveOnStop=yes"):
        assert directive + "\n" in unit, directive
    helper_unit = (REPO / "systemd" / "edge-agent-logs@.service").read_text()
    assert "ExecStart=/usr/bin/python3 -I -m agent.programs.journal_gate\n" in helper_unit


BIG_JOURNALCTL = """#!/bin/sh
# 38 MB of journal lines, as a month of a busy agent's journal
exec python3 -c '
import sys
line = b"{\\"MESSAGE\\": \\"%s\\", \\"PRIORITY\\": \\"6\\", \\"_PID\\": \\"7\\", \\"__REALTIME_TIMESTAMP\\": \\"1700000000000000\\"}\\n"
out = sys.stdout.buffer
for i in range(200_000):
    out.write(line % (b"x%07d " % i + b"y" * 160))
'
"""


def test_a_huge_journal_is_bounded_at_both_ends_and_the_newest_lines_kept(helper, monkeypatch):
    """A 38 MB journal once took the agent to 188 MB (MemoryMax=128M): the helper keeps
    the newest lines that fit, the agent reads them a line at a time into the
    compressed bundle."""
    import gzip
    import tracemalloc
    from types import SimpleNamespace

    from agent.commands import actions as actions_mod
    path, env, procs = helper
    bin_dir = os.path.dirname(env["PATH"].split(":")[0] + "/")
    with open(os.path.join(bin_dir, "journalctl"), "w") as f:
        f.write(BIG_JOURNALCTL)
    monkeypatch.setattr(actions_mod, "under_journal", lambda: True)
    monkeypatch.setattr(wire, "SOCKET", path)
    queued = []
    actions = actions_mod.Actions(SimpleNamespace(timeout_s=60), "http://fleet.invalid", snapshot=dict,
                                  link_socket=lambda: None, request_restart=lambda: None,
                                  enqueue=lambda kind, data: queued.append(data) or "u1")
    tracemalloc.start()
    try:
        outcome = actions.logs({"since_s": 3600, "priority": 7})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert outcome.ok, outcome.error
    assert peak < 16 << 20, f"the agent held {peak >> 20} MiB"
    lines = gzip.decompress(queued[0]).splitlines()
    assert outcome.extra["lines"] == len(lines) and outcome.extra["dropped"] > 100_000
    assert json.loads(lines[-1])["message"].startswith("x0199999 ")   # the newest kept
    assert "older lines left out" in outcome.output
    procs[0].wait(30)
    assert procs[0].returncode == 0
    # the helper's own side, measured in this process: what it holds is the newest lines
    # within the bound, and their reply (MemoryMax=96M for the whole helper)
    tracemalloc.start()
    try:
        body, dropped = gate._newest([os.path.join(bin_dir, "journalctl")], subprocess.Popen)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(body) <= wire.MAX_BODY_BYTES and dropped > 100_000
    assert peak < 3 * wire.MAX_BODY_BYTES, f"the helper held {peak >> 20} MiB"


def test_a_gate_offering_more_than_the_bound_is_refused_unread(tmp_path):
    path = str(tmp_path / "g.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def serve():
        conn, _ = listener.accept()
        conn.recv(100)
        conn.sendall(b"ok 999999999 0\n" + b"x" * 1000)
        conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    with pytest.raises(wire.GateError, match="the gate offered 999999999 bytes"):
        wire.fetch(wire.Request(0, 6, 10), timeout=5, path=path)
    t.join(5)
    listener.close()
