"""The six-digit pairing code a screen shows until an operator claims it: how one is
made and how it is shown (``123-456``), wherever it comes from."""
from __future__ import annotations

import secrets


def new_code() -> str:
    return f"{secrets.randbelow(10 ** 6):06d}"


def shown(code: str) -> str:
    return f"{code[:3]}-{code[3:]}"
