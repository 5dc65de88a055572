"""runtime/threads.py and runtime/deadline.py, the one place the agent's threads and
timers start, and the parts' threads that became Loops on the watchdog gate (the
commands' executor, working hours). Fake clocks or hundredths of a second: no test
here sleeps for long."""
from __future__ import annotations

import logging
import queue
import socket
import threading
import time

import pytest

from agent.base import http
from agent.base.clock import FakeClock
from agent.commands.core import Outcome
from agent.runtime import deadline as deadlines
from agent.runtime import supervise
from agent.runtime.threads import Timers, start_worker, workers
from agent.runtime.watchdog_gate import WatchdogGate


def wait_until(predicate, timeout: float = 3.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


@pytest.fixture
def quick_restarts(monkeypatch):
    """supervise.py's backoff in hundredths of a second."""
    monkeypatch.setattr(supervise, "BACKOFF_BASE_S", 0.01)


# -- Timers, without their thread ---------------------------------------------------------
def test_alarms_run_in_their_order_once_due_and_a_cancelled_one_never():
    clock = FakeClock(start=100.0)
    timers, ran = Timers("t", clock=clock.monotonic), []
    timers.loop.start = lambda then=None: None   # no thread: run_due() by hand
    late = timers.after(5, lambda: ran.append("late"), name="late")
    timers.after(2, lambda: ran.append("soon"), name="soon")
    timers.at(103.0, lambda: ran.append("at 103"), name="at")
    timers.after(-1, lambda: ran.append("now"), name="now")
    assert timers.pending() == ["now", "soon", "at", "late"]
    assert timers.run_due() == 102.0 and ran == ["now"]
    assert timers.run_due(101.9) == 102.0 and ran == ["now"]
    assert timers.run_due(103.0) == 105.0 and ran == ["now", "soon", "at 103"]
    assert late.cancel() and not late.cancel() and timers.pending() == []
    assert timers.run_due(1e9) is None and ran == ["now", "soon", "at 103"]


def test_a_callback_that_raises_is_logged_and_the_next_one_runs(caplog):
    timers, ran = Timers("t", clock=FakeClock().monotonic), []
    timers.loop.start = lambda then=None: None

    def broken():
        raise KeyError("bug")

    timers.after(1, broken, name="broken")
    timers.after(1, lambda: ran.append("next"), name="next")
    with caplog.at_level(logging.ERROR, logger="edge_agent"):
        timers.run_due(1e6)
    assert ran == ["next"]
    assert "t: alarm broken failed: KeyError" in caplog.text


# -- Timers, on their thread -----------------------------------------------------------------
def test_the_thread_starts_at_the_first_alarm_and_runs_it_on_time():
    timers = Timers("t-real")
    assert not timers.loop._thread.is_alive(), "no alarm, no thread"
    fired, cancelled = threading.Event(), threading.Event()
    t0 = time.monotonic()
    timers.after(0.02, cancelled.set, name="cancelled").cancel()
    timers.after(0.05, fired.set, name="fired")
    assert fired.wait(3) and time.monotonic() - t0 >= 0.05
    assert not cancelled.is_set(), "cancelled before it was due"
    timers.stop()
    timers.join(3)
    assert not timers.loop._thread.is_alive()


def test_a_fake_clock_moved_and_a_poke_run_what_is_due():
    clock = FakeClock()
    timers, fired = Timers("t-fake", clock=clock.monotonic), threading.Event()
    with timers:
        timers.after(3600, fired.set, name="an hour")
        assert not fired.wait(0.05)
        clock.advance(3600)
        timers.poke()
        assert fired.wait(3)


def test_stop_cancels_what_is_set_and_nothing_is_set_after_it():
    timers, ran = Timers("t-stop"), []
    alarm = timers.after(0.05, lambda: ran.append(1), name="pending")
    timers.stop()
    timers.join(3)
    assert alarm.done and not alarm.cancel() and timers.pending() == []
    later = timers.after(0, lambda: ran.append(2), name="too late")
    assert later.done and timers.pending() == []
    time.sleep(0.1)
    assert ran == []


def test_a_timers_thread_is_on_the_gate_idle_between_alarms_and_stalled_in_a_stuck_callback():
    gate = WatchdogGate(require_link=False)
    timers = Timers("alarms", gate=gate, max_silence_s=0.05)
    entered, release = threading.Event(), threading.Event()
    timers.after(0, lambda: None, name="quick")
    assert wait_until(lambda: gate._loops["alarms"].idle), "idle once nothing is due"
    assert gate.stalled(time.monotonic() + 3600) == [], "an idle wait is no stall"
    timers.after(0, lambda: (entered.set(), release.wait(5)), name="stuck")
    assert entered.wait(3)
    time.sleep(0.1)
    assert gate.stalled(time.monotonic()) == ["alarms"], "a callback stuck past its bound"
    release.set()
    assert wait_until(lambda: gate.stalled(time.monotonic()) == [])
    timers.stop()


# -- one-shot workers -------------------------------------------------------------------
def test_a_worker_needs_its_reason_and_is_listed_with_it_while_it_runs():
    with pytest.raises(ValueError):
        start_worker("nameless", lambda: None, reason=" ")
    release = threading.Event()
    worker = start_worker("blocked", lambda: release.wait(5), reason="a test's bounded wait")
    assert not worker.join(0.02) and worker.alive()
    assert ("blocked", "a test's bounded wait") in workers()
    release.set()
    assert worker.join(3) and not worker.alive()
    assert ("blocked", "a test's bounded wait") not in workers()


def test_a_worker_that_raises_reaches_the_thread_hook_and_leaves_the_list(monkeypatch):
    seen = queue.Queue()
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.put(
        (args.thread.name, type(args.exc_value).__name__)))

    def broken():
        raise RuntimeError("bug")

    assert start_worker("broken", broken, reason="a test").join(3)
    assert seen.get(timeout=3) == ("broken", "RuntimeError")
    assert all(name != "broken" for name, _ in workers())


