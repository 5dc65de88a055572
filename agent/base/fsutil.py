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
import math
import os
import stat
import time
from typing import Any, Callable, TypeVar


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


def atomic_write(path: str, data: bytes, mode: int = 0o600, durable: bool = True,
                 dir_fd: int | None = None) -> None:
    """Temp file, rename over ``path``; with ``durable``, fsync the file and the directory
    too, so the rename survives a power cut (the SD card). Without it (tmpfs state that
    only has to be whole, not kept) no fsync is paid. The directory is opened without
    following a link, and the temp file is created with O_EXCL|O_NOFOLLOW inside it; a
    rename replaces a link at ``path``, it never writes through one. ``dir_fd``: the
    directory, opened and checked by the caller (root's, every step of the way), and
    ``path`` a name in it."""
    if dir_fd is None:
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, mode=0o700, exist_ok=True)
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    else:
        dfd = dir_fd
    try:
        name = os.path.basename(path)
        tmp = f".{name}.{os.urandom(6).hex()}"
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
        if dir_fd is None:
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


MAX_LINKS = 40   # the kernel's own bound on links in one lookup (ELOOP)


def _writable_by_others(st: os.stat_result) -> bool:
    """A directory someone but root may add a name to (a sticky one included: a link
    planted there is as good as any)."""
    return st.st_uid != 0 or bool(st.st_mode & 0o022)


def read_following_roots_links(path: str, max_bytes: int) -> bytes:
    """``read_bounded`` for a root process reading a file that a root-owned setting names
    (systemd follows links there, so must we to read what it reads): a symbolic link on
    the way is followed only where it sits in a directory root alone may write; one in
    a directory anyone else may write raises UnsafePath. Every directory is then opened
    without following links, by descriptor, so nothing swapped in after the check is
    followed either (it fails with ELOOP)."""
    pending = [p for p in path.split("/") if p]
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    links = 0
    try:
        while pending:
            name = pending.pop(0)
            if name == ".":
                continue
            if name == "..":
                up = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = up
                continue
            st = os.lstat(name, dir_fd=fd)
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, "too many levels of symbolic links", path)
                here = os.fstat(fd)
                if _writable_by_others(here):
                    raise UnsafePath(
                        f"{path}: a symbolic link on the way ({name}) is in a directory "
                        f"owned by uid {here.st_uid} with mode "
                        f"{stat.S_IMODE(here.st_mode):o}, which others than root may "
                        f"write; not followed as root")
                target = os.readlink(name, dir_fd=fd)
                pending[:0] = [p for p in target.split("/") if p]
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                continue
            if not pending:
                return read_bounded(name, max_bytes, dir_fd=fd)
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            os.close(fd)
            fd = nxt
        raise NotRegularFile(errno.EISDIR, "a directory, not a file", path)
    finally:
        os.close(fd)


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


# A number in a state file: none the agent writes (times in ms, counts, sizes) has more
# digits or is larger; more is damage, refused as it is parsed, before int() or any
# arithmetic could raise (400 digits overflow float(); 1e999 is inf, NaN compares false)
MAX_DIGITS = 19
MAX_NUMBER = 1e19


class Damaged(ValueError):
    """A state file that is not what its writer wrote: one line saying why."""


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise Damaged(f"a number of {len(text.lstrip('-'))} digits")
    return int(text)


def _bounded_float(text: str) -> float:
    value = float(text[:64]) if len(text) <= 64 else math.inf
    if not math.isfinite(value) or abs(value) >= MAX_NUMBER:
        raise Damaged(f"a number out of bounds ({text[:20]})")
    return value


def _no_constant(name: str):
    raise Damaged(f"{name} where a number belongs")


def loads(raw: bytes | str):
    """A state file's JSON, numbers bounded as they are parsed (MAX_DIGITS, finite and
    under MAX_NUMBER; NaN and Infinity refused): Damaged (a ValueError) for anything
    else, invalid UTF-8 and nesting past the parser's depth included."""
    try:
        return json.loads(raw, parse_int=_bounded_int, parse_float=_bounded_float,
                          parse_constant=_no_constant)
    except Damaged:
        raise
    except (ValueError, RecursionError):   # UnicodeDecodeError is a ValueError
        raise Damaged("not JSON") from None


def read_json(path: str, max_bytes: int, follow_links: bool = False,
              dir_fd: int | None = None):
    """The JSON document in ``path``, read as ``read_bounded`` does and parsed by
    ``loads``; ValueError (of which FileTooLarge and Damaged are) for a file too large,
    not JSON or with a number out of bounds."""
    raw = read_bounded(path, max_bytes, follow_links, dir_fd)
    try:
        return loads(raw)
    except Damaged as e:
        raise Damaged(f"{path}: {e}") from None


T = TypeVar("T")


def load_state(path: str, max_bytes: int, shape: Callable[[Any], T], *,
               follow_links: bool = False,
               dir_fd: int | None = None) -> tuple[T | None, str | None]:
    """The one loader of the agent's state files. ``shape(document)`` makes the file's
    value of its document (raising ValueError, TypeError, KeyError or the like for one
    its writer never wrote). Returns (value, None); (None, None) when there is no file;
    (None, why) when it is damaged: too large, not a regular file, a link, unreadable,
    not JSON, a number out of bounds, the wrong shape. Never raises: the caller says
    ``why`` once and uses the file's safe default."""
    try:
        return shape(read_json(path, max_bytes, follow_links, dir_fd)), None
    except FileNotFoundError:
        return None, None
    except NotRegularFile:
        return None, "not a regular file"
    except OSError as e:
        if e.errno == errno.ELOOP:
            return None, "a symbolic link"
        return None, e.strerror or type(e).__name__
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, ArithmeticError,
            RecursionError) as e:
        return None, (str(e).rsplit(": ", 1)[-1] or type(e).__name__)[:120]


def an_object(doc) -> dict:
    """``load_state``'s shape for a file that holds one JSON object, read by its keys."""
    if not isinstance(doc, dict):
        raise ValueError("not an object")
    return doc


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
