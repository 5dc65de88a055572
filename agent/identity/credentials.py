"""The device token on disk: written atomically, 0600, checked when read.

Atomic means temp file, fsync, rename, fsync of the directory: after a power cut or a
kill -9 there is the old file or the new one, never half of either. A file that is
corrupt anyway (an SD card that lied) is kept aside for inspection and the device
re-enrolls, instead of crash-looping on it.
"""
from __future__ import annotations

import json
import logging
import os
import time

from ..base.fsutil import NotRegularFile, atomic_write, read_json, retrying, set_aside
from ..base.identifiers import token_problem, usable_device_id

log = logging.getLogger("edge_agent.identity")
MAX_BYTES = 64 * 1024
FILE = "credentials.json"   # in the state directory


class CredentialsUnreadable(OSError):
    """The card would not give the credentials file (an I/O error, a denied read): not
    the same as no file. Taken for "unpaired", it would show a new code and need the
    screen paired again by hand; the agent stops instead, and systemd tries again."""


class Credentials:
    def __init__(self, state_dir: str):
        self.path = os.path.join(state_dir, FILE)

    def _read(self):
        """The file's document (read again after an I/O error); FileNotFoundError when
        there is none, CredentialsUnreadable when the card will not give it, ValueError
        when it is not JSON."""
        try:
            return retrying(lambda: read_json(self.path, MAX_BYTES, follow_links=True))
        except FileNotFoundError:
            raise
        except NotRegularFile:   # a FIFO or a device is damage, not a card that failed
            raise ValueError(f"{self.path}: not a regular file") from None
        except OSError as e:
            raise CredentialsUnreadable(e.errno, f"cannot read {self.path}: "
                                                 f"{e.strerror or type(e).__name__}") from None

    def _field(self, name: str):
        try:
            return self._read().get(name)
        except (FileNotFoundError, ValueError, AttributeError):
            return None

    def server_device_id(self) -> str | None:
        """The id a server assigned (screentinker profile), if it assigned one."""
        value = self._field("server_device_id")
        return value if usable_device_id(value) else None

    def pairing_code(self) -> str | None:
        """The code this device registered with (screentinker), until claimed."""
        value = self._field("pairing_code")
        return value if isinstance(value, str) and len(value) == 6 and value.isdigit() else None

    def claimed(self) -> bool:
        """An operator claimed this device on the server (screentinker)."""
        return self._field("claimed") is True

    def load(self, device_id: str) -> str | None:
        """The stored token for ``device_id``, or None (absent, corrupt or another id's);
        CredentialsUnreadable when the card will not give the file."""
        try:
            doc = self._read()     # CredentialsUnreadable: not "unpaired"
            problem = (token_problem("token", doc["token"]) if isinstance(doc, dict)
                       else "not a JSON object")
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as e:
            problem = "token: missing" if isinstance(e, KeyError) else "not JSON"
        if problem is not None:
            # an SD card that lied, or a file from a build whose token rule was looser
            aside = set_aside(self.path, "corrupt")
            if aside is None:
                # a read-only card: ignored in memory, and again at each start until writable
                log.error("credentials file %s is unusable (%s) and cannot be moved aside; "
                          "ignoring it, enrolling again", self.path, problem)
            else:
                log.error("credentials file %s is unusable (%s); kept aside as %s, enrolling "
                          "again", self.path, problem, aside)
            return None
        token = doc["token"]
        if doc.get("device_id") != device_id:
            log.warning("stored credentials belong to another device id; enrolling again")
            return None
        return token

    def save(self, device_id: str, token: str, server_device_id: str | None = None,
             pairing_code: str | None = None, claimed: bool | None = None) -> None:
        doc = {"device_id": device_id, "token": token, "saved_at": round(time.time())}
        if server_device_id:
            doc["server_device_id"] = server_device_id
        if pairing_code:
            doc["pairing_code"] = pairing_code
        if claimed is not None:
            doc["claimed"] = claimed
        atomic_write(self.path, json.dumps(doc).encode())

    def clear(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
