"""A flood of remote commands from the server (issue #25): bounded admission, a bounded
at-most-once record that never lets a forgotten id run again, bounded writes per
command on a real (loop-mounted ext4) card, and a stop in seconds mid-flood.

The core with a fake clock; the ledger on a real file system; the flood itself from the
reference fleet server against a real agent process in a network namespace.
"""
import json
import os
import re
import signal
import threading
from types import SimpleNamespace
import time

import pytest

from agent.commands import ledger
from agent.commands.core import (BURST, MAX_ENTRIES, MAX_PENDING, RATE_PER_S, CommandCore,
                                 Finished, Persist, Received, Recovered, Report, ResultAcked,
                                 Run)
from devtools.card import SdCard
from devtools.harness import agent_config, wait_for

ALL = frozenset({"diagnostics", "logs", "reboot", "restart-agent", "display", "screenshot"})
GAP = 1 / RATE_PER_S   # commands this far apart are all admitted


def results(actions):
    return [a.result for a in actions if isinstance(a, Report)]


def runs(actions):
    return [a for a in actions if isinstance(a, Run)]


def run_one(c, cid, t, output="ok", expires=None, ack=True):
    """A command admitted, run, finished and (by default) confirmed, at fake time t;
    returns the effects, in order."""
    body = {"id": cid, "name": "diagnostics"}
    if expires is not None:
        body["expires_at"] = expires
    effects = c.handle(Received(body, t, t))
    [run] = runs(effects)
    effects += c.handle(Finished(run.id, True, output, None, t, now=t))
    if ack:
        effects += c.handle(ResultAcked(run.id))
    return effects


# -- the core, on a fake clock ------------------------------------------------------

def test_admission_is_a_token_bucket_and_what_is_over_it_is_refused_not_dropped():
    c = CommandCore(ALL)
    admitted, refused = [], []
    for i in range(3000):
        effects = c.handle(Received({"id": f"f{i}", "name": "diagnostics"}, 1000.0, 50.0))
        assert len(runs(effects) + results(effects)) == 1, "every command gets an answer"
        for a in effects:
            if isinstance(a, Run):
                admitted.append(a.id)
                c.handle(Finished(a.id, True, "ok", None, 1000.0, now=1000.0))
            elif isinstance(a, Report):
                refused.append(a)
            else:
                assert a.changes and not refused, "a refusal writes nothing"
    assert len(admitted) == BURST and len(refused) == 3000 - BURST
    assert all(not r.kept and r.result["ok"] is False
               and r.result["error"].startswith("rate-limited") for r in refused)
    assert len(c.entries) == BURST, "a rate-limited command is neither recorded nor run"
    # the bucket refills at RATE_PER_S: one more after GAP, not before
    g1 = {"id": "g1", "name": "diagnostics"}
    assert not runs(c.handle(Received(g1, 1001.0, 50.0 + GAP * 0.9)))
    assert runs(c.handle(Received(g1, 1001.0, 50.0 + GAP * 1.01))), \
        "a rate-limited id may be sent again and run"
    c.handle(Finished("g1", True, "ok", None, 1001.0, now=1001.0))
    # an hour later the burst is back, and no more
    got = [runs(c.handle(Received({"id": f"h{i}", "name": "logs"}, 5000.0, 4000.0)))
           for i in range(BURST + 5)]
    assert sum(map(len, got)) == MAX_PENDING < BURST
    busy = results(c.handle(Received({"id": "b", "name": "logs"}, 5000.0, 9000.0)))
    assert busy[0]["error"].startswith("busy") and "b" not in c.entries


def test_a_forgotten_id_is_refused_never_run_and_new_commands_still_run():
    c = CommandCore(ALL)
    t = 1000.0
    for i in range(3 * MAX_ENTRIES):
        run_one(c, f"c{i}", t, expires=t + 300)
        t += GAP
    assert len(c.entries) == MAX_ENTRIES
    forgotten = [f"c{i}" for i in range(2 * MAX_ENTRIES)]
    assert not set(forgotten) & set(c.entries)
    for i, cid in enumerate(forgotten):
        # the server's resend: same id, same expires_at; the device clock is irrelevant
        effects = c.handle(Received({"id": cid, "name": "diagnostics",
                                     "expires_at": 1300.0 + i * GAP}, 0.0, t + i * GAP))
        assert not runs(effects), cid
        [r] = results(effects)
        assert "too old" in r["error"], r
    # a remembered id is answered with its result, and a new command runs
    assert results(c.handle(Received({"id": f"c{3 * MAX_ENTRIES - 1}", "name": "diagnostics"},
                                     t, t)))[0]["ok"]
    assert runs(c.handle(Received({"id": "new", "name": "diagnostics", "expires_at": t + 300},
                                  t, t + 10 * GAP)))


