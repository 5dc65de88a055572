"""The C library, for the few calls os has no word for (the clock's adjtimex, a queue
segment's fallocate with FALLOC_FL_KEEP_SIZE, prctl): opened in this one place, once,
at the first such call.

ctypes itself is imported with this module, not at the first call: `edge-agent
enqueue` run by root first becomes the state directory's owner, and a Python whose
standard library that user cannot read (one under root's home) could not import it
then. The process's own symbols (``CDLL(None)``) hold libc's, with no search for it."""
from __future__ import annotations

import ctypes

_libc = None


def libc():
    """The process's C library (a ``ctypes.CDLL`` whose calls set errno for
    ``ctypes.get_errno()``); OSError where it cannot be opened."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc
