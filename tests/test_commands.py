"""Remote operations, sans I/O: at most once, expiry, allow-list, arguments, results."""
import json
import os

import pytest

from agent.commands import ledger
from agent.commands.core import MAX_ENTRIES, CommandCore, Report, Run

ALL = frozenset({"diagnostics", "logs", "reboot", "restart-agent", "display", "screenshot"})


def core(allow=ALL, entries=None):
    return CommandCore(frozenset(allow), dict(entries or {}))


def persist(path, c):
    """As the service does before anything the core decided is done."""
    changes, durable = c.take_changes()
    ledger.Ledger(path, ledger.load(path, 0.0)).write(changes, c.horizon(), durable,
                                                      lambda: list(c.entries.values()))


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


HUGE = 10 ** 400   # a JSON integer Python reads whole; math.isfinite(HUGE) raises OverflowError


def test_a_number_too_large_for_a_float_is_refused_not_raised():
    """A server's integer of 400 digits where a number is asked: each place that asked
    "a finite number?" with math.isfinite raised OverflowError into the link's thread;
    one rule (config/revision.finite) answers no."""
    c = core(allow={"diagnostics", "brightness", "set-time", "configure"})
    cases = {
        "x": ({"name": "diagnostics", "expires_at": HUGE}, "malformed: expires_at"),
        "l": ({"name": "brightness", "args": {"level": HUGE}}, "bad argument: level"),
        "s": ({"name": "set-time", "args": {"time": HUGE}}, "bad argument: time"),
        "c": ({"name": "configure", "args": {"settings": {"log.level": {
            "value": "debug", "expires_in_s": HUGE}}}}, "bad argument: settings.log.level"),
        "v": ({"name": "configure", "args": {"settings": {"log.level": HUGE}}}, "bad argument"),
    }
    for cid, (body, why) in cases.items():
        actions = c.receive({"id": cid, **body}, now=100.0)
        assert not [a for a in actions if isinstance(a, Run)], cid
        [r] = results(actions)
        assert r["ok"] is False and why in r["error"], (cid, r)


def test_a_reboot_interrupted_by_its_reboot_is_done_not_run_again(tmp_path):
    path = str(tmp_path / "commands.json")
    c = core()
    [run] = c.receive({"id": "r1", "name": "reboot"}, now=100.0, boot_id="boot-a", pid=10)
    persist(path, c)                       # durable before it runs: then the power goes
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    after = core(entries=ledger.load(path, 0.0).entries)
    [r] = results(after.recover("boot-b", pid=20, now=200.0))
    assert r["ok"] and r["output"] == "the device rebooted"
    assert results(after.receive({"id": "r1", "name": "reboot"}, now=201.0, boot_id="boot-b")) \
        == [r], "the server's resend of the reboot is answered, not run"
    # the same boot (the agent was killed before the reboot happened): not done, not rerun
    c2 = core()
    c2.receive({"id": "r2", "name": "reboot"}, now=100.0, boot_id="boot-a", pid=10)
    [r2] = results(c2.recover("boot-a", pid=11, now=101.0))
    assert r2["ok"] is False and "not run again" in r2["error"]


def test_a_corrupt_ledger_is_kept_aside(tmp_path):
    path = tmp_path / "commands.json"
    path.write_bytes(b"\x00garbage\n")
    assert ledger.load(str(path), 0.0).entries == {}
    assert [p for p in os.listdir(tmp_path) if p.startswith("commands.json.corrupt-")]
    path.write_text(json.dumps({"entries": [{"id": "k", "name": "logs", "state": "done",
                                             "received_at": 1.0}, {"bogus": 1}]}))
    assert list(ledger.load(str(path), 0.0).entries) == ["k"]


def test_the_ledger_stays_bounded():
    c = core()
    for i in range(600):
        c.receive({"id": f"c{i}", "name": "diagnostics"}, now=3.0 * i)
        c.finished(f"c{i}", True, "ok", None, None, now=3.0 * i)
        c.result_acked(f"c{i}")
    assert len(c.entries) <= MAX_ENTRIES


def test_a_bundle_the_queue_refuses_says_why_in_the_result():
    """Outside journald the logs action bundles the agent's recent lines; a queue that
    refuses them (full, a read-only card) is named in the result, not guessed at."""
    from types import SimpleNamespace

    from agent.commands.actions import Actions, NotQueued

    def refuse(kind, payload):
        raise NotQueued("the state partition is read-only: /var/lib/edge-agent/queue")

    actions = Actions(SimpleNamespace(timeout_s=5), "http://fleet.invalid", snapshot=dict,
                      link_socket=lambda: None, request_restart=lambda: None, enqueue=refuse)
    outcome = actions.logs({"since_s": 60, "priority": 6})
    assert outcome.ok is False
    assert outcome.error == ("the bundle was not queued: the state partition is read-only: "
                             "/var/lib/edge-agent/queue")


