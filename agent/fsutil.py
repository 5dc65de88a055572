"""Files the agent keeps: replaced so that readers and power cuts see the old one or the
new one, and never reached through a link someone else planted.

The state directory belongs to the agent's user. A command run as root there (an
operator's `sudo edge-agent enqueue`) first becomes that user (`drop_to_owner`), so it
can never do more than the agent could; files are opened with O_NOFOLLOW besides.
"""
from __future__ import annotations

import os
import secrets
import stat


class UnsafePath(Exception):
    """A path a privileged command must not use: one line saying why."""


def drop_to_owner(directory: str) -> tuple[int, int]:
    """Run as root: become the owner (uid and gid, no supplementary groups) of
    ``directory``, which must be a real directory (not a link), in a parent no one but
    root or that owner may write; one that does not exist yet stays root's to make. A
    no-op for anyone but root. Returns the (uid, gid) now in effect."""
    if os.geteuid() != 0:
        return os.geteuid(), os.getegid()
    parent = os.path.dirname(os.path.abspath(directory))
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        st = None   # root makes it, in a parent nobody else can write: nothing planted yet
    try:
        pst = os.lstat(parent)
    except FileNotFoundError:
        raise UnsafePath(f"{parent}: no such directory") from None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{directory}: not a directory (a symbolic link?); refusing to use it")
    owner = 0 if st is None else st.st_uid
    if pst.st_uid not in (0, owner) or pst.st_mode & 0o022:
        # whoever may rename entries in the parent may swap the directory for a link
        raise UnsafePath(f"{parent}: writable by others than root (mode "
                         f"{stat.S_IMODE(pst.st_mode):04o}, owner {pst.st_uid}); refusing to "
                         f"use {directory} as root")
    if st is None:
        return 0, 0
    if st.st_uid != 0 or st.st_gid != 0:
        os.setgroups([])
        os.setgid(st.st_gid)
        os.setuid(st.st_uid)  # as root: real, effective and saved ids; no way back
    return st.st_uid, st.st_gid


def atomic_write(path: str, data: bytes, mode: int = 0o600, durable: bool = True) -> None:
    """Temp file, rename over ``path``; with ``durable``, fsync the file and the directory
    too, so the rename survives a power cut (the SD card). Without it (tmpfs state that
    only has to be whole, not kept) no fsync is paid. The directory is opened without
    following a link, and the temp file is created with O_EXCL|O_NOFOLLOW inside it; a
    rename replaces a link at ``path``, it never writes through one."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        name = os.path.basename(path)
        tmp = f".{name}.{secrets.token_hex(6)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dfd)
        try:
            os.fchmod(fd, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
        if durable:
            os.fsync(dfd)
    finally:
        os.close(dfd)
