"""The main thread's sleep, woken by a signal whichever thread the kernel gave it to.

CPython runs signal handlers on the main thread only, and the kernel hands a
process-directed signal to any thread that does not block it. A main thread asleep in
a lock (``Thread.join``) is not woken when another thread takes the signal: in CI a
SIGTERM that reached a client library's thread during a flood of commands was never
handled, and the agent ignored systemd's stop. CPython's C-level handler writes the
signal's number to the wakeup fd on whichever thread it runs; the main thread sleeps
in poll() on that fd, and Python runs the handler as poll() returns.
"""
from __future__ import annotations

import os
import select
import signal


class MainThreadWait:
    """Made, waited on and closed on the main thread; wake() from any thread."""

    def __init__(self):
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._previous = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._poll = select.poll()
        self._poll.register(self._read, select.POLLIN)

    def wake(self) -> None:
        try:
            os.write(self._write, b"\0")
        except BlockingIOError:
            pass   # a full pipe wakes the main thread all the same

    def wait(self) -> None:
        """Until a signal arrives (its handler has run on return) or wake() is called."""
        self._poll.poll()
        try:
            while os.read(self._read, 512):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        signal.set_wakeup_fd(self._previous)
        os.close(self._read)
        os.close(self._write)