# -- the exchange's deadline -------------------------------------------------------------------
def test_the_deadline_cuts_a_read_blocked_past_it_and_is_gone_when_done_in_time():
    a, b = socket.socketpair()
    try:
        t0 = time.monotonic()
        with deadlines.deadline(0.05) as d:
            d.watch(a)
            assert a.recv(1) == b""        # a trickle that never comes: cut, not held
        assert d.expired and time.monotonic() - t0 < 2
    finally:
        a.close()
        b.close()
    with deadlines.deadline(30) as d:
        pass
    assert not d.expired and "deadline" not in deadlines._timers().pending(), \
        "an exchange done in time leaves no alarm behind"


def test_base_takes_the_cut_from_its_caller_and_cancels_it():
    armed = []

    def arm(seconds, cut):
        armed.append((seconds, cut))
        return lambda: armed.append("cancelled")

    with http.deadline(7.0, arm) as d:
        assert armed[0][0] == 7.0
        armed[0][1]()   # the caller's timer fires
        assert d.expired
    assert armed[-1] == "cancelled"


# -- the parts' threads, on the gate ---------------------------------------------------
class _Actions:
    """What CommandService needs of Actions; run() blocks until told."""
    updater = None
    timeout_s = 0.01

    def __init__(self):
        self.go, self.ran = threading.Event(), []

    def steps(self, name, args):
        return None   # every command whole, on the executor

    def run(self, name, args, command_id=""):
        self.ran.append(command_id)
        assert self.go.wait(5)
        return Outcome(True, "done")

    def stop(self):
        self.go.set()


