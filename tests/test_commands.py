"""Remote operations, sans I/O: at most once, expiry, allow-list, arguments, results.

The core through its one way in, ``handle(event) -> [effect]``, on a fake clock."""
import json
import os

import pytest

from agent.commands import ledger
from agent.commands.core import (MAX_ENTRIES, CommandCore, Connected, Finished, Persist,
                                 Received, Recovered, Report, ResultAcked, Run)

ALL = frozenset({"diagnostics", "logs", "reboot", "restart-agent", "display", "screenshot"})


def core(allow=ALL, entries=None):
    return CommandCore(frozenset(allow), dict(entries or {}))


def receive(c, raw, now, boot="", pid=0):
    """A command at fake wall and monotonic time ``now``."""
    return c.handle(Received(raw, now, now, None, boot, pid))


def persist(path, c, effects):
    """As the service does before anything after it in ``effects`` is done."""
    lg = ledger.Ledger(path, ledger.load(path, 0.0))
    for p in effects:
        if isinstance(p, Persist):
            lg.write(list(p.changes), p.horizon, p.durable, lambda: list(c.entries.values()))


def results(effects):
    return [a.result for a in effects if isinstance(a, Report)]


def runs(effects):
    return [a for a in effects if isinstance(a, Run)]


def test_a_command_runs_once_and_its_result_goes_until_acked():
    c = core()
    [persist_, run] = receive(c, {"id": "c1", "name": "logs", "args": {"since_s": 600}}, 100.0)
    assert run == Run("c1", "logs", {"since_s": 600, "priority": 6})
    assert persist_.durable and [cid for cid, _ in persist_.changes] == ["c1"]
    assert receive(c, {"id": "c1", "name": "logs"}, 101.0) == [], "a resend never runs twice"
    [kept, report] = c.handle(Finished("c1", True, "42 lines", None, 100.5, now=102.0))
    assert isinstance(kept, Persist) and kept.durable
    assert report.result["ok"] and report.result["output"] == "42 lines"
    assert results(receive(c, {"id": "c1", "name": "logs"}, 103.0)) == [report.result]
    assert results(c.handle(Connected())) == [report.result]
    [acked] = c.handle(ResultAcked("c1"))
    assert isinstance(acked, Persist) and not acked.durable, "a confirmation is only appended"
    assert c.handle(Connected()) == []
    assert c.handle(ResultAcked("c1")) == [], "nothing changed, nothing written"


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
        effects = receive(c, {"id": cid, **body}, 100.0)
        assert not runs(effects), cid
        [r] = results(effects)
        assert r["ok"] is False and why in r["error"], (cid, r)
        # remembered (its resend is answered the same) but not synced: it did nothing
        [p] = [e for e in effects if isinstance(e, Persist)]
        assert not p.durable, cid
    assert receive(c, "not a command", 1.0) == [] and receive(c, {"name": "x"}, 1.0) == []
    assert receive(c, {"id": "x" * 65, "name": "diagnostics"}, 1.0) == []


class Card:
    """What a power cut leaves of the ledger: the Persists the shell did, up to the last
    synced one (an fdatasync takes every line appended before it)."""

    def __init__(self):
        self.written, self.synced = {}, {}

    def persist(self, p):
        for cid, entry in p.changes:
            self.written.pop(cid, None)
            if entry is not None:
                self.written[cid] = entry
        if p.durable:
            self.synced = dict(self.written)


