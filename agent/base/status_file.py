"""The status file: the document the running agent keeps on tmpfs, read by
`edge-agent status`, by root's installer (is the new version's link proven?) and by
the tests. Its reading and writing are here, the document's content is the status
board's (app/status.py)."""
from __future__ import annotations

import errno
import json

from .fsutil import FileTooLarge, NotRegularFile, atomic_write, read_json

NAME = "status.json"   # in the runtime directory, since 0.1.0
MAX_STATUS_BYTES = 1 << 20


class StatusFileError(Exception):
    pass


def write(path: str, status: dict) -> None:
    # tmpfs: whole, not durable; readers see the old file or the new one, never half.
    # Compact: only json's C encoder is used without indent, a third of the cost of a
    # refresh on an idle agent (`edge-agent status --json` prints it indented).
    atomic_write(path, json.dumps(status, sort_keys=True, separators=(",", ":")).encode(),
                 0o644, durable=False)


def read(path: str) -> dict:
    """The agent's user writes this file and `edge-agent status` may read it as root:
    never through a link, never a FIFO or device that could block or feed it forever."""
    try:
        data = read_json(path, MAX_STATUS_BYTES)
    except FileNotFoundError:
        raise StatusFileError(f"{path}: no status file (is the agent running?)") from None
    except NotRegularFile:
        raise StatusFileError(f"{path}: not a regular file, not a status file") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StatusFileError(f"{path}: a symbolic link, not a status file") from None
        raise StatusFileError(f"{path}: {e.strerror}") from None
    except FileTooLarge:
        raise StatusFileError(f"{path}: too large to be a status file") from None
    except ValueError:
        raise StatusFileError(f"{path}: not a valid status file") from None
    if not isinstance(data, dict):
        raise StatusFileError(f"{path}: not a valid status file")
    return data
