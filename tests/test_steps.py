"""base/steps.py: a job that waits, written once, driven whole (drive) or a look at a
time (Stepper, the commands thread's way with a display's turn), with real programs
through the screen's Runner (base/children.Started)."""
import os
import threading
import time

from agent.base.steps import Acquire, Program, Stepper, Until, drive
from agent.screen.sources import Runner


def run_stepped(job, limit_s=10.0):
    """The job a look at a time, as the commands thread drives a display command, the
    waits between looks slept here; its result."""
    stepper = Stepper(job)
    deadline = time.monotonic() + limit_s
    while not stepper.advance():
        assert time.monotonic() < deadline, "the job never ended"
        time.sleep(stepper.wait_s())
    return stepper.result


def display_command(actions, state, driven):
    """The display command driven whole, or a look at a time as the commands thread
    drives it."""
    if driven == "whole":
        return actions.run("display", {"state": state})
    return run_stepped(actions.steps("display", {"state": state}))


def test_one_job_gives_the_same_result_driven_whole_or_a_look_at_a_time():
    now = [0.0]

    def clock():
        now[0] += 0.5   # a fake clock that moves each time it is read
        return now[0]

    lock = threading.Lock()

    def job():
        yield Acquire(lock)
        try:
            out, why = yield Program(lambda argv: (b"said " + argv[0].encode(), ""), ["x"])
            yield Until(clock() + 0.6, clock)
            return out, why, lock.locked()
        finally:
            lock.release()
    assert drive(job()) == (b"said x", "", True)
    assert run_stepped(job()) == (b"said x", "", True)
    assert not lock.locked()


def test_a_real_program_is_read_and_judged_as_a_blocking_run_judges_it(tmp_path):
    runner = Runner(5.0)

    def job(argv):
        return (yield Program(runner, argv))
    for argv in (["sh", "-c", "echo on"], ["sh", "-c", "echo oops >&2; exit 3"],
                 ["/nonexistent/program"]):
        stepped = run_stepped(job(argv))
        assert stepped == runner(argv), argv
    assert run_stepped(job(["sh", "-c", "echo oops >&2; exit 3"])) == (
        b"", "sh exited 3: oops")


def test_a_program_past_its_bound_is_killed_with_its_group_and_said_in_words(tmp_path):
    pids = tmp_path / "pids"
    runner = Runner(0.5)
    t0 = time.monotonic()
    result = run_stepped(_run(runner, ["sh", "-c", f"sleep 30 & echo $! > {pids}; wait"]))
    assert result == (None, "sh timed out after 0.5 s") and time.monotonic() - t0 < 2
    time.sleep(0.1)
    assert not _alive(int(pids.read_text()))


def test_output_is_bounded_and_drained_so_a_chatty_program_ends(tmp_path):
    runner = Runner(10.0)
    out, why = run_stepped(_run(runner, ["sh", "-c", "head -c 3000000 /dev/zero; echo"]))
    assert why == "" and len(out) == 65536, (len(out), why)


def test_a_program_that_exits_is_answered_though_a_child_it_left_holds_the_pipe(tmp_path):
    """A display command that starts a helper in the background: its exit is its
    answer, driven whole or a look at a time alike (communicate() waited for the
    helper's end, and said "timed out"); the helper is its own business, as a
    program's background child always was (only the bound and a stop kill the group)."""
    pids = tmp_path / "pids"
    runner = Runner(10.0)
    helpers = []
    try:
        for way in ("stepped", "whole"):
            argv = ["sh", "-c", f"sleep 30 & echo $! > {pids}; echo done"]
            t0 = time.monotonic()
            result = run_stepped(_run(runner, argv)) if way == "stepped" else runner(argv)
            assert result == (b"done\n", "") and time.monotonic() - t0 < 2, (way, result)
            helpers.append(int(pids.read_text()))
            assert _alive(helpers[-1]), way
    finally:
        for pid in helpers:
            os.kill(pid, 9)


def test_a_lock_another_thread_holds_is_waited_for_without_blocking_the_driver():
    lock = threading.Lock()
    lock.acquire()

    def job():
        yield Acquire(lock)
        lock.release()
        return "turned"
    stepper = Stepper(job())
    assert not stepper.advance() and not stepper.advance()
    assert 0 < stepper.wait_s() <= 0.1
    lock.release()
    assert stepper.advance() and stepper.result == "turned"


def test_a_wait_ends_at_its_time_or_at_once_when_interrupted():
    stop = threading.Event()

    def job():
        yield Until(time.monotonic() + 60, time.monotonic, stop)
        return stop.is_set()
    stepper = Stepper(job())
    assert not stepper.advance() and 59 < stepper.wait_s() <= 60
    stop.set()
    assert stepper.advance() and stepper.result is True
    threading.Timer(0.1, stop.set).start()
    stop.clear()
    t0 = time.monotonic()
    assert drive(job()) is True and time.monotonic() - t0 < 5


def test_a_closed_job_kills_its_program_and_runs_its_finally(tmp_path):
    lock = threading.Lock()
    pids = tmp_path / "pids"
    runner = Runner(60.0)

    def job():
        yield Acquire(lock)
        try:
            return (yield Program(runner, ["sh", "-c", f"echo $$ > {pids}; exec sleep 30"]))
        finally:
            lock.release()
    stepper = Stepper(job())
    deadline = time.monotonic() + 5
    while not pids.exists() or not pids.read_text().strip():
        assert time.monotonic() < deadline
        stepper.advance()
        time.sleep(0.02)
    stepper.close()
    time.sleep(0.1)
    assert not _alive(int(pids.read_text())) and not lock.locked()


def _run(runner, argv):
    return (yield Program(runner, argv))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        return os.path.exists(f"/proc/{pid}")


def test_a_lock_held_past_the_bound_is_given_up_and_said_either_way():
    lock = threading.Lock()
    lock.acquire()

    def job():
        got = yield Acquire(lock, 0.3)
        if got:
            lock.release()
        return got
    try:
        t0 = time.monotonic()
        assert drive(job()) is False and 0.25 < time.monotonic() - t0 < 2
        t0 = time.monotonic()
        assert run_stepped(job()) is False and 0.25 < time.monotonic() - t0 < 2
    finally:
        lock.release()
    assert drive(job()) is True and not lock.locked()


def test_a_step_that_fails_closes_its_job_at_once_and_the_lock_is_free(tmp_path):
    """A bug or a refusal in a step (a NUL byte Popen refuses): the job's finally runs
    then, not when the collector gets to the generator."""
    lock = threading.Lock()

    def boom(argv):
        raise ValueError("embedded null byte")

    def job():
        yield Acquire(lock)
        try:
            return (yield Program(boom, ["x"]))
        finally:
            lock.release()
    kept = job()
    try:
        drive(kept)
    except ValueError:
        pass
    assert not lock.locked()
    kept = job()
    try:
        Stepper(kept)
    except ValueError:
        pass
    assert not lock.locked()
    assert Runner(5.0)(["sh", "-c", "echo \0"]) == (None, "sh: cannot be run (embedded null byte)")