def test_nothing_runs_or_is_reported_that_a_power_cut_could_take_from_the_ledger():
    """The order of the effects is the rule: a Persist, synced, comes before every Run
    it records (at most once across a power cut) and before every kept result of a
    command that was given to run (what it did can always be reported). Every kind of
    event, through the flood, the refusals, forgetting, a restart."""
    c = core(allow={"diagnostics", "reboot", "restart-agent"})
    card, ran, t = Card(), set(), 1000.0

    def drive(event):
        effects = c.handle(event)
        for i, effect in enumerate(effects):
            if isinstance(effect, Persist):
                assert i == 0, f"a Persist after what it records: {effects}"
                card.persist(effect)
            elif isinstance(effect, Run):
                on_card = card.synced.get(effect.id)
                assert on_card is not None and on_card.state == "running", \
                    f"{effect.id} runs before the card holds it: {effects}"
                assert effect.id not in ran, f"{effect.id} ran twice"
                ran.add(effect.id)
            elif effect.kept and not isinstance(event, Connected):
                # appended before it is said; synced if the command was given to run (a
                # refusal lost to a power cut is refused again when it is sent again)
                cid = effect.result["id"]
                on_card = (card.synced if card.written[cid].admitted else card.written).get(cid)
                assert on_card is not None and on_card.result == effect.result, \
                    f"a result said before the card holds it: {effects}"
        return effects

    n = 3 * MAX_ENTRIES
    for i in range(n):
        name = ("diagnostics", "reboot", "format-disk", "restart-agent")[i % 4]
        raw = {"id": f"c{i}", "name": name, "expires_at": t + 300}
        for effect in drive(Received(raw, t, t, t, "boot-a", 10)):
            # the last reboot and restart-agent are running when the power goes
            if isinstance(effect, Run) and (name == "diagnostics" or i < n - 8):
                drive(Finished(effect.id, True, "ok", None, t, t + 1))
                if i % 3:
                    drive(ResultAcked(effect.id))
        drive(Connected())
        drive(Received(raw, t, t, t, "boot-a", 10))   # a resend: answered, never run
        t += 3.0
    assert len(ran) > MAX_ENTRIES and c.floor is not None and c.running("reboot")
    # the power goes: what the card synced is all the next start knows
    c = CommandCore(frozenset({"diagnostics", "reboot", "restart-agent"}),
                    dict(card.synced), c.floor, c.closed)
    drive(Recovered("boot-b", 11, t))
    assert not c.running("reboot") and not c.running("restart-agent")
    for i in range(n):   # the server sends them all again: none runs
        raw = {"id": f"c{i}", "name": "diagnostics", "expires_at": 1000.0 + 3.0 * i + 300}
        assert not runs(drive(Received(raw, t, t + 3.0 * i, t, "boot-b", 11))), raw["id"]


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
        effects = receive(c, {"id": cid, **body}, 100.0)
        assert not runs(effects), cid
        [r] = results(effects)
        assert r["ok"] is False and why in r["error"], (cid, r)


def test_a_reboot_interrupted_by_its_reboot_is_done_not_run_again(tmp_path):
    path = str(tmp_path / "commands.json")
    c = core()
    effects = receive(c, {"id": "r1", "name": "reboot"}, 100.0, boot="boot-a", pid=10)
    persist(path, c, effects)                # durable before it runs: then the power goes
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    after = core(entries=ledger.load(path, 0.0).entries)
    [r] = results(after.handle(Recovered("boot-b", pid=20, now=200.0)))
    assert r["ok"] and r["output"] == "the device rebooted"
    assert results(receive(after, {"id": "r1", "name": "reboot"}, 201.0, boot="boot-b")) \
        == [r], "the server's resend of the reboot is answered, not run"
    # the same boot (the agent was killed before the reboot happened): not done, not rerun
    c2 = core()
    receive(c2, {"id": "r2", "name": "reboot"}, 100.0, boot="boot-a", pid=10)
    [r2] = results(c2.handle(Recovered("boot-a", pid=11, now=101.0)))
    assert r2["ok"] is False and "not run again" in r2["error"]
    # a restart-agent from another process is done; the start always gives its Persist
    c3 = core()
    receive(c3, {"id": "a1", "name": "restart-agent"}, 100.0, boot="boot-a", pid=10)
    [p, r3] = c3.handle(Recovered("boot-a", pid=11, now=101.0))
    assert p.durable and r3.result["output"] == "the agent restarted"
    [nothing_changed] = c3.handle(Recovered("boot-a", pid=12, now=102.0))
    assert nothing_changed.changes == () and not nothing_changed.durable


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
        receive(c, {"id": f"c{i}", "name": "diagnostics"}, 3.0 * i)
        c.handle(Finished(f"c{i}", True, "ok", None, None, now=3.0 * i))
        c.handle(ResultAcked(f"c{i}"))
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


