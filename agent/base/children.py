"""The commands the operator configured (display, screenshot): each in a session of its
own, so that at its bound, or when the agent stops, its whole process group goes, and
nothing it spawned outlives it or holds its pipes.

What went wrong is said in one way everywhere (``failure``): the program's name, its
exit status and the last line it wrote to stderr, never its command line, which may
carry a networked display's password, and which would reach the fleet, the status file
and the journal."""
from __future__ import annotations

import os
import signal
import subprocess


def spawn(argv: list[str], env: dict | None = None) -> subprocess.Popen:
    """Started with no stdin and both outputs piped, in ``env`` (default: the agent's);
    OSError (not found, not allowed) passes as it is."""
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, env=env)


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
