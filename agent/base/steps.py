"""A job that waits (on a program, a lock, a time) written once, as a generator of the
waits it needs, and run two ways: ``drive(job)`` blocks the caller's thread until the
job ends (the working hours', the mender's), a ``Stepper`` takes it a look at a time on
a thread that serves other things meanwhile (the commands thread: a display turned
there never holds the commands behind it).

The job yields a ``Program`` (it is sent back ``(stdout or None, why)``, as
sources.Runner answers), an ``Acquire`` (a lock it must hold: it is sent back whether
it got it within the bound; it releases the lock itself, in a ``finally``) or an
``Until`` (a time on the job's own clock, or its interrupt set); its return value is
the job's result. A job whose step fails (a bug) is closed, so its ``finally`` runs
then, not whenever the collector gets to it.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Generator

# how often a Stepper looks at a program it runs: a display command or a read of the
# display takes tenths of seconds to seconds; looks happen only while one runs
LOOK_EVERY_S = 0.05
# how often a Stepper tries a lock another thread holds (a turn of the working hours')
LOCK_EVERY_S = 0.1

Job = Generator[Any, Any, Any]


@dataclass(frozen=True)
class Program:
    """Run ``argv`` with ``runner``: a callable ``runner(argv[, env=env]) -> (stdout,
    why)``; with a ``start(argv, env)`` too (sources.Runner), a Stepper never blocks on
    it (a plain callable, a test's, is called as it is)."""
    runner: Callable
    argv: list
    env: dict | None = None


@dataclass(frozen=True)
class Acquire:
    """A threading.Lock, released by the job, not by its driver; given up after
    ``within_s`` (None: waited for as long as it takes)."""
    lock: Any
    within_s: float | None = None


@dataclass(frozen=True)
class Until:
    at: float
    clock: Callable[[], float]
    interrupt: threading.Event | None = None

    def passed(self) -> bool:
        return self.clock() >= self.at or (self.interrupt is not None
                                           and self.interrupt.is_set())


def _call(step: Program):
    return step.runner(step.argv) if step.env is None else step.runner(step.argv, env=step.env)


def drive(job: Job):
    """The job on the calling thread, to its end; its result."""
    value = None
    while True:
        try:
            step = job.send(value)
        except StopIteration as end:
            return end.value
        try:
            value = None
            if isinstance(step, Program):
                value = _call(step)
            elif isinstance(step, Acquire):
                value = step.lock.acquire(
                    timeout=-1 if step.within_s is None else max(step.within_s, 0.0))
            else:
                interrupt = step.interrupt or threading.Event()
                while not step.passed():
                    interrupt.wait(step.at - step.clock())
        except BaseException:
            job.close()
            raise


class Stepper:
    """One job, a look at a time: ``advance()`` goes as far as the job can without
    waiting and says whether it ended (``result``); ``wait_s()`` is how long the thread
    may wait before it looks again. ``close()`` ends it unfinished: the program it runs
    killed, its ``finally`` run."""

    def __init__(self, job: Job):
        self.job = job
        self.done = False
        self.result: Any = None
        # what the job waits on: a started program (base/children.Started), a lock
        # another thread holds (given up at _given_up_at), or a time
        self._waiting: Any = None
        self._given_up_at = 0.0
        try:
            self._send(None)
        except BaseException:
            self.close()
            raise

    def wait_s(self) -> float:
        waiting = self._waiting
        if self.done:
            return 0.0
        if isinstance(waiting, Until):
            return max(0.0, waiting.at - waiting.clock())
        return LOCK_EVERY_S if isinstance(waiting, Acquire) else LOOK_EVERY_S

    def advance(self) -> bool:
        waiting = self._waiting
        if self.done or waiting is None:
            return self.done
        if isinstance(waiting, Until):
            if not waiting.passed():
                return False
            answer = None
        elif isinstance(waiting, Acquire):
            answer = waiting.lock.acquire(blocking=False)
            if not answer and time.monotonic() < self._given_up_at:
                return False
        elif (answer := waiting.look()) is None:
            return False
        self._waiting = None
        self._send(answer)
        return self.done

    def close(self) -> None:
        try:
            if self._waiting is not None and not isinstance(self._waiting, (Until, Acquire)):
                self._waiting.kill()
        finally:
            self._waiting = None
            self.job.close()
            self.done = True

    def _send(self, value) -> None:
        """The job on until it must wait."""
        while True:
            try:
                step = self.job.send(value)
            except StopIteration as end:
                self.done, self.result = True, end.value
                return
            value = None
            if isinstance(step, Program):
                start = getattr(step.runner, "start", None)
                started = start(step.argv, step.env) if start is not None else _call(step)
                if isinstance(started, tuple):   # answered at once (refused, not found)
                    value = started
                    continue
                self._waiting = started
                return
            if isinstance(step, Acquire):
                if step.lock.acquire(blocking=False):
                    value = True
                    continue
                self._waiting = step
                self._given_up_at = (time.monotonic() + step.within_s
                                     if step.within_s is not None else float("inf"))
                return
            if step.passed():
                continue
            self._waiting = step
            return
