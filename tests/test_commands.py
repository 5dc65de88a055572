"""Remote operations, sans I/O: at most once, expiry, allow-list, arguments, results."""
import json
import os

from agent.commands import ledger
from agent.commands.core import CommandCore, Report, Run

ALL = frozenset({"diagnostics", "logs", "reboot", "restart-agent", "display", "screenshot"})


def core(allow=ALL, entries=None):
    return CommandCore(frozenset(allow), dict(entries or {}))


def results(actions):
    return [a.result for a in actions if isinstance(a, Report)]


def test_a_command_runs_once_and_its_result_goes_until_acked():
    c = core()
    [run] = c.receive({"id": "c1", "name": "logs", "args": {"since_s": 600}}, now=100.0)
    assert run == Run("c1", "logs", {"since_s": 600, "priority": 6}) and c.dirty
    assert c.receive({"id": "c1", "name": "logs"}, now=101.0) == [], "a resend never runs twice"
    [report] = c.finished("c1", True, "42 lines", None, 100.5, now=102.0)
    assert report.result["ok"] and report.result["output"] == "42 lines"
    assert results(c.receive({"id": "c1", "name": "logs"}, now=103.0)) == [report.result]
    assert results(c.unacked()) == [report.result]
    c.result_acked("c1")
    assert c.unacked() == []


def test_refusals_are_results_and_run_nothing():
    c = core(allow={"diagnostics"})
    cases = {
        "e": ({"name": "diagnostics", "expires_at": 50.0}, "expired"),
        "u": ({"name": "format-disk"}, "unknown command"),
        "a": ({"name": "reboot"}, "not allowed on this screen"),
        "b": ({"name": "diagnostics", "args": {"x": 1}}, "bad argument"),
        "m": ({"name": "diagnostics", "args": [1]}, "malformed: args"),
        "t": ({"name": "diagnostics", "expires_at": "soon"}, "malformed: expires_at"),
    }
    for cid, (body, why) in cases.items():
        actions = c.receive({"id": cid, **body}, now=100.0)
        assert not [a for a in actions if isinstance(a, Run)], cid
        [r] = results(actions)
        assert r["ok"] is False and why in r["error"], (cid, r)
    assert c.receive("not a command", now=1.0) == [] and c.receive({"name": "x"}, now=1.0) == []
    assert c.receive({"id": "x" * 65, "name": "diagnostics"}, now=1.0) == []


def test_a_reboot_interrupted_by_its_reboot_is_done_not_run_again(tmp_path):
    path = str(tmp_path / "commands.json")
    c = core()
    [run] = c.receive({"id": "r1", "name": "reboot"}, now=100.0, boot_id="boot-a", pid=10)
    ledger.save(path, c.entries)           # durable before it runs: then the power goes
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    after = core(entries=ledger.load(path))
    [r] = results(after.recover("boot-b", pid=20, now=200.0))
    assert r["ok"] and r["output"] == "the device rebooted"
    assert after.receive({"id": "r1", "name": "reboot"}, now=201.0, boot_id="boot-b") \
        == [Report(r)], "the server's resend of the reboot is answered, not run"
    # the same boot (the agent was killed before the reboot happened): not done, not rerun
    c2 = core()
    c2.receive({"id": "r2", "name": "reboot"}, now=100.0, boot_id="boot-a", pid=10)
    [r2] = results(c2.recover("boot-a", pid=11, now=101.0))
    assert r2["ok"] is False and "not run again" in r2["error"]


def test_a_corrupt_ledger_is_kept_aside(tmp_path):
    path = tmp_path / "commands.json"
    path.write_bytes(b"\x00garbage")
    assert ledger.load(str(path)) == {}
    assert [p for p in os.listdir(tmp_path) if p.startswith("commands.json.corrupt-")]
    path.write_text(json.dumps({"entries": [{"id": "k", "name": "logs", "state": "done",
                                             "received_at": 1.0}, {"bogus": 1}]}))
    assert list(ledger.load(str(path))) == ["k"]


def test_the_ledger_stays_bounded():
    c = core()
    for i in range(600):
        c.receive({"id": f"c{i}", "name": "diagnostics"}, now=float(i))
        c.finished(f"c{i}", True, "ok", None, None, now=float(i))
        c.result_acked(f"c{i}")
    assert len(c.entries) <= 257