def test_the_service_does_the_effects_in_order_and_runs_nothing_the_ledger_refused(tmp_path):
    """The shell's half of the rule: the Persist is written before the Run is queued,
    and a Run whose Persist failed (a full card) is never queued: its result says why."""
    import errno

    from agent.commands.actions import Actions
    from agent.commands.service import CommandService
    path = tmp_path / "commands.jsonl"
    service = CommandService(str(path), frozenset({"diagnostics"}), Actions.__new__(Actions),
                             runtime_dir=str(tmp_path))
    order, write = [], service._ledger.write

    def recorded(changes, *rest):
        order.append(("write", [cid for cid, _ in changes]))
        write(changes, *rest)

    service._ledger.write = recorded
    service._jobs.put = lambda job: order.append(("run", job.id, path.read_bytes()))
    # on the commands thread, as served: the raw message to the core, then its effects
    assert service._received({"id": "c1", "name": "diagnostics"}) == []
    service._run_in_order()   # then the commands thread starts it, in its turn
    assert [o[:2] for o in order] == [("write", ["c1"]), ("run", "c1")]
    assert b'"c1"' in order[1][2], "queued before the ledger held it"

    def full(changes, *rest):
        order.append(("write", [cid for cid, _ in changes]))
        raise OSError(errno.ENOSPC, "No space left on device")

    service._ledger.write = full
    [report] = service._received({"id": "c2", "name": "diagnostics"})
    service._run_in_order()
    assert report.result["ok"] is False and report.result["error"] == \
        "not run: the command ledger could not be written (No space left on device)"
    assert [o[:2] for o in order[2:]] == [("write", ["c2"]), ("write", ["c2"])], \
        "c2 was queued to run on a ledger that does not hold it"


# What the last release (before handle()) wrote for: diagnostics d1 run, finished and
# confirmed; format-disk x1 refused; reboot r1 running when the power went; d1 forgotten.
LAST_RELEASE = (
    b'{"v":2,"floor":null,"closed":false}\n'
    b'{"e":{"id":"d1","name":"diagnostics","state":"running","received_at":1000.0,'
    b'"boot_id":"boot-a","pid":7,"result":null,"acked":false,"expires_at":1300,'
    b'"admitted":true}}\n'
    b'{"e":{"id":"d1","name":"diagnostics","state":"done","received_at":1000.0,'
    b'"boot_id":"boot-a","pid":7,"result":{"id":"d1","name":"diagnostics","ok":true,'
    b'"received_at":1000.0,"finished_at":1001.0,"started_at":1000.5,"output":"fine"},'
    b'"acked":false,"expires_at":1300,"admitted":true}}\n'
    b'{"e":{"id":"d1","name":"diagnostics","state":"done","received_at":1000.0,'
    b'"boot_id":"boot-a","pid":7,"result":{"id":"d1","name":"diagnostics","ok":true,'
    b'"received_at":1000.0,"finished_at":1001.0,"started_at":1000.5,"output":"fine"},'
    b'"acked":true,"expires_at":1300,"admitted":true}}\n'
    b'{"e":{"id":"x1","name":"format-disk","state":"done","received_at":1002.0,'
    b'"boot_id":"boot-a","pid":7,"result":{"id":"x1","name":"format-disk","ok":false,'
    b'"received_at":1002.0,"finished_at":1002.0,"error":"unknown command \'format-disk\'"},'
    b'"acked":false,"expires_at":1310,"admitted":false}}\n'
    b'{"e":{"id":"r1","name":"reboot","state":"running","received_at":1003.0,'
    b'"boot_id":"boot-a","pid":7,"result":null,"acked":false,"expires_at":1320,'
    b'"admitted":true}}\n'
    b'{"forget":"d1","floor":1300.0,"closed":false}\n')


