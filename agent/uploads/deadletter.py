"""The spool's dead-letter file: why each item that will never be sent was dropped.

One JSON line per item (id, kind, sha256, when it was queued, when it failed, the
reason), fsync'd before the item is settled, so the reason survives a power cut. Past
``MAX_BYTES`` the file becomes ``.1``: the last ~10,000 reasons are kept.
"""
from __future__ import annotations

import json
import os
from typing import Callable

from ..base.fsutil import loads

NAME = "dead-letter.jsonl"
MAX_BYTES = 1 << 20
_FILES = (NAME + ".1", NAME)   # oldest first


def line(item_id: str, kind: str, sha256: str, created_at: float, failed_at: float,
         reason: str) -> str:
    return json.dumps({"id": item_id, "kind": kind, "sha256": sha256, "created_at": created_at,
                       "failed_at": failed_at, "reason": reason}) + "\n"


class DeadLetterFile:
    """The dead-letter files in the spool directory ``dir_fd``, opened by ``open_file``
    (name, flags) -> fd, the store's, which never follows a link."""

    def __init__(self, dir_fd: int, open_file: Callable[[str, int], int]):
        self._dir_fd, self._open = dir_fd, open_file
        self._counted: tuple[list, int] = ([], 0)   # (the files' stat, their lines)

    def append(self, lines: str) -> None:
        try:
            st = os.stat(NAME, dir_fd=self._dir_fd, follow_symlinks=False)
            if st.st_size > MAX_BYTES:
                os.replace(NAME, NAME + ".1", src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
        except FileNotFoundError:
            pass
        with os.fdopen(self._open(NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab") as f:
            f.write(lines.encode())
            f.flush()
            os.fsync(f.fileno())

    def records(self) -> list[dict]:
        out = []
        for name in _FILES:
            try:
                text = self._read(name).decode("utf-8", "replace")
                out += [loads(line) for line in text.splitlines(keepends=True)
                        if line.endswith("\n")]
            except (FileNotFoundError, ValueError):
                pass
        return out

    def count(self) -> int:
        """Lines in the files, counted again only when they changed: the store's stats()
        runs on every status refresh, and the files hold up to ~20,000 reasons."""
        key = []
        for name in _FILES:
            try:
                st = os.stat(name, dir_fd=self._dir_fd, follow_symlinks=False)
                key.append((st.st_ino, st.st_size, st.st_mtime_ns))
            except FileNotFoundError:
                key.append(None)
        if key != self._counted[0]:
            count = 0
            for name, stamp in zip(_FILES, key):
                if stamp is not None:
                    count += self._read(name).count(b"\n")
            self._counted = (key, count)
        return self._counted[1]

    def _read(self, name: str) -> bytes:
        with os.fdopen(self._open(name, os.O_RDONLY), "rb") as f:
            return f.read()
