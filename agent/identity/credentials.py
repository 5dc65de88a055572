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

from ..fsutil import atomic_write
from .rules import token_problem, usable_device_id

log = logging.getLogger("edge_agent.identity")


class Credentials:
    def __init__(self, state_dir: str):
        self.path = os.path.join(state_dir, "credentials.json")

    def _field(self, name: str):
        try:
            with open(self.path, "rb") as f:
                return json.loads(f.read(65536)).get(name)
        except (OSError, ValueError, AttributeError, RecursionError):
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
        """The stored token for ``device_id``, or None (absent, corrupt or another id's)."""
        try:
            with open(self.path, "rb") as f:
                raw = f.read(65536)
        except FileNotFoundError:
            return None
        except OSError as e:
            log.warning("cannot read %s: %s", self.path, e.strerror)
            return None
        try:
            doc = json.loads(raw)
            problem = (token_problem("token", doc["token"]) if isinstance(doc, dict)
                       else "not a JSON object")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError) as e:
            problem = "token: missing" if isinstance(e, KeyError) else "not JSON"
        if problem is not None:
            # an SD card that lied, or a file from a build whose token rule was looser
            self._set_aside(problem)
            return None
        token = doc["token"]
        if doc.get("device_id") != device_id:
            log.warning("stored credentials belong to another device id; enrolling again")
            return None
        return token

    def _set_aside(self, problem: str) -> None:
        aside = f"{self.path}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}"
        try:
            os.replace(self.path, aside)
        except OSError as e:
            # a read-only card: ignored in memory, and again at each start until writable
            log.error("credentials file %s is unusable (%s) and cannot be moved aside (%s); "
                      "ignoring it, enrolling again", self.path, problem, e.strerror)
            return
        log.error("credentials file %s is unusable (%s); kept aside as %s, enrolling again",
                  self.path, problem, aside)

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
