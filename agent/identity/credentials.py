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

log = logging.getLogger("edge_agent.identity")


class Credentials:
    def __init__(self, state_dir: str):
        self.path = os.path.join(state_dir, "credentials.json")

    def server_device_id(self) -> str | None:
        """The id a server assigned (screentinker profile), if it assigned one."""
        try:
            with open(self.path, "rb") as f:
                value = json.loads(f.read(65536)).get("server_device_id")
        except (OSError, ValueError, AttributeError):
            return None
        return value if isinstance(value, str) and value else None

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
            if not isinstance(token, str) or not token or len(token) > 4096:
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

    def save(self, device_id: str, token: str, server_device_id: str | None = None) -> None:
        doc = {"device_id": device_id, "token": token, "saved_at": round(time.time())}
        if server_device_id:
            doc["server_device_id"] = server_device_id
        atomic_write(self.path, json.dumps(doc).encode())

    def clear(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
