"""The overlay file: the revision in force, the last good one, the trial and its outcome.

Written durably (it must survive the power cut that may follow a push) and only when a
revision arrives, is kept or rolled back: never per heartbeat. Read by the agent and by
root's ExecStartPre (the grants follow the settings in force), so it is read without
following a link, within a bound, and a damaged file is an empty overlay with a reason,
never an exception: the local file alone is always a configuration that runs.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from ..base.fsutil import atomic_write, read_json, retrying
from . import revision as revision_rules
from .revision import Expiry, finite

FILE = "fleet-settings.json"
MAX_BYTES = 256 * 1024


@dataclass
class Revision:
    """One revision of the fleet's settings: its values and when each expires."""
    revision: int
    values: dict
    until: dict[str, Expiry] = field(default_factory=dict)
    received_at: float = 0.0      # wall, for people

    def to_dict(self) -> dict:
        return {"revision": self.revision, "values": self.values, "received_at": self.received_at,
                "until": {k: {"boot": e.boot, "at": e.at} for k, e in self.until.items()}}

    @staticmethod
    def from_dict(d) -> "Revision | None":
        """ValueError for anything this agent would not have written: the file is read by
        root before the agent starts, and a card may have damaged it since."""
        if d is None:
            return None
        if not isinstance(d, dict):
            raise ValueError("a revision is not an object")
        rev, until = d["revision"], d.get("until", {})
        if not _count(rev, revision_rules.MAX_REVISION):
            raise ValueError("revision")
        values = revision_rules.stored_values(d["values"])
        if not isinstance(until, dict) or set(until) - set(values):
            raise ValueError("until")
        expiries = {}
        for key, e in until.items():
            if not isinstance(e, dict) or not isinstance(e.get("boot"), str) \
                    or finite(e.get("at")) is None:
                raise ValueError(f"until.{key}")
            expiries[key] = Expiry(e["boot"], finite(e["at"]))
        received = finite(d.get("received_at", 0.0))
        if received is None:
            raise ValueError("received_at")
        return Revision(rev, values, expiries, received)


def _count(value, top: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and 0 <= value <= top


def _outcome(doc):
    """The last trial's end as written by the service, or ValueError."""
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise ValueError("outcome")
    checks = {"revision": lambda v: _count(v, revision_rules.MAX_REVISION),
              "result": lambda v: isinstance(v, str) and len(v) <= 64,
              "why": lambda v: isinstance(v, str) and len(v) <= 4096,
              "keys": lambda v: isinstance(v, list) and len(v) <= revision_rules.MAX_SETTINGS
              and all(isinstance(k, str) and len(k) <= 200 for k in v),
              "at": lambda v: finite(v) is not None,
              "announced": lambda v: isinstance(v, bool)}
    for key, ok in checks.items():
        if key in doc and not ok(doc[key]):
            raise ValueError(f"outcome.{key}")
    return doc


@dataclass
class Overlay:
    """The fleet's overlay on the card: the revision on trial, the good one, the last end."""
    current: Revision | None = None
    good: Revision | None = None        # what a failed trial goes back to; None: the file alone
    trial_starts: int | None = None     # starts on ``current`` without proof; None: not on trial
    outcome: dict | None = None         # the last trial's end: revision, result, why, at, announced
    # the highest revision this screen ever staged: remembered past a rollback to the file
    # alone or an expiry, so that revisions only go up
    highest: int = 0

    def seen(self) -> int:
        """The highest revision this overlay knows of, in force, kept or ended."""
        revisions = [self.highest, self.current.revision if self.current else 0,
                     self.good.revision if self.good else 0]
        if self.outcome and _count(self.outcome.get("revision"), revision_rules.MAX_REVISION):
            revisions.append(self.outcome["revision"])
        return max(revisions)

    def to_dict(self) -> dict:
        return {"current": self.current.to_dict() if self.current else None,
                "good": self.good.to_dict() if self.good else None,
                "trial_starts": self.trial_starts, "outcome": self.outcome,
                "highest": self.seen()}


class Unreadable(str):
    """Why the overlay was not used, when the card would not give it (an I/O error): the
    file alone runs meanwhile, but the file on the card is not to be written over."""


def read(state_dir: str) -> tuple[Overlay, str | None]:
    """(the overlay, None) or (an empty overlay, why the file was not used: Unreadable
    when the card would not give it)."""
    try:
        dfd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return Overlay(), None
    except OSError as e:
        return Overlay(), f"{state_dir}: {e.strerror}"
    path = os.path.join(state_dir, FILE)
    try:
        doc = retrying(lambda: read_json(FILE, MAX_BYTES, dir_fd=dfd))
    except FileNotFoundError:
        return Overlay(), None
    except OSError as e:
        return Overlay(), Unreadable(f"{path}: {e.strerror or type(e).__name__}")
    except ValueError as e:   # its text names the file relative to the directory
        return Overlay(), f"{path}: {str(e).split(': ', 1)[-1]}"
    finally:
        os.close(dfd)
    try:
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        starts = doc.get("trial_starts")
        if starts is not None and not _count(starts, 1 << 30):
            raise ValueError("trial_starts")
        highest = doc.get("highest", 0)
        if not _count(highest, revision_rules.MAX_REVISION):
            raise ValueError("highest")
        overlay = Overlay(Revision.from_dict(doc.get("current")),
                          Revision.from_dict(doc.get("good")), starts,
                          _outcome(doc.get("outcome")), highest)
    except (AttributeError, KeyError, TypeError, ValueError, ArithmeticError,
            RecursionError) as e:
        # whatever the damage, a reason and the file alone: never an exception out of here
        # (root's ExecStartPre and the installer read this before the agent runs)
        what = f" ({e})" if isinstance(e, ValueError) and str(e) else ""
        return Overlay(), f"{path}: not an overlay this agent wrote{what[:80]}"
    overlay.highest = overlay.seen()
    return overlay, None


def write(state_dir: str, overlay: Overlay) -> None:
    atomic_write(os.path.join(state_dir, FILE),
                 json.dumps(overlay.to_dict(), sort_keys=True).encode(), 0o600, durable=True)


def remove(state_dir: str) -> None:
    """The overlay gone (the last resort when it cannot be rewritten); OSError if not."""
    try:
        os.unlink(os.path.join(state_dir, FILE))
    except FileNotFoundError:
        pass
