"""What apt on this screen knows of the package's repository: the newest version its
lists offer, and when apt last updated them with success. A screen that stopped
upgrading (a repository it cannot reach, a key expired, a proxy in the way) shows it
in the status and the metrics, read-only and bounded, never a write and never a fetch.

The lists (``/var/lib/apt/lists/*_Packages``) are streamed in chunks and searched for
the package's stanza only: Debian's own index is tens of MB, read in C, once per change
of the directory (apt renames each list in), never per status refresh. Compressed lists
(Acquire::GzipIndexes) are not read: the newest is then unknown, said as such.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Callable

from . import rules

LISTS_DIR = "/var/lib/apt/lists"
# apt.systemd.daily touches it after an `apt-get update` that succeeded
SUCCESS_STAMP = "/var/lib/apt/periodic/update-success-stamp"
MAX_LISTS = 64                 # *_Packages files looked at
MAX_LIST_BYTES = 256 << 20     # of one of them
CHUNK = 1 << 20
MAX_STANZA = 16 << 10          # the package's stanza, read around its first line
LOOK_EVERY_S = 60.0            # a stat of the directory and the stamp, at most this often


def _stanzas(path: str, needle: bytes) -> list[str]:
    """The stanzas of one list that begin with ``needle``, found without reading the
    whole file into memory; never a link, never anything but a regular file."""
    out = []
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not (st.st_mode & 0o170000 == 0o100000) or st.st_size > MAX_LIST_BYTES:
            return out
        carry, offset = b"\n", 0     # the first stanza has no line before it
        while offset < MAX_LIST_BYTES:
            chunk = os.pread(fd, CHUNK, offset)
            if not chunk:
                break
            offset += len(chunk)
            data = carry + chunk
            at = data.find(needle)
            while at != -1:
                end = data.find(b"\n\n", at)
                if end == -1 and len(data) - at < MAX_STANZA and offset < st.st_size:
                    data = data + os.pread(fd, MAX_STANZA, offset)
                    offset += MAX_STANZA
                    end = data.find(b"\n\n", at)
                stanza = data[at + 1:end if end != -1 else at + MAX_STANZA][:MAX_STANZA]
                out.append(stanza.decode("utf-8", "replace"))
                at = data.find(needle, at + 1)
            carry = data[-(len(needle) - 1):]
    finally:
        os.close(fd)
    return out


def read_repository(lists_dir: str = LISTS_DIR, stamp: str = SUCCESS_STAMP,
                    package: str = rules.PACKAGE) -> dict:
    """{"newest": the highest version the lists offer (None: none lists it),
    "lists": how many lists were read, "apt_success_at": wall time of apt's last
    successful update (the stamp, else the lists directory's own change), "since":
    which of the two}. OSError of the directory passes."""
    needle = f"\nPackage: {package}\n".encode()
    names = sorted(n for n in os.listdir(lists_dir) if n.endswith("_Packages"))[:MAX_LISTS]
    versions = []
    for name in names:
        try:
            stanzas = _stanzas(os.path.join(lists_dir, name), needle)
        except OSError:
            continue
        versions += rules.versions_in_packages("\n\n".join(stanzas), package)
    success, since = None, None
    try:
        success, since = os.stat(stamp).st_mtime, "stamp"
    except OSError:
        try:
            success, since = os.stat(lists_dir).st_mtime, "lists"
        except OSError:
            pass
    return {"newest": rules.newest(versions), "lists": len(names),
            "apt_success_at": round(success, 3) if success is not None else None,
            "since": since}


class RepositoryWatch:
    """``snapshot()``, from any thread: what read_repository said, read again only when
    the lists directory or the stamp changed, and looked at at most every LOOK_EVERY_S."""

    def __init__(self, lists_dir: str = LISTS_DIR, stamp: str = SUCCESS_STAMP,
                 clock: Callable[[], float] = time.monotonic):
        self.lists_dir, self.stamp, self.clock = lists_dir, stamp, clock
        self._lock = threading.Lock()
        self._looked_at: float | None = None
        self._seen: tuple | None = None
        self._said: dict | None = None

    def _marks(self) -> tuple:
        marks = []
        for path in (self.lists_dir, self.stamp):
            try:
                st = os.stat(path)
                marks.append((st.st_mtime_ns, st.st_ino))
            except OSError:
                marks.append(None)
        return tuple(marks)

    def snapshot(self) -> dict | None:
        with self._lock:
            now = self.clock()
            if self._looked_at is not None and now - self._looked_at < LOOK_EVERY_S:
                return self._said
            self._looked_at = now
            marks = self._marks()
            if marks == self._seen:
                return self._said
            self._seen = marks
            try:
                self._said = read_repository(self.lists_dir, self.stamp)
            except OSError:
                self._said = None    # no apt here (a developer's checkout)
            return self._said
