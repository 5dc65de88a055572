"""Which boot this is: the kernel's boot id, a token of this boot that holds inside a
container too, and whether this process is the agent's first start since the machine
booted (a service restart is not a boot); and how this device is rebooted or powered
off (``ask_logind``: the reboot command's, the recovery ladder's)."""
from __future__ import annotations

import os
from typing import Callable

from . import status_file
from .fsutil import atomic_write, read_bounded

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
BOOT_MARK = "last-start-boot-id"


def boot_id() -> str:
    try:
        with open(BOOT_ID_PATH) as f:
            return f.read().strip()
    except OSError:
        return ""


def first_start_of_boot(state_dir: str, runtime_dir: str | None = None) -> bool:
    """The boot (the kernel's boot id and when the service manager started) is compared
    with the one the previous start left in the state directory. Not the runtime
    directory: systemd removes it at a stop (and at a `systemctl restart`, whose stop
    half is a stop), so a service restart would read as a reboot. One small write a
    boot, not durable: a power cut that loses it is a boot anyway. Where the state
    directory has no mark yet, ``runtime_dir`` (kept across the upgrade's restart) still
    says whether this boot has seen a start: 0.2.2's mark there, or an earlier release's
    status file (each release since 0.1.0 wrote one there)."""
    path = os.path.join(state_dir, BOOT_MARK)
    kernel, manager = boot_id(), manager_started()
    current = f"{kernel} {manager}" if manager else kernel
    kept = _read_mark(path)
    if kept is None and runtime_dir is not None and kernel and _an_earlier_start_left(
            runtime_dir, kernel):
        kept = current   # the upgrade's restart, within the boot the last release started in
        _keep_mark(path, current, "the boot id")
    if kept == current:
        return False
    _keep_mark(path, current, "the boot id")
    return True


def _an_earlier_start_left(runtime_dir: str, kernel: str) -> bool:
    """Called before this process writes anything there: a tmpfs emptied at every boot."""
    if _read_mark(os.path.join(runtime_dir, BOOT_MARK)) == kernel:
        return True
    return os.path.isfile(os.path.join(runtime_dir, status_file.NAME))


def manager_started() -> str:
    """When this boot's service manager started (systemd's UserspaceTimestampMonotonic),
    "" where it cannot be asked. The kernel's boot id alone is the host's inside a
    container once the unit's sandbox mounts its own /proc (ProtectProc=, seen on
    bookworm's systemd 252 in systemd-nspawn: the container's own id is lost), and
    would never change at the container's reboot; its manager starts again at each."""
    import subprocess   # here: `status` asks only for the boot id
    try:
        r = subprocess.run(["systemctl", "show", "--property=UserspaceTimestampMonotonic",
                            "--value"], capture_output=True, text=True, timeout=5,
                           env={"PATH": "/usr/bin:/bin", "SYSTEMD_PAGER": ""})
    except (OSError, subprocess.SubprocessError):
        return ""
    value = r.stdout.strip()
    return value if r.returncode == 0 and value.isdigit() and value != "0" else ""


def ask_logind(verb: str, run: Callable[[list[str]], str]) -> str:
    """A reboot or power-off asked of logind, as polkit lets the edge-agent user ask for
    exactly this (/usr/share/polkit-1/rules.d/50-edge-agent.rules), so the sandbox stays
    shut. ``run(argv)`` runs it, bounded, and answers "" or why it failed; this answers
    "" once asked (the device goes down soon after), else why not."""
    why = run(["systemctl", verb, "--no-ask-password"])
    return f"{verb} refused: {why}" if why else ""


def boot_token(runtime_dir: str) -> str:
    """Which boot this is, for the command ledger. The kernel's boot_id is the host's
    inside a container, so the mark is a token in the runtime directory: tmpfs, kept
    across restarts of the service (RuntimeDirectoryPreserve=restart), gone at every
    boot."""
    path = os.path.join(runtime_dir, "boot-token")
    token = _read_mark(path)
    if token:
        return token
    token = os.urandom(8).hex()
    _keep_mark(path, token, "the boot token")
    return token


def _read_mark(path: str) -> str | None:
    try:
        return read_bounded(path, 64).decode("ascii", "replace").strip()
    except (OSError, ValueError):   # absent, a link, not a file, too long: no mark
        return None


def _keep_mark(path: str, value: str, what: str) -> None:
    try:
        atomic_write(path, value.encode(), 0o644, durable=False)
    except OSError as e:
        import logging
        logging.getLogger("edge_agent").warning("cannot keep %s in %s: %s", what, path, e.strerror)
