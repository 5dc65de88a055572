from agent.runtime.watchdog_gate import WatchdogGate


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

    from agent.config import load as cfgmod
    from agent.app.daemon import Agent
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
    from agent.runtime.loop import Loop
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


# -- long outages: each restart in one outage later than the last ---------------------------
from agent.runtime.watchdog_gate import OutagePatience  # noqa: E402
from devtools.bench.outage_restarts import simulate  # noqa: E402


def test_an_eight_hour_outage_costs_a_dozen_restarts_not_ninety_six():
    ours, before = simulate(patience=True), simulate(patience=False)
    assert before.restarts >= 90
    assert ours.restarts <= 12, ours.restart_times_min
    gaps = [b - a for a, b in zip(ours.restart_times_min, ours.restart_times_min[1:])]
    assert all(later >= earlier - 0.1 for earlier, later in zip(gaps, gaps[1:])), gaps
    assert max(gaps) <= 60 + 0.2, gaps   # never more than an hour between tries


def test_a_reason_a_fresh_process_may_mend_restarts_every_watchdogsec_as_before():
    assert simulate(outage=False).restarts == simulate(patience=False).restarts


def test_a_wedged_loop_is_restarted_at_once_in_the_middle_of_an_outages_patience():
    run = simulate(hours=3.0, wedged_at=100 * 60)   # the 4th process waits 40 min
    after = [t for t in run.restart_times_min if t >= 100]
    assert after and after[0] <= 100 + 5 + 5 + 2.6, run.restart_times_min


def test_a_proven_link_starts_the_count_again():
    gate = WatchdogGate(require_link=True, patience=OutagePatience(300.0, 3, now=0.0))
    gate.register("link", 5.0, 0.0)
    gate.tick("link", 150.0)
    assert gate.verdict(150.0, link_live=False, outage=True) == (True, "")   # patient
    gate.tick("link", 151.0)
    assert gate.verdict(152.0, link_live=True) == (True, "")
    assert gate.restarts_to_keep == 0
    gate.restarts_to_keep = None
    # the next outage begins at the first restart's patience: none
    gate.tick("link", 160.0)
    ok, why = gate.verdict(160.0, link_live=False, outage=True)
    assert not ok and "restart 1" in why and gate.restarts_to_keep == 1


def test_the_outages_count_is_kept_across_restarts_of_one_boot_only(tmp_path, monkeypatch):
    """On tmpfs (the runtime directory, kept across restarts), beside the reconnect
    schedule, whose writes it does not disturb."""
    from agent.link import schedule_store
    from agent.link.schedule_store import ScheduleStore
    path = str(tmp_path / "schedule.json")
    first = ScheduleStore(path)
    first.save(4, 123.5)
    assert first.outage_restarts() == 0
    first.keep_outage_restarts(2)
    after = ScheduleStore(path)
    assert after.outage_restarts() == 2 and after.load() == (4, 123.5)
    after.save(5, 130.0)
    assert ScheduleStore(path).outage_restarts() == 2
    monkeypatch.setattr(schedule_store, "boot_id", lambda: "another boot")
    assert ScheduleStore(path).outage_restarts() == 0


def test_pets_withheld_before_the_first_proof_are_the_starts_and_after_it_a_warning(caplog):
    """A start, a restart or the first connection after pairing has not proven its link
    yet: pets withheld then are said at INFO (a warning on every start had the booted
    sandbox test read a healthy start as a fault); once proven, or for a stall, a warning."""
    import logging
    import threading

    from agent.runtime.systemd import WatchdogPetter
    from agent.runtime.watchdog_gate import WatchdogGate

    class Notifier:
        def pet(self):
            pass

    for starting, level in ((True, logging.INFO), (False, logging.WARNING)):
        caplog.clear()
        petter = WatchdogPetter(Notifier(), 0.02, WatchdogGate(require_link=True),
                                live=lambda: False, outage=lambda: False,
                                starting=lambda starting=starting: starting)
        with caplog.at_level(logging.INFO, logger="edge_agent"):
            petter.start()
            threading.Event().wait(0.1)
            petter.stop()
            threading.Event().wait(0.05)
        said = [r for r in caplog.records if "withholding pets" in r.getMessage()]
        assert said and said[0].levelno == level, (starting, said)


def test_the_petter_stops_and_joins_like_any_thread():
    """The petter is a Thread: its stop event must not shadow Thread's own ``_stop`` (the
    method join() calls once the thread has ended), or join() raises TypeError."""
    from agent.runtime.systemd import WatchdogPetter
    from agent.runtime.watchdog_gate import WatchdogGate

    class Notifier:
        def pet(self):
            pass

    petter = WatchdogPetter(Notifier(), 0.02, WatchdogGate(require_link=False),
                            live=lambda: True, outage=lambda: False)
    petter.start()
    petter.stop()
    petter.join(timeout=2)
    assert not petter.is_alive()
