"""The agent's side of a self-update: wait for the order's moment in its rollout window,
download the package from the fleet server (resuming a partial download), check its
size, SHA-256 and signature, stage it, and ask systemd for edge-agent-update.service
(polkit allows exactly that, while [commands] allow lists update). The outcome comes
from the root side's history, after the restart the install causes or without one.

The agent stays unprivileged: nothing here installs anything. One thread per order;
an order is a remote command, so it runs at most once, and one interrupted before it
was staged is reported as not installed (the server may send it again).
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import random
import subprocess
import threading
import time
from typing import Callable

import requests
import urllib3

from ..base.backoff import ceiling
from ..base.http import HostileAnswer, body_chunks, fleet_url
from ..base.fsutil import atomic_write, read_json
from ..base.journal_fields import MessageId, journal
from ..runtime.deadline import deadline
from ..runtime.threads import start_worker
from . import apt, records, rules
from .signature import KEYS_DIR, SignatureError, verify

log = logging.getLogger("edge_agent.update")

UPDATE_UNIT = "edge-agent-update.service"
DOWNLOAD_TRIES = 4
DOWNLOAD_LIMIT_S = 1800.0   # the whole download, a slow trickle included
POLL_S = 2.0
# how long an order may go without an outcome while the root side's transaction stays
# in one phase (each is bounded: dpkg and its retries, the proof time of at most an
# hour); then the command says so rather than run for ever
OUTCOME_LIMIT_S = 2 * 3600.0   # per phase of the root side's transaction
CHUNK = 1 << 16
# Why an order's thread is neither restarted nor on the watchdog gate (runtime/threads.py)
ORDER_THREAD = ("one order, run at most once: it settles itself on any error, so a restart "
                "would run it twice; its waits have bounds of their own (the rollout "
                "window, DOWNLOAD_LIMIT_S, OUTCOME_LIMIT_S a phase)")
# a partial download kept for a resend of its order to resume; one older than this at a
# start is the leftover of an order that never came back, and only takes the card's room
PART_KEEP_S = 86400.0

# (ok, text) for the command's result
Settled = Callable[[str, bool, str], None]


def installed_version() -> str:
    """The package's version for the status and the order's check; "" if dpkg-query
    cannot say (not installed with dpkg: a developer's checkout)."""
    try:
        return records.installed_version()
    except (OSError, subprocess.SubprocessError):
        return ""

# the outcomes the journal's catalog explains
_MOMENTS = {rules.COMMITTED: MessageId.UPDATE_COMMITTED,
            rules.ROLLED_BACK: MessageId.UPDATE_ROLLED_BACK}


class Updater:
    def __init__(self, server_url: str, egress, state_dir: str, connect_timeout_s: float,
                 settled: Settled | None = None, root_dir: str = rules.ROOT_DIR, keys_dir: str = KEYS_DIR,
                 rng: random.Random | None = None, systemctl: str = "systemctl",
                 repository: apt.RepositoryWatch | None = None):
        """``settled(command_id, ok, text)`` is called once per order, from its thread
        (or given by subscribe(), for the commands part is built after this one);
        ``repository``: what apt's lists offer (apt.py)."""
        self.server_url, self.egress = server_url, egress
        self.staging = os.path.join(state_dir, rules.STAGING)
        self.connect_timeout_s = connect_timeout_s
        self.settled: Settled = settled or (lambda command_id, ok, text: None)
        self.root_dir, self.keys_dir = root_dir, keys_dir
        self.rng = rng or random.SystemRandom()
        self.systemctl = systemctl
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._pending: dict[str, str] = {}   # command id -> what it is doing now
        self.installed = ""                  # the package's version, read at start
        self.repository = repository or apt.RepositoryWatch()

    def subscribe(self, settled: Settled) -> None:
        """The part that ran the orders (the commands) hears each one settled."""
        self.settled = settled

    # -- what the root side wrote ------------------------------------------------------
    def history(self) -> list:
        return records.read_history(self.root_dir)

    def _held(self) -> list[dict]:
        """The orders the root side (its transaction) and the staging directory hold."""
        held = []
        for path in (os.path.join(self.root_dir, rules.TRANSACTION_FILE),
                     os.path.join(self.staging, rules.ORDER_FILE)):
            try:
                doc = read_json(path, rules.MAX_RECORD_BYTES)
            except (OSError, ValueError):
                continue
            if isinstance(doc, dict):
                held.append(doc)
        return held

    def _root_busy(self) -> str | None:
        """The id of an order held and not finished."""
        history = self.history()
        for doc in self._held():
            if rules.outcome_of(str(doc.get("id")), history) is None:
                return str(doc.get("id"))[:64]
        return None

    def _in_hand(self, cid: str) -> bool:
        return any(doc.get("id") == cid for doc in self._held())

    def _phase_of(self, cid: str) -> str | None:
        for doc in self._held():
            if doc.get("id") == cid:
                return str(doc.get("phase", "staged"))
        return None

    # -- at start -----------------------------------------------------------------------
    def recover(self, ids: list[str]) -> dict[str, tuple[bool, str] | None]:
        """For each update command the ledger had running: its result, or None while
        the root side still has it (followed from here, and settled later)."""
        found: dict[str, tuple[bool, str] | None] = {}
        self.installed = installed_version()
        self._drop_stale_parts()
        history = self.history()
        for cid in ids:
            entry = rules.outcome_of(cid, history)
            if entry is not None:
                found[cid] = rules.describe(entry)
                self._clean(cid)
            elif self._in_hand(cid):
                found[cid] = None
                self._follow(cid)
            else:
                found[cid] = (False, "interrupted by a restart before it was installed; "
                                     "nothing changed (send it again)")
        return found

    # -- an order ---------------------------------------------------------------------------
    def begin(self, cid: str, args: dict) -> None:
        """From the command executor: checks what can be checked at once (rules.NotStaged),
        then the rest goes on in a thread of its own."""
        order = rules.order(args)
        try:
            url = fleet_url(order.url, self.server_url)
        except ValueError as e:
            raise rules.NotStaged(str(e)) from None
        os.makedirs(self.staging, 0o700, exist_ok=True)
        st = os.statvfs(self.staging)
        why = rules.refusal(order, installed=installed_version(), history=self.history(),
                            free_bytes=st.f_bavail * st.f_frsize)
        if why is not None:
            raise rules.NotStaged(why)
        delay = rules.install_delay(order.window_s, self.rng)
        with self._lock:
            busy = next(iter(self._pending), None) or self._root_busy()
            if busy:
                raise rules.NotStaged(f"another update is in progress ({busy})")
            self._pending[cid] = f"waiting {delay:.0f}s in the rollout window"
        log.info("update to %s: installing in %.0fs (a random moment in a %ds window)",
                 order.version, delay, order.window_s)
        start_worker("update", lambda: self._run(cid, order, url, delay), reason=ORDER_THREAD)

    def _run(self, cid: str, order: rules.Order, url: str, delay: float) -> None:
        try:
            if self._stopping.wait(delay):
                return   # the ledger says it was running: reported as interrupted
            self._note(cid, f"downloading {order.version}")
            path = self._download(order, url)
            self._note(cid, f"checking {order.version}")
            try:
                key = verify(path, order.signature, self.keys_dir)
            except SignatureError as e:
                with contextlib.suppress(OSError):
                    os.unlink(path)
                raise rules.NotStaged(f"refused: {e}") from None
            log.info("update to %s: signature good (key %s), staged", order.version, key)
            self._stage(cid, order, path)
            self._note(cid, f"installing {order.version}")
            self._start_installer()
        except rules.NotStaged as e:
            self._settle(cid, False, str(e))
            return
        except Exception as e:   # a bug must not leave the command running for ever
            log.error("update %s: %s: %s", cid, type(e).__name__, e, exc_info=True)
            self._settle(cid, False, f"internal error: {type(e).__name__}")
            return
        self._wait_for_outcome(cid)

    def _download(self, order: rules.Order, url: str) -> str:
        """The package in the staging directory, whole and with the order's SHA-256. A
        partial one (from a drop, or from before a restart) is resumed where it
        stopped, if the server honours the range, and restarted otherwise."""
        part = os.path.join(self.staging, f"{order.sha256}.part")
        for name in os.listdir(self.staging):
            if name.endswith(".part") and name != os.path.basename(part):
                os.unlink(os.path.join(self.staging, name))
        session = self.egress.session(url)
        problem = ""
        give_up = time.monotonic() + DOWNLOAD_LIMIT_S
        for attempt in range(DOWNLOAD_TRIES):
            # the one backoff rule (base/backoff.py): 2 s, 4 s, 8 s between the tries
            if attempt and self._stopping.wait(ceiling(1.0, 30.0, attempt)):
                raise rules.NotStaged("the agent is stopping")
            bound = None
            try:
                have = os.path.getsize(part) if os.path.exists(part) else 0
                if have > order.size:
                    os.unlink(part)
                    have = 0
                if have == order.size:
                    break
                headers = {"Range": f"bytes={have}-"} if have else {}
                # never redirected: the package comes from the fleet server or not at all;
                # the download's bound covers each attempt from its first byte (a server
                # trickling its headers included), not only the body
                with deadline(max(0.001, give_up - time.monotonic())) as bound, \
                        session.get(url, headers=headers, stream=True, allow_redirects=False,
                                    timeout=(self.connect_timeout_s, 30.0)) as r:
                    if 300 <= r.status_code < 400:
                        raise rules.NotStaged(f"download refused: the server redirected it "
                                        f"({r.status_code}); a package is fetched from the "
                                        "fleet server only")
                    if r.status_code == 200:
                        have = 0
                    elif r.status_code != 206 or not have:
                        problem = f"the server answered {r.status_code}"
                        if 400 <= r.status_code < 500 and r.status_code not in (408, 429):
                            raise rules.NotStaged(f"download refused: {problem}")
                        continue
                    have = self._write_part(part, have, order, body_chunks(r, CHUNK))
                if have == order.size:
                    break
                problem = f"the download stopped at {have} of {order.size} bytes"
            except HostileAnswer as e:
                raise rules.NotStaged(f"download refused: {e}") from None
            except (requests.RequestException, urllib3.exceptions.HTTPError) as e:
                # the stream raises urllib3's own errors (ProtocolError, ReadTimeoutError)
                problem = ("cut at the download's bound" if bound is not None and bound.expired
                           else type(e).__name__)
            except OSError as e:
                raise rules.NotStaged(f"cannot write {part}: {e.strerror}") from None
            if time.monotonic() >= give_up:
                # a trickle: each read within its timeout, the whole never done
                raise rules.NotStaged(f"download too slow: not done in {DOWNLOAD_LIMIT_S:.0f}s "
                                f"({problem})")
        else:
            raise rules.NotStaged(f"download failed {DOWNLOAD_TRIES} times: {problem}")
        digest = hashlib.sha256()
        with open(part, "rb") as f:
            for chunk in iter(lambda: f.read(CHUNK), b""):
                digest.update(chunk)
        if digest.hexdigest() != order.sha256:
            os.unlink(part)
            raise rules.NotStaged("refused: the package's SHA-256 is not the order's")
        return part

    @staticmethod
    def _write_part(part: str, have: int, order: rules.Order, chunks) -> int:
        """The body appended to the partial file at ``have``: the bytes it now holds. A
        body longer than the order's size, or a card that cannot take it (full, failing),
        ends the order and leaves nothing on the card: what was written is of no use."""
        try:
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.seek(have)
                f.truncate()
                for chunk in chunks:
                    have += len(chunk)
                    if have > order.size:
                        raise rules.NotStaged(f"the package is larger than the order's "
                                        f"{order.size} bytes")
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
        except rules.NotStaged:
            _unlink(part)
            raise
        except requests.RequestException:
            raise   # (an OSError too) the network's: what arrived is kept, to resume
        except OSError as e:
            _unlink(part)
            raise rules.NotStaged(f"cannot write {part}: {e.strerror}") from None
        return have

    def _drop_stale_parts(self) -> None:
        """At start: partial downloads no order came back for within PART_KEEP_S."""
        try:
            names = os.listdir(self.staging)
        except OSError:
            return
        for name in names:
            path = os.path.join(self.staging, name)
            try:
                if name.endswith(".part") and \
                        time.time() - os.lstat(path).st_mtime > PART_KEEP_S:
                    os.unlink(path)
            except OSError:
                pass

    def _stage(self, cid: str, order: rules.Order, path: str) -> None:
        """Package and signature first, the order last: the root side acts on an order
        file, and one it finds is always whole and matches the files beside it."""
        order_file = os.path.join(self.staging, rules.ORDER_FILE)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(order_file)
        os.replace(path, os.path.join(self.staging, rules.PACKAGE_FILE))
        atomic_write(os.path.join(self.staging, rules.SIGNATURE_FILE), order.signature)
        doc = {"id": cid, "version": order.version, "url": order.url, "size": order.size,
               "sha256": order.sha256, "signature": base64.b64encode(order.signature).decode(),
               "window_s": order.window_s, "retry": order.retry}
        atomic_write(order_file, json.dumps(doc, sort_keys=True).encode())

    def _start_installer(self) -> None:
        try:
            r = subprocess.run([self.systemctl, "start", "--no-block", "--no-ask-password",
                                UPDATE_UNIT], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise rules.NotStaged(f"systemctl start {UPDATE_UNIT}: {type(e).__name__}") from None
        if r.returncode != 0:
            raise rules.NotStaged(f"systemctl start {UPDATE_UNIT} refused: "
                            + (r.stderr.strip() or r.stdout.strip())[:300])

    # -- the outcome ----------------------------------------------------------------------
    def _follow(self, cid: str) -> None:
        with self._lock:
            self._pending[cid] = "installing"
        start_worker("update", lambda: self._resume(cid), reason=ORDER_THREAD)

    def _resume(self, cid: str) -> None:
        """An order staged before a restart: the root side may never have been asked
        (the agent stopped in between); asking again is harmless."""
        if not os.path.exists(os.path.join(self.root_dir, rules.TRANSACTION_FILE)):
            try:
                self._start_installer()
            except rules.NotStaged as e:
                self._settle(cid, False, str(e))
                return
        self._wait_for_outcome(cid)

    def _wait_for_outcome(self, cid: str) -> None:
        limit, phase = time.monotonic() + OUTCOME_LIMIT_S, None
        while not self._stopping.wait(POLL_S):
            now_phase = self._phase_of(cid)
            if now_phase != phase:
                limit, phase = time.monotonic() + OUTCOME_LIMIT_S, now_phase
            entry = rules.outcome_of(cid, self.history())
            if entry is not None:
                ok, text = rules.describe(entry)
                self._settle(cid, ok, text, _MOMENTS.get(entry.get("outcome")))
                return
            if not self._in_hand(cid):
                self._settle(cid, False, "the installer lost the order; nothing changed")
                return
            if time.monotonic() > limit:
                self._settle(cid, False, f"no outcome from {UPDATE_UNIT} in "
                                         f"{OUTCOME_LIMIT_S / 3600:.0f} h (journalctl -u "
                                         f"{UPDATE_UNIT})")
                return

    def _settle(self, cid: str, ok: bool, text: str, moment: str | None = None) -> None:
        with self._lock:
            self._pending.pop(cid, None)
        self._clean(cid)
        (log.info if ok else log.warning)("update %s: %s", cid, text,
                                          extra=journal(moment, COMMAND_ID=cid))
        self.settled(cid, ok, text)

    def _clean(self, cid: str) -> None:
        """The staged files of a settled order (the root side has its own copy)."""
        order_file = os.path.join(self.staging, rules.ORDER_FILE)
        try:
            doc = read_json(order_file, rules.MAX_RECORD_BYTES)
        except (OSError, ValueError):
            doc = None
        if isinstance(doc, dict) and doc.get("id") not in (cid, None):
            return
        for name in (rules.ORDER_FILE, rules.PACKAGE_FILE, rules.SIGNATURE_FILE):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.staging, name))

    def _note(self, cid: str, doing: str) -> None:
        with self._lock:
            if cid in self._pending:
                self._pending[cid] = doing

    def snapshot(self) -> dict:
        with self._lock:
            pending = dict(self._pending)
        history = self.history()
        repository = self.repository.snapshot()
        if repository is not None:
            repository = {**repository,
                          "behind": rules.behind(self.installed, repository.get("newest"))}
        return {"installed": self.installed, "pending": [{"id": k, "doing": v} for k, v in pending.items()],
                "last": history[-1] if history else None, "repository": repository}

    def stop(self) -> None:
        self._stopping.set()


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