def test_the_ledger_is_the_last_releases_line_for_line(tmp_path):
    """The same events write the same bytes as the release before handle(), and what
    that release left on a card is taken up: the interrupted reboot is done, the
    forgotten command too old, the refusal answered again."""
    path = str(tmp_path / "commands.json")
    c = core(allow={"diagnostics", "reboot"})
    for event in (Received({"id": "d1", "name": "diagnostics", "expires_at": 1300}, 1000.0,
                           1.0, None, "boot-a", 7),
                  Finished("d1", True, "fine", None, 1000.5, 1001.0), ResultAcked("d1"),
                  Received({"id": "x1", "name": "format-disk", "expires_at": 1310}, 1002.0,
                           5.0, None, "boot-a", 7),
                  Received({"id": "r1", "name": "reboot", "expires_at": 1320}, 1003.0, 9.0,
                           None, "boot-a", 7)):
        persist(path, c, c.handle(event))
    with open(path, "rb") as f:
        assert f.read() == LAST_RELEASE[:LAST_RELEASE.index(b'{"forget"')]
    with open(path, "wb") as f:
        f.write(LAST_RELEASE)
    loaded = ledger.load(path, 2000.0)
    assert list(loaded.entries) == ["x1", "r1"] and loaded.floor == 1300.0 and not loaded.rewrite
    after = CommandCore(frozenset({"diagnostics", "reboot"}), loaded.entries, loaded.floor,
                        loaded.closed)
    [p, r] = after.handle(Recovered("boot-b", 8, 2000.0))
    assert p.durable and r.result["output"] == "the device rebooted"
    [too_old] = results(receive(after, {"id": "d1", "name": "diagnostics",
                                        "expires_at": 1300}, 2001.0))
    assert "too old" in too_old["error"]
    [again] = results(receive(after, {"id": "x1", "name": "format-disk"}, 2002.0))
    assert again["error"] == "unknown command 'format-disk'"


def test_a_flood_while_the_commands_thread_is_held_is_bounded_and_never_recorded_unread(
        tmp_path):
    """A hostile server's flood while the commands thread is held (a card slow to sync, a
    send on a connection that stopped reading): at most RECEIVED_WAITING commands wait,
    the rest are dropped unrecorded (before: 448,121 queued in 3 s, 190 MB, past the
    unit's MemoryMax: an OOM kill a server could repeat)."""
    from agent.commands.actions import Actions
    from agent.commands.service import RECEIVED_WAITING, CommandService
    service = CommandService(str(tmp_path / "commands.jsonl"), frozenset({"diagnostics"}),
                             Actions.__new__(Actions), runtime_dir=str(tmp_path))
    receipts = []
    for n in range(10 * RECEIVED_WAITING):   # the commands thread never started: held
        service.serve({"id": f"c{n}", "name": "diagnostics"},
                      lambda n=n: receipts.append(n))
    assert service._news.qsize() == RECEIVED_WAITING
    assert receipts == [], "no receipt for a command the ledger does not hold"
    # one taken in by the commands thread makes room for one more
    service._news.get_nowait()
    service._room.release()
    service.serve({"id": "late", "name": "diagnostics"})
    assert service._news.qsize() == RECEIVED_WAITING


def test_a_command_the_ledger_never_took_gets_no_receipt(tmp_path, monkeypatch):
    """A fault between the message and the ledger (a bug, not a full card): no receipt,
    so the server sends it again, rather than a receipt for a command nobody holds."""
    from agent.commands.actions import Actions
    from agent.commands.service import CommandService
    service = CommandService(str(tmp_path / "commands.jsonl"), frozenset({"diagnostics"}),
                             Actions.__new__(Actions), runtime_dir=str(tmp_path))

    def broken(raw):
        raise RuntimeError("a bug")

    monkeypatch.setattr(service, "_received", broken)
    receipts = []
    service.serve({"id": "c1", "name": "diagnostics"}, lambda: receipts.append(1))
    item = service._news.get_nowait()
    with pytest.raises(RuntimeError):
        getattr(service, "_on_" + item[0])(*item[1:])
    assert receipts == []
