"""What a device id and a token may look like: one rule each, for every place that
takes one in (the configuration, the credentials file, an enrollment answer, a
server's message)."""
from __future__ import annotations

import re

DEVICE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
DEVICE_ID_RULE = "1-128 characters of A-Z a-z 0-9 . _ : -"
TOKEN_RULE = "1-4096 characters, none of them a space"


def usable_device_id(value) -> bool:
    return isinstance(value, str) and DEVICE_ID_RE.match(value) is not None


def usable_token(value) -> bool:
    return (isinstance(value, str) and 0 < len(value) <= 4096
            and not any(c.isspace() for c in value))
