"""What a failing SD card says: the errors that are the card itself, not the agent (a
full disk, a permission, a bug), told apart from the rest."""
from __future__ import annotations

import errno

READ_ONLY, FAILED, UNAVAILABLE = "read-only", "failed", "unavailable"
# What the card says when it is the card, not us: read-only after an ext4 error, an I/O
# error, a file system ext4 found corrupt (EUCLEAN), a card gone from its slot.
_CARD_ERRNOS = {errno.EROFS: READ_ONLY, errno.EIO: FAILED, errno.EUCLEAN: FAILED,
                errno.ENODEV: FAILED, errno.ENXIO: FAILED}


def card_failure(e: BaseException | None) -> str | None:
    """READ_ONLY or FAILED when ``e`` (or what it was raised from) says the card itself
    failed; None for everything else (a full disk, a permission, a bug)."""
    seen = 0
    while e is not None and seen < 5:
        if isinstance(e, OSError) and e.errno in _CARD_ERRNOS:
            return _CARD_ERRNOS[e.errno]
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


def describe(e: BaseException) -> tuple[str, str | None]:
    """(the reason in words, the errno's name) of the OSError at the root of ``e``."""
    root = e
    while not isinstance(root, OSError) and (root.__cause__ or root.__context__) is not None:
        root = root.__cause__ or root.__context__
    if isinstance(root, OSError) and root.errno is not None:
        return (root.strerror or str(root)), errno.errorcode.get(root.errno)
    return str(e) or type(e).__name__, None
