"""Replacing a file so that readers and power cuts see the old one or the new one."""
from __future__ import annotations

import os
import tempfile


def atomic_write(path: str, data: bytes, mode: int = 0o600, durable: bool = True) -> None:
    """Temp file, rename over ``path``; with ``durable``, fsync the file and the directory
    too, so the rename survives a power cut (the SD card). Without it (tmpfs state that
    only has to be whole, not kept) no fsync is paid."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=directory)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
