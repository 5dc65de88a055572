"""The C library, for the few calls os has no word for (the clock's adjtimex, a queue
segment's fallocate with FALLOC_FL_KEEP_SIZE, prctl): opened in this one place, once,
at the first such call. ctypes is imported only then, so a process that makes none of
them (`edge-agent status`, `enqueue`) pays nothing for it."""
from __future__ import annotations

_libc = None


def libc():
    """The process's C library (a ``ctypes.CDLL`` whose calls set errno for
    ``ctypes.get_errno()``); OSError where it cannot be opened."""
    global _libc
    if _libc is None:
        import ctypes
        import ctypes.util
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc
