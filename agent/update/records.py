"""What both sides of a self-update read: the root side's history of outcomes, and
dpkg's record of the installed version."""
from __future__ import annotations

import os
import subprocess

from ..base.fsutil import load_state
from . import rules


def read_history(root_dir: str) -> list:
    """The outcomes the root side kept (rules.remember), oldest first; [] when there
    are none or the file is not a history."""
    doc, _ = load_state(os.path.join(root_dir, rules.HISTORY_FILE), rules.MAX_RECORD_BYTES,
                        _entries)
    return doc or []


def installed_version(fully: bool = False) -> str:
    """The package's version as dpkg records it, or "" if it has none; with ``fully``,
    only a version installed and configured ("ii"), not one dpkg is in the middle of.
    OSError or subprocess.SubprocessError if dpkg-query cannot answer."""
    r = subprocess.run(["dpkg-query", "-W", "-f=${Version} ${db:Status-Abbrev}", rules.PACKAGE],
                       capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"})
    version, _, abbrev = r.stdout.partition(" ")
    if r.returncode != 0 or (fully and abbrev.strip() != "ii"):
        return ""
    return version


def _entries(doc) -> list:
    if not isinstance(doc, list) or not all(isinstance(d, dict) for d in doc):
        raise ValueError("not a list of outcomes")
    return doc