def test_a_timed_out_command_never_holds_the_commands_thread(tmp_path):
    """A command that leaves a grandchild in a session of its own holding its output
    pipe: the timeout ends the wait at once; reading on after the kill would wait for
    the grandchild, and every later command with it."""
    import time
    from types import SimpleNamespace

    from agent.commands.actions import Actions
    from agent.screen.power import DisplayPower
    config = SimpleNamespace(timeout_s=1.0, display_off_command=None,
                             display_on_command="sh -c 'setsid sleep 8 & sleep 5'")
    power = DisplayPower(config.display_on_command, None, config.timeout_s, None,
                         lambda event: None)
    actions = Actions(config, "http://fleet.invalid", snapshot=dict, link_socket=lambda: None,
                      request_restart=lambda: None, enqueue=lambda *a: "x", power=power)
    t0 = time.monotonic()
    outcome = actions.run("display", {"state": "on"})
    took = time.monotonic() - t0
    assert outcome.ok is False and outcome.error == "sh timed out after 1 s"
    assert took < 3.0, f"the command thread was held {took:.1f}s"


@pytest.mark.parametrize("command", [
    "sh -c 'sleep 5' tv --password=hunter2",             # past its timeout
    "sh -c 'echo no answer >&2; exit 3' tv --password=hunter2",
    "/nonexistent/tvctl --password=hunter2",
    "sh -c 'exec \"$0\"' /nonexistent/x --password=hunter2"])
def test_a_failed_command_never_tells_its_command_line(command):
    """A TV's control tool takes its password on the command line; what the fleet, the
    status file and the journal hear of a failure is the program, its exit status and
    its last stderr line (Python's TimeoutExpired text held the whole argv)."""
    from types import SimpleNamespace

    from agent.commands.actions import Actions
    from agent.screen.power import DisplayPower
    config = SimpleNamespace(timeout_s=0.5, display_off_command=None,
                             display_on_command=command, screenshot_command=command)
    power = DisplayPower(command, None, config.timeout_s, None, lambda event: None)
    actions = Actions(config, "http://fleet.invalid", snapshot=dict, link_socket=lambda: None,
                      request_restart=lambda: None, enqueue=lambda *a: "x", power=power)
    for name, args in (("display", {"state": "on"}), ("screenshot", {})):
        outcome = actions.run(name, args)
        assert outcome.ok is False and outcome.error
        assert "hunter2" not in outcome.error and "password" not in outcome.error, outcome.error


def test_every_command_the_core_admits_has_exactly_one_action():
    from types import SimpleNamespace

    from agent.commands.actions import Actions
    from agent.commands.core import COMMANDS
    actions = Actions(SimpleNamespace(timeout_s=5), "http://fleet.invalid", snapshot=dict,
                      link_socket=lambda: None, request_restart=lambda: None,
                      enqueue=lambda *a: None)
    assert set(actions.commands) == set(COMMANDS)


def test_a_logs_bundle_the_profile_cannot_deliver_is_never_made(monkeypatch):
    """ScreenTinker can send a command of type "logs", and its link carries screenshots
    and plays only: the journal is not read and nothing is queued."""
    from types import SimpleNamespace

    from agent.commands import actions as actions_mod
    from agent.link.profiles import PROFILES, uncarried

    def no_gate(*a, **k):
        raise AssertionError("the journal was read for a bundle nobody can deliver")

    monkeypatch.setattr(actions_mod.journal_wire, "ask", no_gate)
    monkeypatch.setattr(actions_mod, "under_journal", lambda: True)
    queued = []
    actions = actions_mod.Actions(
        SimpleNamespace(timeout_s=5), "http://fleet.invalid", snapshot=dict, link_socket=lambda: None,
        request_restart=lambda: None, enqueue=lambda *a: queued.append(a) or "u",
        undeliverable=lambda kind: uncarried(PROFILES["screentinker"], kind))
    outcome = actions.run("logs", {"since_s": 60, "priority": 6})
    assert outcome.ok is False and queued == []
    assert outcome.error.startswith("the screentinker profile carries no log uploads")