def test_forgetting_a_refusal_leaves_the_horizon_alone():
    """A refused command never ran, and its resend is refused the same way: a stream of
    refusals must not push the horizon past commands the server is about to send."""
    c = CommandCore(frozenset({"diagnostics"}))
    t = 1000.0
    for i in range(3 * MAX_ENTRIES):
        [r] = results(c.handle(Received({"id": f"r{i}", "name": "reboot",
                                         "expires_at": t + 3600}, t, t)))
        assert "not allowed" in r["error"]
        t += GAP
    assert len(c.entries) == MAX_ENTRIES and c.floor is None and not c.closed
    assert runs(c.handle(Received({"id": "d", "name": "diagnostics", "expires_at": t + 60}, t, t)))


def test_without_expires_at_forgetting_closes_the_door_unless_the_ids_are_ours():
    c = CommandCore(ALL)
    run_one(c, "noexp", 1.0)
    t = 10.0
    for i in range(MAX_ENTRIES):  # those with an expiry are forgotten first
        run_one(c, f"e{i}", t, expires=t + 300)
        t += GAP
    assert "noexp" in c.entries and not c.closed
    for i in range(MAX_ENTRIES):
        run_one(c, f"n{i}", t)
        t += GAP
    assert "noexp" not in c.entries and c.closed
    [r] = results(c.handle(Received({"id": "noexp", "name": "diagnostics"}, t, t)))
    assert "no expires_at" in r["error"]
    # ScreenTinker: the agent mints every id, nothing sends one again
    st = CommandCore(ALL, ids_ours=True)
    for i in range(MAX_ENTRIES + 5):
        run_one(st, f"st-{i}", 10.0 + i * GAP)
    assert not st.closed and st.floor is None
    assert runs(st.handle(Received({"id": "st-new", "name": "diagnostics"}, 1e4, 1e4)))


# -- the ledger on a real card ---------------------------------------------------------

def _persist(c, lg, effects):
    """As the service does: each Persist in order."""
    for p in effects:
        if isinstance(p, Persist):
            lg.write(list(p.changes), p.horizon, p.durable, lambda: list(c.entries.values()))


def _wchar() -> int:
    with open("/proc/self/io") as f:
        return int(re.search(r"wchar: (\d+)", f.read()).group(1))


def test_3000_commands_on_a_card_bounded_bytes_and_every_forgotten_id_refused_after_reopen(
        tmp_path):
    n = 3000
    output = json.dumps({"status": "x" * 900})   # a diagnostics-sized result
    with SdCard(tmp_path, size_mb=64) as card:
        path = str(card.mountpoint / "commands.json")
        c = CommandCore(ALL)
        lg = ledger.Ledger(path, ledger.load(path, 0.0))
        card_before, wchar_before, biggest = card.bytes_written(), _wchar(), 0
        t = 1000.0
        for i in range(n):
            # as the service does: each step's Persist before what follows it
            effects = c.handle(Received({"id": f"id-{i:05d}", "name": "diagnostics",
                                         "expires_at": t + 300}, t, t))
            [run] = runs(effects)
            _persist(c, lg, effects)
            _persist(c, lg, c.handle(Finished(run.id, True, output, None, t, now=t + 0.1)))
            _persist(c, lg, c.handle(ResultAcked(run.id)))
            biggest = max(biggest, os.path.getsize(path))
            t += GAP
        per_command = (_wchar() - wchar_before) / n
        card_per_command = (card.bytes_written() - card_before) / n
        print(f"\nledger: {per_command:.0f} B written per command, {card_per_command:.0f} B "
              f"to the card (journal included), largest file {biggest} B")
        assert biggest <= ledger.MAX_BYTES, "the ledger outgrew what load reads"
        assert per_command < 4096, per_command
        assert card_per_command < 64 * 1024, card_per_command
        # the next start: nothing forgotten runs, nothing remembered runs
        loaded = ledger.load(path, 0.0)
        assert not loaded.rewrite and len(loaded.entries) == MAX_ENTRIES
        again = CommandCore(ALL, loaded.entries, loaded.floor, loaded.closed)
        t0 = 1000.0
        for i in range(n):
            effects = again.handle(Received({"id": f"id-{i:05d}", "name": "diagnostics",
                                             "expires_at": t0 + i * GAP + 300}, t0, i * GAP))
            assert not runs(effects), f"id-{i:05d} ran again"
            assert results(effects), f"id-{i:05d} unanswered"


