"""How the link thread sleeps: until its next deadline, until another thread hands it an
event, or until a heartbeat's ACK deadline that the library's read thread can call off
without waking it.

An ACK deadline is a timer that is almost never needed: the ACK is back in milliseconds.
Slept on like the other deadlines, it woke the link thread once per heartbeat for
nothing; woken by the ACK instead, the same. A timerfd is a kernel timer that another
thread disarms with one system call, so the link thread wakes for an ACK deadline only
when the ACK really is late, and an idle agent wakes once per heartbeat, like a bare
client. Where there is no timerfd the deadline is slept on as before.
"""
from __future__ import annotations

import collections
import ctypes
import os
import select
import threading

CLOCK_MONOTONIC = 1           # what time.monotonic() reads on Linux
TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    # time_t and long are both a C long on every Debian 12 architecture (armhf included)
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class _TimerFd:
    """A CLOCK_MONOTONIC timerfd (Python 3.11 has no os.timerfd_create)."""

    def __init__(self):
        # PyDLL keeps the GIL through the call: released, the library thread that the
        # heartbeat just woke took it, and the link thread switched out to get it back
        libc = ctypes.PyDLL(None, use_errno=True)
        create, self._settime = libc.timerfd_create, libc.timerfd_settime
        create.argtypes = [ctypes.c_int, ctypes.c_int]
        self._settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec),
                                  ctypes.c_void_p]
        self.fd = create(CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create")
        self._spec = _Itimerspec()     # one, filled in place: set() runs once per heartbeat
        self._spec_ref = ctypes.byref(self._spec)

    def set(self, at: float | None) -> None:
        """Fire once at monotonic time ``at``; None disarms. Not thread-safe (Wakeup
        calls it under its lock)."""
        value = self._spec.it_value
        if at is None:
            value.tv_sec = value.tv_nsec = 0
        else:
            value.tv_sec = sec = int(at)
            # an all-zero value would disarm: a deadline at 0 is long past anyway
            value.tv_nsec = max(1, int((at - sec) * 1e9))
        if self._settime(self.fd, TFD_TIMER_ABSTIME if at is not None else 0,
                         self._spec_ref, None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime")

    def close(self) -> None:
        os.close(self.fd)


def _timerfd() -> _TimerFd | None:
    try:
        return _TimerFd()
    except (OSError, AttributeError):
        return None


class Wakeup:
    """Events from any thread, and the link thread's sleep."""

    def __init__(self, cancellable_deadlines: bool = True):
        self._items: collections.deque = collections.deque()
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)  # type: ignore[attr-defined]
        self._poll = select.poll()
        self._poll.register(self._efd, select.POLLIN)
        self._timer = _timerfd() if cancellable_deadlines else None
        if self._timer is not None:
            self._poll.register(self._timer.fd, select.POLLIN)
        self._lock = threading.Lock()   # the armed deadline: link thread vs read thread
        self._armed: tuple | None = None  # (key, at)
        self._called_off = None             # a key whose ACK came before its deadline was armed

    @property
    def cancellable(self) -> bool:
        """Deadlines can be armed and called off; without a timerfd arm() and call_off()
        do nothing and the caller sleeps on its deadlines itself."""
        return self._timer is not None

    # -- from any thread --------------------------------------------------------
    def put(self, item, wake: bool = True) -> None:
        """An event for the link thread; with wake=False it waits for the next turn."""
        self._items.append(item)
        if wake:
            os.eventfd_write(self._efd, 1)  # type: ignore[attr-defined]

    def call_off(self, key) -> None:
        """The deadline armed for ``key`` is no longer needed (its ACK came), or will not
        be when it is armed: on a short round trip the ACK beats the arming."""
        if self._timer is None:
            return
        with self._lock:
            if self._armed is not None and self._armed[0] == key:
                self._timer.set(None)
                self._armed = None
            else:
                self._called_off = key

    # -- the link thread --------------------------------------------------------
    def arm(self, key, at: float) -> None:
        """Wake at ``at`` unless call_off(key) comes first."""
        self._set(key, at)

    def disarm(self) -> None:
        self._set(None, None)

    def _set(self, key, at: float | None) -> None:
        if self._timer is None:
            return
        with self._lock:   # the called-off check and the arming, as one step
            wanted = (key, at) if at is not None and key != self._called_off else None
            if wanted != self._armed:
                self._timer.set(wanted[1] if wanted else None)
                self._armed = wanted

    def wait(self, timeout_s: float) -> None:
        # rounded up: never early. Only what poll saw ready is read (eventfd counter,
        # timer expirations): most turns end in a timeout and read nothing.
        for fd, _ in self._poll.poll(max(0, int(timeout_s * 1000 + 0.999))):
            try:
                os.read(fd, 8)
            except BlockingIOError:
                pass  # a timer called off between its firing and this read

    def take(self):
        """The oldest item, or None."""
        try:
            return self._items.popleft()
        except IndexError:
            return None

    def take_all(self) -> list:
        out = []
        while (item := self.take()) is not None:
            out.append(item)
        return out

    def close(self) -> None:
        """Only once no thread can call put() any more: a write to a closed, reused
        descriptor would land elsewhere."""
        os.close(self._efd)
        if self._timer is not None:
            self._timer.close()

