"""The commands the operator configured (display, screenshot): each in a session of its
own, so that at its bound, or when the agent stops, its whole process group goes, and
nothing it spawned outlives it or holds its pipes.

What went wrong is said in one way everywhere (``failure``): the program's name, its
exit status and the last line it wrote to stderr, never its command line, which may
carry a networked display's password, and which would reach the fleet, the status file
and the journal."""
from __future__ import annotations

import os
import selectors
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Callable

# what a bounded run still reads once its own process has exited: output its pipe
# holds, not a background child that keeps it open (that one is killed with the group)
LEFTOVER_S = 0.2
READ_CHUNK = 65536
DRAIN_CHUNKS = 16        # read at most this many chunks of each pipe at one look


def spawn(argv: list[str], env: dict | None = None,
          merge_stderr: bool = False) -> subprocess.Popen:
    """Started with no stdin and both outputs piped (``merge_stderr``: into one pipe, in
    the order written, as a terminal shows them), in ``env`` (default: the agent's);
    OSError (not found, not allowed) passes as it is."""
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                            start_new_session=True, env=env)


@dataclass
class Bounded:
    """What a bounded run gave: the first ``max_bytes`` of its output, how many more
    bytes it wrote (read and dropped), its exit status (None: killed, at the time bound
    or, ``flooded``, past the output's)."""
    output: bytes
    dropped: int
    exit: int | None
    took_s: float
    flooded: bool = False


def collect(child: subprocess.Popen, timeout_s: float, max_bytes: int, max_drain: int,
            mono: Callable[[], float] = time.monotonic) -> Bounded:
    """Reads ``child``'s (merged) output, keeping at most ``max_bytes``, until it exits
    and its pipe is drained, or ``timeout_s``; past ``max_drain`` bytes more it is
    stopped (a `yes` would otherwise spin a core until the bound). Whatever is left of its process group
    then (a background child it forked, the whole line at the bound) is killed while
    its zombie still holds the group's id, so no other process can be hit; then it is
    reaped. Memory is bounded whatever it writes, and time by ``timeout_s`` plus a
    moment."""
    start = mono()
    deadline = start + timeout_s
    kept, dropped = bytearray(), 0
    assert child.stdout is not None, "spawned with stdout=PIPE"
    fd = child.stdout.fileno()
    os.set_blocking(fd, False)
    exited_at = None
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            now = mono()
            if exited_at is None and _exited(child.pid):
                exited_at = now
            end = deadline if exited_at is None else min(deadline, exited_at + LEFTOVER_S)
            if now >= end:
                break
            # short waits: the exit of a child whose pipe a grandchild holds is seen
            if not sel.select(min(end - now, 0.05)):
                continue
            try:
                chunk = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                continue
            if not chunk:   # EOF: every writer is gone; wait for the exit itself
                if exited_at is None:
                    _wait_exit(child.pid, deadline, mono)
                    exited_at = mono() if _exited(child.pid) else None
                break
            room = max_bytes - len(kept)
            kept += chunk[:room]
            dropped += max(0, len(chunk) - room)
            if dropped > max_drain:
                break
    flooded = dropped > max_drain
    timed_out = exited_at is None
    kill_group(child)   # the zombie (or the live child) keeps the group's id ours
    _reap(child)
    return Bounded(bytes(kept), dropped, None if timed_out or flooded else child.returncode,
                   mono() - start, flooded)


