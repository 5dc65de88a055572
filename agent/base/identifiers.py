"""What a device id and a token may look like: one rule each, for every place that
takes one in (the configuration, the credentials file, an enrollment answer, a
server's message).

A token travels in an HTTP header (``Authorization: Bearer``), which is bytes on the
wire: RFC 6750's ``b64token`` is what a bearer token may be there, and nothing outside
ASCII ever reaches a header encoder. A device id goes into URL paths. Both rules match
the whole string (``fullmatch``): a trailing newline is not a character a rule allows.
"""
from __future__ import annotations

import re

DEVICE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
DEVICE_ID_RULE = "1-128 characters of A-Z a-z 0-9 . _ : -"
TOKEN_MAX = 4096
# RFC 6750 section 2.1: b64token = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="
TOKEN_RE = re.compile(r"[A-Za-z0-9._~+/-]+=*")
TOKEN_RULE = (f"1-{TOKEN_MAX} characters of A-Z a-z 0-9 - . _ ~ + /, then only = "
              "(an RFC 6750 bearer token)")


def usable_device_id(value) -> bool:
    return isinstance(value, str) and DEVICE_ID_RE.fullmatch(value) is not None


def usable_token(value) -> bool:
    return (isinstance(value, str) and len(value) <= TOKEN_MAX
            and TOKEN_RE.fullmatch(value) is not None)


def token_problem(field: str, value) -> str | None:
    """The one-line error for ``field`` carrying ``value`` as a token, or None if usable.
    Never quotes the value: it may be a real token."""
    if usable_token(value):
        return None
    if not isinstance(value, str):
        return f"{field}: not a string ({TOKEN_RULE})"
    return f"{field}: {TOKEN_RULE}"


def new_code() -> str:
    """A six-digit pairing code, the screen shows until an operator claims it."""
    import secrets   # here: what only reads identifiers (`edge-agent status`) needs none
    return f"{secrets.randbelow(10 ** 6):06d}"


def shown(code: str) -> str:
    """A pairing code as the screen shows it: ``123-456``."""
    return f"{code[:3]}-{code[3:]}"
