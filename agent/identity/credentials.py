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
from .rules import usable_token

log = logging.getLogger("edge_agent.identity")


class Credentials:
    def __init__(self, state_dir: str):
        self.path = os.path.join(state_dir, "credentials.json")

    def _field(self, name: str):
        try:
            with open(self.path, "rb") as f:
                return json.loads(f.read(65536)).get(name)
        except (OSError, ValueError, AttributeError):
            return None

    def server_device_id(self) -> str | None:
        """The id a server assigned (screentinker profile), if it assigned one."""
        value = self._field("server_device_id")
        return value if isinstance(value, str) and value else None

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
            token = doc["token"]
            if not usable_token(token):
                raise ValueError("bad token")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            aside = f"{self.path}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}"
            os.replace(self.path, aside)
            log.error("credentials file %s is corrupt; kept aside as %s, enrolling again",
                      self.path, aside)
            return None
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
