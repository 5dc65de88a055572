"""The identity on the card bound to the board it was made on: a card imaged from
another screen's (machine id, state directory and all) becomes a screen of its own.

The state directory keeps ``board.json``: a hash of what a copy of the card cannot
carry (the board's serial, base/hardware.py; never the serial itself). At each start
the board says its own again, and ``judge`` compares:

- the same: this card's identity is this board's;
- none kept yet (the first start, or an agent from before this check): bound now;
- another: the card was made from another screen. Its credentials and device id, and
  what was that screen's to say as itself (the command ledger, the upload queue), are
  kept aside (renamed, never deleted), the device id is derived again with this
  board's fingerprint in it, and the screen pairs as a new one; said once in the
  journal (CARD_CLONED), and in `edge-agent status` and the doctor for as long as
  ``board.json`` remembers it;
- the board says nothing readable (no serial, a DMI uuid only root may read): today's
  behaviour, and status says the clone check is unavailable.
"""
from __future__ import annotations

import json
import logging
import os
import time

from ..base.clock import printable_wall
from ..base.fsutil import an_object, atomic_write, load_state, set_aside
from ..base.identifiers import usable_device_id
from ..base.journal_fields import MessageId, journal
from ..config.model import COMMANDS_FILE, QUEUE_DIR
from . import credentials

log = logging.getLogger("edge_agent.identity")

FILE = "board.json"
MAX_BYTES = 4096
# what a clone's start moves aside, in the state directory: the identity, and what was
# the other screen's to say as itself (its commands' results, its queued uploads: a
# screenshot of that screen sent as this one's)
IDENTITY_FILES = (credentials.FILE, "device_id", COMMANDS_FILE, QUEUE_DIR)
BOUND, BOUND_NOW, CLONED, UNAVAILABLE = "bound", "bound-now", "cloned", "unavailable"
TODO = ("this screen pairs as a new screen: enter the code it shows on the server. The "
        "screen its card was copied from keeps its identity. Image cards from a card "
        "that never ran the agent (docs/install.md, \"Many screens from one image\")")


def judge(kept: dict | None, found: tuple[str, str] | None) -> str:
    """Pure: what ``board.json`` says (None: nothing usable) against what this board
    says now (base/hardware.board_fingerprint)."""
    if found is None:
        return UNAVAILABLE
    if kept is None or not isinstance(kept.get("board"), str):
        return BOUND_NOW
    return BOUND if kept["board"] == found[1] else CLONED


def read(state_dir: str) -> dict | None:
    """``board.json``, or None (none, unreadable, not the document it should be)."""
    doc, why = load_state(os.path.join(state_dir, FILE), MAX_BYTES, an_object)
    if why:
        log.warning("ignoring %s (%s): the board is bound again", os.path.join(state_dir, FILE), why)
    return doc


def _previous_device_id(state_dir: str) -> str | None:
    try:
        with open(os.path.join(state_dir, "device_id"), "rb") as f:
            value = f.read(200).decode("ascii", "replace").strip()
    except OSError:
        return None
    return value if usable_device_id(value) else None


def check(state_dir: str, found: tuple[str, str] | None, movable: bool = True) -> dict:
    """At the start, before the device id and the credentials are read: binds this
    board, or starts a fresh identity on a cloned card (``movable``: False where the
    identity is configured in agent.toml, which no check may move). Returns what
    status says (``snapshot``'s document). Never raises: a card that cannot take the
    file is bound at a later start."""
    kept = read(state_dir)
    verdict = judge(kept, found)
    if verdict == UNAVAILABLE:
        return {"clone_check": UNAVAILABLE, **history(kept)}
    where, fingerprint = found
    if verdict == BOUND:
        return {"clone_check": BOUND, "read_from": where, **history(kept)}
    doc = {"board": fingerprint, "read_from": where, "bound_at": round(time.time())}
    if verdict == CLONED:
        previous = _previous_device_id(state_dir)
        if not movable:
            log.warning("this card was made from another screen's (the board's serial is not "
                        "the one its identity was made on), but the identity is configured in "
                        "agent.toml: give this screen its own [identity] device_id and token",
                        extra=journal(MessageId.CARD_CLONED))
            return {"clone_check": CLONED, "read_from": where, "configured": True,
                    "todo": "give this screen its own [identity] device_id and token in agent.toml"}
        # bound first: a start that dies between the moves and this must not take
        # the next start for a clone again (and a new identity at every start)
        doc["cloned_from"] = {"device_id": previous, "at": doc["bound_at"], "kept_aside": []}
        if not _keep(state_dir, doc):
            return {"clone_check": CLONED, "read_from": where,
                    "stuck": os.path.join(state_dir, FILE)}
        for name in IDENTITY_FILES:
            path = os.path.join(state_dir, name)
            if os.path.lexists(path):
                moved = set_aside(path, "cloned")
                if moved is None:
                    log.error("this card was made from another screen's, and %s cannot be "
                              "moved aside: starting with it as it is", path)
                    continue
                doc["cloned_from"]["kept_aside"].append(os.path.basename(moved))
        _keep(state_dir, doc)
        log.warning("this card was made from another screen's card: the board's %s is not "
                    "the one its identity was made on (%s). That identity (device id %s) is "
                    "kept aside as %s; %s", where, os.path.join(state_dir, FILE),
                    previous or "unknown", ", ".join(doc["cloned_from"]["kept_aside"]) or
                    "nothing", TODO, extra=journal(MessageId.CARD_CLONED))
    else:
        _keep(state_dir, doc)
    return {"clone_check": BOUND, "read_from": where, **history(doc)}


def _keep(state_dir: str, doc: dict) -> bool:
    try:
        atomic_write(os.path.join(state_dir, FILE), json.dumps(doc).encode(), 0o644)
    except OSError as e:
        log.warning("cannot keep %s (%s): the board is bound at a later start",
                    os.path.join(state_dir, FILE), e.strerror)
        return False
    return True


def history(kept: dict | None) -> dict:
    """What status keeps saying of a clone this card was made from."""
    cloned = kept.get("cloned_from") if isinstance(kept, dict) else None
    if not isinstance(cloned, dict):
        return {}
    at, aside = cloned.get("at"), cloned.get("kept_aside")
    return {"cloned_from": cloned.get("device_id") if usable_device_id(cloned.get("device_id"))
            else None,
            # the agent user's file: a time a wall clock can say, a list of names, or nothing
            "cloned_at": at if printable_wall(at) else None,
            "kept_aside": [n[:100] for n in aside if isinstance(n, str)][:4]
            if isinstance(aside, list) else [],
            "todo": TODO}



def fresh_board(check_result: dict, found: tuple[str, str] | None) -> str | None:
    """The fingerprint to derive a new device id with, after a clone was set aside."""
    return found[1] if found is not None and check_result.get("cloned_from") and \
        check_result.get("clone_check") == BOUND else None