def test_the_commands_executor_is_idle_on_the_gate_stalls_in_a_stuck_command_and_survives_a_bug(
        tmp_path, quick_restarts, monkeypatch):
    from agent.commands import service as commands
    monkeypatch.setattr(commands, "max_silence_s", lambda timeout_s: 0.05)
    gate, actions, finished = WatchdogGate(require_link=False), _Actions(), []

    service = commands.CommandService(str(tmp_path / "ledger"), frozenset({"diagnostics"}),
                                      actions, str(tmp_path), gate=gate)
    finish = service.finished

    def on_finished(cid, outcome, started):
        finished.append(cid)
        finish(cid, outcome, started)
        if cid == "c1":
            raise RuntimeError("a bug after the command ran")

    service.finished = on_finished
    service.start()
    assert wait_until(lambda: gate._loops["command-runs"].idle and gate._loops["commands"].idle)
    assert gate.stalled(time.monotonic() + 3600) == [], "no command queued: no stall"
    for cid in ("c1", "c2"):
        service.serve({"id": cid, "name": "diagnostics", "args": {},
                       "expires_at": time.time() + 600})
    assert wait_until(lambda: actions.ran == ["c1"])
    time.sleep(0.1)
    assert gate.stalled(time.monotonic()) == ["command-runs"], "a command stuck past its bound"
    actions.go.set()
    assert wait_until(lambda: finished == ["c1", "c2"]), "restarted after the bug, c2 ran"
    assert wait_until(lambda: gate.stalled(time.monotonic()) == [])
    service.stop()
    service.executor.join(3)
    assert not service.executor.gave_up


def test_working_hours_restart_after_a_bug_and_are_on_the_gate(tmp_path, quick_restarts,
                                                               caplog):
    from agent.config.week import Schedule
    from agent.hours.service import WorkingHours
    from agent.screen.power import DisplayPower
    gate = WatchdogGate(require_link=False)
    power = DisplayPower("true", "true", 1.0, None, lambda event: None,
                         sysfs_root=str(tmp_path))
    hours = WorkingHours(Schedule.parse(["mon-sun 00:00-24:00"], []), "UTC", power,
                         trust_clock=True, on_fault=lambda d: None,
                         on_change=lambda d: None, gate=gate)
    looks = []

    def step():
        looks.append(time.monotonic())
        if len(looks) == 1:
            raise ZeroDivisionError("a bug in a look")
        return 0.01

    hours.step = step
    with caplog.at_level(logging.ERROR, logger="edge_agent"):
        hours.start()
        assert wait_until(lambda: len(looks) >= 3), "restarted after the bug, looking again"
    assert "hours loop failed: ZeroDivisionError" in caplog.text
    assert "hours" in gate._loops and gate.stalled(time.monotonic()) == []
    hours.stop()
    hours.join(3)
    assert not hours.loop.gave_up


# -- Loop.every: the shell of a part's periodic thread --------------------------------------
def test_every_runs_a_step_when_it_says_at_a_wake_at_once_and_ends_on_stop():
    """The one shell of the periodic threads (the display's watch, the picture check, the
    mender, the network's healer, the working hours): a step says when the next is due
    (seconds, or None: not before a wake), a wake runs one at once, a long wait is cut in
    slices that tick the gate, an untimed one is idle on it, and stop ends the thread."""
    from agent.runtime.loop import Loop
    stop, wake, gate = threading.Event(), threading.Event(), WatchdogGate(require_link=False)
    steps, delays = [], [0.01, 0.01, None, 0.3, 30.0]

    def step():
        steps.append(time.monotonic())
        return delays[len(steps) - 1] if len(steps) <= len(delays) else 30.0

    loop = Loop("periodic", lambda: loop.every(step, stop=stop, wake=wake, slice_s=0.05),
                max_silence_s=1.0, gate=gate, pause=stop.wait, stopping=stop.is_set)
    loop.start()
    assert wait_until(lambda: len(steps) == 3)
    time.sleep(0.1)
    assert len(steps) == 3 and gate._loops["periodic"].idle, "None: idle until woken"
    wake.set()
    assert wait_until(lambda: len(steps) == 4)
    assert not gate._loops["periodic"].idle
    ticked = gate._loops["periodic"].last_tick
    assert wait_until(lambda: gate._loops["periodic"].last_tick > ticked, 0.2), "a slice ticks"
    assert wait_until(lambda: len(steps) == 5)
    assert 0.25 < steps[4] - steps[3] < 1.0, "the delay the step said, in slices"
    wake.set()   # a wake during a sliced wait runs the next step at once
    assert wait_until(lambda: len(steps) == 6, 0.5)
    stop.set()
    wake.set()
    loop.join(1.0)
    assert not loop._thread.is_alive()
