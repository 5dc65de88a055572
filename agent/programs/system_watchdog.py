"""Root's side of the system's own watchdog: the drop-in that asks systemd's PID 1 for
``RuntimeWatchdogSec`` (base/system_watchdog.py) made where ``[device]
hardware_watchdog`` is on and removed where it is not, by edge-agent.service's start
step (grants.py's main, one process for both), and systemd told.

Only the operator's layers decide it: the key is not one the fleet may set (an overlay
that names it is refused whole, config/load.py), so nothing the agent's user writes
turns the board's watchdog on or off. The drop-in's directory is reached from / through
directories root owns and alone may write, never through a link; the file is replaced
by a rename, never written through. Nothing changes at a stop: the board's watchdog is
the system's, and stays armed while the agent restarts.

``systemctl daemon-reload`` applies it: PID 1 parses system.conf and its drop-ins again
at a reload and sets the watchdog from them (systemd 252 and 257, src/core/main.c's
reload path, then set_manager_settings()); no re-exec. It runs only when the file
changed, never per start (a reload reads every unit: a second or so on a Pi).
"""
from __future__ import annotations

import contextlib
import os
import stat
import subprocess

from ..base import children
from ..base.fsutil import NotRegularFile, atomic_write, read_bounded
from ..base.system_watchdog import DROPIN_DIR, DROPIN_NAME, MAX_DROPIN, dropin_text
from .grants import GrantError, _check_root_dir, _open_root_dir

RELOAD_TIMEOUT_S = 60.0   # a reload of every unit on a slow card; the start waits on it
RELOAD = ["systemctl", "daemon-reload"]


def daemon_reload() -> str | None:
    """systemd told; None, or why not (the drop-in then applies at the next boot)."""
    try:
        child = children.spawn(RELOAD)
        _, err = children.finish(child, RELOAD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"systemctl daemon-reload: no answer in {RELOAD_TIMEOUT_S:g} s"
    except OSError as e:
        return children.failure(RELOAD, error=e)
    if child.returncode != 0:
        return children.failure(RELOAD, exited=child.returncode, stderr=err)
    return None


def sync(seconds: int | None, source: str, directory: str = DROPIN_DIR,
         reload=None) -> str | None:
    """The drop-in made exactly what ``seconds`` asks (None: none), then systemd told
    (``reload()``: None or why it failed). Returns what changed ("+watchdog 15s",
    "-watchdog"), with the reload's failure after "; ", or None: nothing to change.
    GrantError (or OSError) where the directory is not root's alone."""
    text = dropin_text(seconds, source)
    parent_path, name = os.path.split(directory.rstrip("/"))
    parent = _open_root_dir(parent_path)
    try:
        if text is not None:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=parent)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=parent)
        except FileNotFoundError:
            return None   # nothing there to remove
        try:
            _check_root_dir(fd, directory)
            if _current(fd) == text:
                return None
            if text is None:
                os.unlink(DROPIN_NAME, dir_fd=fd)
                os.fsync(fd)
                changed = "-watchdog"
            else:
                # the directory's mode went through the unit's UMask=0077 if mkdir made it
                if stat.S_IMODE(os.fstat(fd).st_mode) != 0o755:
                    os.fchmod(fd, 0o755)
                atomic_write(DROPIN_NAME, text.encode(), 0o644, durable=True, dir_fd=fd)
                changed = f"+watchdog {seconds}s"
        finally:
            os.close(fd)
    finally:
        os.close(parent)
    why = (reload or daemon_reload)()
    return changed if why is None else f"{changed}; {why}"


def _current(fd: int) -> str | None:
    """The drop-in's text where it is root's regular file, 0644; "" for anything else
    there (a link, a directory, another mode): not ours as it stands, made anew; None
    where there is nothing."""
    try:
        st = os.stat(DROPIN_NAME, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(st.st_mode):
        raise GrantError(f"{DROPIN_NAME} is a directory: left alone")
    if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or stat.S_IMODE(st.st_mode) != 0o644:
        return ""
    try:
        return read_bounded(DROPIN_NAME, MAX_DROPIN, dir_fd=fd).decode("utf-8", "replace")
    except (OSError, ValueError, NotRegularFile):
        return ""