def test_an_earlier_builds_ledger_past_the_limit_is_taken_over_not_forgotten(tmp_path):
    path = tmp_path / "commands.json"
    entries = [{"id": f"old-{i}", "name": "diagnostics", "state": "done",
                "received_at": 1000.0 + i, "acked": True, "expires_at": 1300.0 + i,
                "result": {"id": f"old-{i}", "ok": True, "output": "x" * 400}}
               for i in range(3000)]
    path.write_text(json.dumps({"entries": entries}))
    assert path.stat().st_size > ledger.MAX_BYTES
    loaded = ledger.load(str(path), 5000.0)
    c = CommandCore(ALL, loaded.entries, loaded.floor, loaded.closed)
    effects = c.handle(Recovered("boot", 1, 5000.0))
    lg = ledger.Ledger(str(path), loaded)
    _persist(c, lg, effects)   # nothing changed: the start's Persist rewrites it anyway
    assert path.stat().st_size <= ledger.MAX_BYTES
    assert not [p for p in os.listdir(tmp_path) if "corrupt" in p]
    reopened = ledger.load(str(path), 5000.0)
    c = CommandCore(ALL, reopened.entries, reopened.floor, reopened.closed)
    for i in range(3000):
        effects = c.handle(Received({"id": f"old-{i}", "name": "diagnostics",
                                     "expires_at": 1300.0 + i}, 1100.0, i * GAP))
        assert not runs(effects) and results(effects), f"old-{i}"


