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

from ..fsutil import atomic_write, read_json
from .rules import Expiry

FILE = "fleet-settings.json"
MAX_BYTES = 256 * 1024


@dataclass
class Revision:
    revision: int
    values: dict
    until: dict[str, Expiry] = field(default_factory=dict)
    received_at: float = 0.0      # wall, for people

    def to_dict(self) -> dict:
        return {"revision": self.revision, "values": self.values, "received_at": self.received_at,
                "until": {k: {"boot": e.boot, "at": e.at} for k, e in self.until.items()}}

    @staticmethod
    def from_dict(d) -> "Revision | None":
        if d is None:
            return None
        rev, values, until = d["revision"], d["values"], d.get("until", {})
        if isinstance(rev, bool) or not isinstance(rev, int) or not isinstance(values, dict) \
                or not isinstance(until, dict):
            raise ValueError("bad revision")
        return Revision(rev, values, {str(k): Expiry(str(e["boot"]), float(e["at"]))
                                      for k, e in until.items()},
                        float(d.get("received_at", 0.0)))


@dataclass
class Overlay:
    current: Revision | None = None
    good: Revision | None = None        # what a failed trial goes back to; None: the file alone
    trial_starts: int | None = None     # starts on ``current`` without proof; None: not on trial
    outcome: dict | None = None         # the last trial's end: revision, result, why, at, announced

    def to_dict(self) -> dict:
        return {"current": self.current.to_dict() if self.current else None,
                "good": self.good.to_dict() if self.good else None,
                "trial_starts": self.trial_starts, "outcome": self.outcome}


def read(state_dir: str) -> tuple[Overlay, str | None]:
    """(the overlay, None) or (an empty overlay, why the file was not used)."""
    try:
        dfd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return Overlay(), None
    except OSError as e:
        return Overlay(), f"{state_dir}: {e.strerror}"
    path = os.path.join(state_dir, FILE)
    try:
        doc = read_json(FILE, MAX_BYTES, dir_fd=dfd)
    except FileNotFoundError:
        return Overlay(), None
    except (OSError, ValueError) as e:
        return Overlay(), f"{path}: {getattr(e, 'strerror', None) or e}"
    finally:
        os.close(dfd)
    try:
        starts = doc.get("trial_starts")
        if starts is not None and (isinstance(starts, bool) or not isinstance(starts, int)):
            raise ValueError("bad trial_starts")
        outcome = doc.get("outcome")
        return Overlay(Revision.from_dict(doc.get("current")), Revision.from_dict(doc.get("good")),
                       starts, outcome if isinstance(outcome, dict) else None), None
    except (AttributeError, KeyError, TypeError, ValueError):
        return Overlay(), f"{path}: not an overlay this agent wrote"


def write(state_dir: str, overlay: Overlay) -> None:
    atomic_write(os.path.join(state_dir, FILE),
                 json.dumps(overlay.to_dict(), sort_keys=True).encode(), 0o600, durable=True)


def remove(state_dir: str) -> None:
    """The overlay gone (the last resort when it cannot be rewritten); OSError if not."""
    try:
        os.unlink(os.path.join(state_dir, FILE))
    except FileNotFoundError:
        pass
