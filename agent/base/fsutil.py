"""Files the agent keeps: replaced so that readers and power cuts see the old one or the
new one, read within a bound, set aside when corrupt, and never reached through a link
someone else planted.

The state directory belongs to the agent's user. A command run as root there (an
operator's `sudo edge-agent enqueue`) first becomes that user (`drop_to_owner`), so it
can never do more than the agent could; files are opened with O_NOFOLLOW besides.
"""
from __future__ import annotations

import errno
import json
import os
import secrets
import stat
import time


class UnsafePath(Exception):
    """A path a privileged command must not use: one line saying why."""


class NotRegularFile(OSError):
    """A FIFO, device or directory where a file was expected: refused unread, since it
    could block the reader or feed it forever."""


class FileTooLarge(ValueError):
    """A file over the bound its reader set."""


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


def write_in_place(path: str, data: bytes, mode: int = 0o644, create: bool = True) -> None:
    """``data`` written over the regular file at ``path`` (made with ``mode`` where it
    is missing and the directory lets us), for a file in a directory that is not ours
    to rename in (the metrics' textfile in root's, grants.py): never through a link,
    never waiting on a FIFO. A shorter text is padded with newlines to the file's length
    rather than cut (a reader between a write and a cut would see the old text's tail);
    the file shrinks when emptied. A reader may meet a write half done: it is one
    pwrite of a few kB, microseconds."""
    fd = os.open(path, os.O_WRONLY | (os.O_CREAT if create else 0) | os.O_NOFOLLOW
                 | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", path)
        if stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)
        if not data:
            os.ftruncate(fd, 0)
            return
        body = data + b"\n" * max(0, st.st_size - len(data))
        written = 0
        while written < len(body):
            written += os.pwrite(fd, body[written:], written)
    finally:
        os.close(fd)


def read_bounded(path: str, max_bytes: int, follow_links: bool = False,
                 dir_fd: int | None = None) -> bytes:
    """The regular file at ``path`` (relative to ``dir_fd`` if given), at most
    ``max_bytes`` of it, else FileTooLarge. Not through a link unless ``follow_links``
    (OSError ELOOP); NotRegularFile for anything but a regular file, which is never
    waited on (O_NONBLOCK). FileNotFoundError and any other OSError pass as they are."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", path)
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(max_bytes + 1)
    finally:
        os.close(fd)
    if len(raw) > max_bytes:
        raise FileTooLarge(f"{path}: over {max_bytes} bytes")
    return raw


# what a failing card answers a read with, now and perhaps not the next time
CARD_ERRORS = frozenset({errno.EIO, errno.EAGAIN, errno.EBUSY, errno.ENOMEM, errno.ETIMEDOUT,
                         errno.EUCLEAN})


def retrying(read, tries: int = 3, pause_s: float = 0.2):
    """``read()``, again after an I/O error (a card that failed one read may take the
    next); the last error raised. A read error is never an answer ("no file", "empty"):
    the callers raise or report it as what it is."""
    for attempt in range(tries):
        try:
            return read()
        except OSError as e:
            if e.errno not in CARD_ERRORS or attempt == tries - 1:
                raise
            time.sleep(pause_s * (attempt + 1))


def read_json(path: str, max_bytes: int, follow_links: bool = False,
              dir_fd: int | None = None):
    """The JSON document in ``path``, read as ``read_bounded`` does; ValueError (of
    which FileTooLarge is one) for a file too large or not JSON, nested past the parser's
    depth included."""
    raw = read_bounded(path, max_bytes, follow_links, dir_fd)
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):   # UnicodeDecodeError is a ValueError
        raise ValueError(f"{path}: not JSON") from None


def set_aside(path: str, why: str) -> str | None:
    """Renames a file its reader cannot use to ``<path>.<why>-<time>`` beside it, kept for
    inspection: the new path, or None when it cannot be moved (a read-only card). Never
    raises."""
    aside = f"{path}.{why}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        os.replace(path, aside)
    except OSError:
        return None
    return aside