def test_a_damaged_ledger_raises_the_horizon_instead_of_forgetting(tmp_path):
    path = str(tmp_path / "commands.json")
    c = CommandCore(ALL)
    lg = ledger.Ledger(path, ledger.load(path, 0.0))
    for i in range(5):
        _persist(c, lg, run_one(c, f"d{i}", 1000.0 + i * GAP, expires=1300.0 + i))
    with open(path, "r+b") as f:   # a bad sector in the middle
        f.seek(os.path.getsize(path) // 2)
        f.write(b"\x00" * 64)
    loaded = ledger.load(path, 1010.0)
    assert loaded.floor >= 1010.0 + ledger.LOST_HOLD_S and loaded.closed and loaded.rewrite
    assert [p for p in os.listdir(tmp_path) if ".corrupt-" in p]
    again = CommandCore(ALL, loaded.entries, loaded.floor, loaded.closed)
    for i in range(5):
        effects = again.handle(Received({"id": f"d{i}", "name": "diagnostics",
                                         "expires_at": 1300.0 + i}, 1010.0, i * GAP))
        assert not runs(effects) and results(effects)
    # a line cut short at the end was never synced: its command never ran; dropped
    with open(path, "ab") as f:
        f.write(b'{"e":{"id":"torn","na')
    loaded = ledger.load(path, 0.0)
    assert loaded.rewrite and not loaded.closed and "torn" not in loaded.entries


def test_a_result_record_stays_bounded_whatever_the_output(tmp_path):
    path = str(tmp_path / "commands.json")
    c = CommandCore(ALL)
    lg = ledger.Ledger(path, ledger.load(path, 0.0))
    nasty = "\x00\ud800é" * 5000 + "a" * 20000
    t = 1000.0
    for i in range(MAX_ENTRIES + 20):
        effects = c.handle(Received({"id": "i" * 60 + f"{i:04d}", "name": "diagnostics",
                                     "expires_at": t + 300}, t, t))
        [run] = runs(effects)
        effects += c.handle(Finished(run.id, False, nasty, nasty, t, now=t))  # never confirmed
        _persist(c, lg, effects)
        t += GAP
    assert os.path.getsize(path) <= ledger.MAX_BYTES
    snapshot = sum(len(json.dumps({"e": e.to_dict()})) for e in c.entries.values())
    assert snapshot < ledger.MAX_BYTES * 3 // 4, "a rewrite must leave room to append"
    assert len(ledger.load(path, 0.0).entries) == MAX_ENTRIES


# -- the flood from the reference server, against a real agent ------------------------

@pytest.mark.netns
def test_a_flood_from_the_server_costs_no_ack_and_sigterm_ends_it_within_5s(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    server = fleet()
    runs_file = tmp_path / "runs"
    child_pid = tmp_path / "child.pid"
    # the default ACK timeout (5 s): 3000 messages ahead of an ACK in the stream take the
    # library's read thread about 3 s here, a thread per message (see the report)
    config = agent_config(server, tmp_path, link={"heartbeat_interval_s": 6, "ack_timeout_s": 5},
                          commands={"allow": ["diagnostics", "display"], "timeout_s": 600,
                                    "display_on_command":
                                        f"sh -c 'echo $$ > {child_pid}; echo run >> {runs_file};"
                                        f" exec sleep 60'"})
    agent = spawn_agent(agent_python, config)
    agent.wait_live(15)
    # one command whose process runs on through the flood and the stop
    server.admin("/api/v1/commands", {"device_id": "screen-1", "name": "display",
                                      "args": {"state": "on"}})
    wait_for(child_pid.exists, 10, what="the display command running")
    # the flood lands a second before a heartbeat, whose ACK then queues behind it
    beats = len(server.device()["heartbeat_times"])
    wait_for(lambda: len(server.device()["heartbeat_times"]) > beats, 10, interval=0.05,
             what="a heartbeat")
    time.sleep(5.0)
    flood_at = time.time()
    sent = server.admin("/admin/flood", {"device_id": "screen-1", "count": 3000,
                                         "name": "diagnostics"})
    assert sent["sent"] == 3000
    wait_for(lambda: (lambda n: n if n >= 3000 - MAX_PENDING else None)(
        server.admin("/admin/flood", {"device_id": "screen-1", "count": 0})["results"]),
        60, interval=0.2, what="a result for every command of the flood")
    answered = server.admin("/admin/flood", {"device_id": "screen-1", "count": 0})
    # the admitted ones wait behind `display`; every other one was refused at once
    assert answered["results"] >= 3000 - MAX_PENDING and answered["received"] == 3000
    # the heartbeat due a second into the flood is part of it, however fast the agent
    # answered: its ACK comes behind the flood's messages in the stream
    answered_at = max(time.time(), flood_at + 2.0)
    time.sleep(max(0.0, answered_at - time.time()) + 5.5)   # that ACK: in or timed out
    in_flood = [t for t in server.device()["heartbeat_times"] if flood_at <= t <= answered_at]
    assert in_flood, "no heartbeat went out during the flood: the test proves nothing"
    log = agent.log_text()
    assert "no heartbeat ack" not in log and "link lost" not in log, log[-3000:]
    assert server.device()["connects"] == 1 and agent.link()["proven_live"]
    size = os.path.getsize(tmp_path / "state" / "commands.json")
    assert size <= ledger.MAX_BYTES
    # a second flood, and SIGTERM in the middle of it, with the command still running
    pid = int(child_pid.read_text())
    assert _alive(pid)
    flood = threading.Thread(target=server.admin, args=("/admin/flood", {
        "device_id": "screen-1", "count": 3000, "name": "diagnostics"}), daemon=True)
    flood.start()
    wait_for(lambda: server.admin("/admin/flood", {"device_id": "screen-1", "count": 0})
             ["received"] >= 3100, 10, interval=0.05, what="the second flood arriving")
    t0 = time.monotonic()
    agent.proc.send_signal(signal.SIGTERM)
    agent.proc.wait(5)
    print(f"\nSIGTERM mid-flood: exited {agent.proc.returncode} in "
          f"{time.monotonic() - t0:.2f}s")
    assert time.monotonic() - t0 < 5 and agent.proc.returncode == 0
    assert not _alive(pid), "the command's process outlived the agent"
    assert runs_file.read_text() == "run\n"
    assert os.path.getsize(tmp_path / "state" / "commands.json") <= ledger.MAX_BYTES


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for whoever inherited it to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_stop_kills_the_running_commands_whole_process_group(tmp_path):
    """A display command runs through the display's owner (screen/power.py); the agent's
    stop (the screen part's, then the commands') ends it whole, at once."""
    from agent.commands.actions import Actions
    from agent.screen.power import DisplayPower
    pids = tmp_path / "pids"
    power = DisplayPower(f"sh -c 'sleep 600 & echo $$ $! > {pids}; wait'", None, 600,
                         read_back=None, publish=lambda event: None)
    actions = Actions(SimpleNamespace(timeout_s=600), "http://fleet.invalid", snapshot=dict,
                      link_socket=lambda: None, request_restart=lambda: None,
                      enqueue=lambda *a: None, power=power)
    done = []
    worker = threading.Thread(target=lambda: done.append(actions.run("display", {"state": "on"})))
    worker.start()
    wait_for(lambda: pids.exists() and pids.read_text().strip(), 10, what="the command running")
    shell, grandchild = map(int, pids.read_text().split())
    t0 = time.monotonic()
    power.stop()
    actions.stop()
    worker.join(5)
    assert not worker.is_alive() and time.monotonic() - t0 < 2
    assert done[0].ok is False
    assert wait_for(lambda: not _alive(shell) and not _alive(grandchild), 2,
                    what="the shell and what it started gone")
    assert actions.run("display", {"state": "on"}).error == "not run: the agent is stopping"


def test_the_screentinker_profile_forgets_its_own_ids_without_a_horizon(tmp_path):
    """The agent wires the rule from its profile: ScreenTinker's commands carry no id."""
    from types import SimpleNamespace

    from agent.config import load as cfgmod
    from agent.app.daemon import Agent
    from devtools.harness import agent_config

    server = SimpleNamespace(url="http://127.0.0.1:9", devices={"screen-1": "t" * 32})
    for profile, ours in (("screentinker", True), ("edge-agent", False)):
        (tmp_path / profile).mkdir()
        cfg = cfgmod.load(str(agent_config(server, tmp_path / profile,
                                           server={"profile": profile})), env={})
        assert Agent(cfg).commands.core.ids_ours is ours, profile