def _exited(pid: int) -> bool:
    """Whether the child exited, without reaping it (its pid, the group's id, stays
    ours until it is reaped)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _wait_exit(pid: int, deadline: float, mono: Callable[[], float]) -> None:
    while not _exited(pid) and mono() < deadline:
        time.sleep(0.01)


def finish(child: subprocess.Popen, timeout_s: float) -> tuple[bytes, bytes]:
    """Its stdout and stderr once it exits; subprocess.TimeoutExpired at the bound, by
    when its group is killed and it is reaped, its pipes never read on (a grandchild in
    a session of its own may hold them open for ever)."""
    try:
        return child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(child)
        _reap(child)
        raise


class Started:
    """A program run, judged one way whether its caller waits for it (``wait()``, the
    screen's runner for the working hours' and the mender's turns) or looks at it now
    and then (``look()``, a thread that serves other things meanwhile: base/steps.py's
    Stepper). Its answer is ``(stdout, "")`` once it has exited 0, ``(stdout, why)``
    once it exited otherwise (``failure``'s words), ``(None, why)`` at its bound, by
    when its group is killed. At most ``max_bytes`` of each of its outputs is kept (the
    rest read and dropped, so a chatty program never blocks on its pipe). A background
    child it leaves is its own business, as with ``finish``, unless it is still there
    at the bound or at ``kill()``; one that holds the pipes does not delay the answer.
    At its end it is reaped and ``ended(self)`` is told."""

    def __init__(self, child: subprocess.Popen, argv: list[str], timeout_s: float,
                 ended: Callable[["Started"], None] = lambda started: None,
                 mono: Callable[[], float] = time.monotonic, max_bytes: int = READ_CHUNK):
        self.child, self.argv, self.timeout_s = child, argv, timeout_s
        self.deadline = mono() + timeout_s
        self._ended, self._mono, self._max = ended, mono, max_bytes
        # stdout's and stderr's descriptors (None: not piped), and what each gave
        self._fds = tuple(p.fileno() if p is not None else None
                          for p in (child.stdout, child.stderr))
        self._kept = {fd: bytearray() for fd in self._fds if fd is not None}
        self._open = set(self._kept)   # the pipes not at their end yet
        for fd in self._kept:
            os.set_blocking(fd, False)

    def look(self) -> tuple[bytes | None, str] | None:
        """The answer if there is one now, else None."""
        self._drain()
        if _exited(self.child.pid):
            self._drain()   # what it wrote before it exited
            out, err = (bytes(self._kept[fd]) if fd is not None else b"" for fd in self._fds)
            _reap(self.child)
            self._ended(self)
            code = self.child.returncode
            return (out, "") if code == 0 else (out, failure(self.argv, exited=code, stderr=err))
        if self._mono() >= self.deadline:
            self.kill()
            return None, failure(self.argv, timeout_s=self.timeout_s)
        return None

    def wait(self) -> tuple[bytes | None, str]:
        """The answer, on the calling thread: its outputs read as they come, its exit
        seen within a few hundredths of a second (short waits: a pipe a background child
        holds says nothing of the exit)."""
        with selectors.DefaultSelector() as sel:
            watched = set(self._open)
            for fd in watched:
                sel.register(fd, selectors.EVENT_READ)
            while (answer := self.look()) is None:
                for ended in watched - self._open:   # at its end: no more to wait for
                    sel.unregister(ended)
                watched &= self._open
                left = min(max(self.deadline - self._mono(), 0.0), 0.05)
                if sel.get_map():
                    sel.select(left)
                else:
                    time.sleep(min(left, 0.01))
        return answer

    def kill(self) -> None:
        kill_group(self.child)
        _reap(self.child)
        self._ended(self)

    def _drain(self) -> None:
        for fd in list(self._open):
            kept = self._kept[fd]
            for _ in range(DRAIN_CHUNKS):   # a writer that never stops waits for the next look
                try:
                    chunk = os.read(fd, READ_CHUNK)
                except BlockingIOError:
                    break
                except OSError:
                    chunk = b""
                if not chunk:
                    self._open.discard(fd)
                    break
                kept += chunk[:max(0, self._max - len(kept))]


def split(command: str) -> tuple[list[str], str]:
    """A configured command line's words, or ([], why they cannot be run)."""
    try:
        argv = shlex.split(command)
    except ValueError as e:
        return [], f"the configured command cannot be split: {e}"
    return argv, "" if argv else "the configured command is empty"


def program(argv: list[str]) -> str:
    """The name a failure is told by: the program's, without its directory or arguments."""
    return os.path.basename(argv[0]) if argv else "(no program)"


def failure(argv: list[str], *, exited: int | None = None, stderr: bytes = b"",
            timeout_s: float | None = None, error: OSError | None = None) -> str:
    """Why a configured command failed, in words that never hold its command line."""
    name = program(argv)
    if error is not None:
        return f"{name}: {error.strerror or type(error).__name__}"
    if timeout_s is not None:
        return f"{name} timed out after {timeout_s:g} s"
    said = stderr.decode(errors="replace").strip().splitlines()
    return f"{name} exited {exited}" + (f": {said[-1][:200]}" if said else "")


def kill_group(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # gone already (its pid, the group's id, is ours until it is reaped)


def _reap(child: subprocess.Popen) -> None:
    for pipe in (child.stdout, child.stderr):
        if pipe is not None:
            pipe.close()
    try:
        child.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass  # SIGKILLed: only an uninterruptible sleep keeps it; not ours to wait out
