from agent.watchdog_gate import WatchdogGate


def test_pets_only_while_link_live_and_all_loops_tick():
    gate = WatchdogGate(require_link=True)
    gate.register("link", 5.0, now=0.0)
    gate.register("uploads", 60.0, now=0.0)
    assert gate.verdict(1.0, link_live=True) == (True, "")
    assert gate.verdict(1.0, link_live=False) == (False, "link not proven live")
    gate.tick("link", 4.0)
    assert gate.verdict(8.0, True) == (True, "")
    assert gate.verdict(9.5, True) == (False, "stalled: link")
    gate.tick("link", 9.6)
    assert gate.verdict(9.7, True) == (True, "")
    assert gate.verdict(61.0, True) == (False, "stalled: link, uploads")


def test_require_link_off_still_catches_stalls():
    gate = WatchdogGate(require_link=False)
    gate.register("link", 5.0, now=0.0)
    assert gate.verdict(3.0, link_live=False) == (True, "")
    assert gate.verdict(5.1, link_live=False)[0] is False


def test_ticks_never_go_backwards_and_unknown_loops_are_ignored():
    gate = WatchdogGate()
    gate.register("link", 5.0, now=10.0)
    gate.tick("link", 2.0)
    gate.tick("nonexistent", 100.0)
    assert gate.stalled(15.0) == []
    gate.unregister("link")
    assert gate.stalled(1000.0) == []


def test_a_watchdog_shorter_than_one_self_heal_is_named_at_start(tmp_path, monkeypatch, caplog):
    """Heartbeat 2 s, ACK timeout 1 s: a silent drop leaves the link unproven for up to
    5 s while the agent heals it. WatchdogSec=3 s would restart it for that; 10 s not."""
    import logging
    from types import SimpleNamespace

    from agent import config as cfgmod
    from agent.daemon import Agent
    from devtools.harness import FakeSystemd, agent_config

    server = SimpleNamespace(url="http://127.0.0.1:9", devices={"screen-1": "t" * 32})
    warned = {}
    for watchdog_s in (3.0, 10.0):
        work = tmp_path / f"w{watchdog_s:g}"
        work.mkdir()
        fake = FakeSystemd(work / "notify.sock", watchdog_s)
        try:
            agent = Agent(cfgmod.load(str(agent_config(server, work)), env={}), environ=fake.env())
            monkeypatch.setattr(agent.runner, "start", lambda then: then())
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="edge_agent"):
                agent.run()
            warned[watchdog_s] = [r.getMessage() for r in caplog.records
                                  if "WatchdogSec" in r.getMessage()]
        finally:
            fake.close()
    assert warned[3.0] == ["WatchdogSec=3s is shorter than the link goes unproven while it heals "
                           "one silent drop by itself (5s: two heartbeats plus the ACK timeout): "
                           "systemd would restart a healthy agent; raise WatchdogSec or lower "
                           "[link] heartbeat_interval_s"], warned
    assert warned[10.0] == []


def test_an_idle_loop_is_no_stall_until_its_next_turn_and_the_turn_counts_from_then():
    gate = WatchdogGate()
    gate.register("uploads", 5.0, now=0.0)
    gate.idle("uploads")                      # nothing queued: waits untimed
    assert gate.stalled(1000.0) == []
    gate.tick("uploads", 1000.0)              # woken: on the gate again, from now
    assert gate.stalled(1004.0) == [] and gate.stalled(1005.5) == ["uploads"]


def test_a_loop_is_on_the_gate_from_its_start_and_one_that_keeps_dying_stays_stalled():
    import threading
    from agent.loop import Loop
    gate, ended = WatchdogGate(), threading.Event()
    hung = threading.Event()
    slow = Loop("slow", lambda: hung.wait(5), max_silence_s=2.0, gate=gate,
                pause=lambda s: False, stopping=lambda: False, clock=lambda: 0.0)
    slow.start()   # its body hangs before its first turn: a stall all the same
    assert gate.stalled(3.0) == ["slow"]
    hung.set()
    slow.join(2)
    deaths = []

    def dies_while_idle():   # waiting untimed when it dies: idle must not hide it
        doomed.idle()
        deaths.append(1)
        raise ZeroDivisionError("a bug")

    doomed = Loop("doomed", dies_while_idle, max_silence_s=2.0, gate=gate,
                  pause=lambda s: False, stopping=lambda: False, clock=lambda: 0.0)
    doomed.start(then=ended.set)
    assert ended.wait(5) and doomed.gave_up and len(deaths) > 1
    assert "doomed" in gate.stalled(3.0), "its pets must stop: systemd starts a fresh process"
    assert not slow.gave_up
