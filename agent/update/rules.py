"""Self-update, sans I/O: what an update order says, whether it may go ahead, when in
its window it installs, and what the root side's transaction does at each step.

The fleet server sends an ``update`` command (a remote operation, off unless [commands]
allow lists it): the package's version, where on the server it is, its size, SHA-256
and a detached OpenPGP signature. The agent (unprivileged) checks, waits for its moment
in the rollout window, downloads and verifies, and stages the package; a root unit
verifies it again, installs it, and keeps it only if the new agent proves its link
within ``proof_timeout_s`` (status ``link.proven_live``, the proof that pets the
watchdog); otherwise it reinstalls the version it replaced. Both sides meet in two
files the root side writes: the transaction in progress and the history of outcomes.
"""
from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

PACKAGE = "edge-agent"
MAX_PACKAGE_BYTES = 64 << 20
MAX_SIGNATURE_BYTES = 4096        # a detached signature, binary or armored
MAX_WINDOW_S = 7 * 86400
# download + the root side's copy + the package kept for the next rollback, and room
SPACE_MARGIN_BYTES = 16 << 20
MAX_CRASH_RESTARTS = 3            # automatic restarts of the new agent: a crash loop
HISTORY = 10                      # outcomes the root side keeps
# Debian policy 5.6.12: [epoch:]upstream[-revision], upstream starting with a digit
# whole strings only (fullmatch): "$" also matches before a final newline
_VERSION = re.compile(r"(?:[0-9]{1,9}:)?[0-9][A-Za-z0-9.+~-]{0,62}")
_SHA256 = re.compile(r"[0-9a-f]{64}")

# where the two sides meet: the agent stages in its state directory, the root side
# keeps its own directory (readable by the agent, writable by root alone)
STAGING = "update"                       # under [agent] state_dir
ORDER_FILE, PACKAGE_FILE, SIGNATURE_FILE = "order.json", "package.deb", "package.sig"
ROOT_DIR = "/var/lib/edge-agent-update"
TRANSACTION_FILE, HISTORY_FILE = "transaction.json", "history.json"
KEPT_PACKAGE = "installed.deb"           # the version to roll back to
MAX_RECORD_BYTES = 64 << 10

# the outcomes the root side records
COMMITTED, ROLLED_BACK, REFUSED, FAILED = "committed", "rolled-back", "refused", "failed"
MAX_RESUMES = 8                   # runs that take up an unfinished transaction
# the transaction's phases, written durably before each is entered
INSTALLING, PROVING, ROLLING_BACK = "installing", "proving", "rolling-back"


class NotStaged(Exception):
    """An update order stops before anything is staged; the message is its result."""


@dataclass(frozen=True)
class Order:
    """An update order as the server sent it, checked."""
    version: str
    url: str
    size: int
    sha256: str
    signature: bytes
    window_s: int
    retry: bool      # install a version that was rolled back here before


def order_args(args: dict) -> dict:
    """The command's argument check (commands/core.py): clean arguments, or
    ValueError naming the field."""
    known = {"version", "url", "size", "sha256", "signature", "window_s", "retry"}
    unknown = set(args) - known
    if unknown:
        raise ValueError(f"unknown argument {sorted(unknown)[0][:40]}")
    version = args.get("version")
    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        raise ValueError("version: a Debian version such as 0.2.0-1")
    url = args.get("url")
    if not isinstance(url, str) or not 0 < len(url) <= 512 or not url.isprintable():
        raise ValueError("url: the package's path or URL on the fleet server")
    size = args.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= MAX_PACKAGE_BYTES:
        raise ValueError(f"size: bytes, from 1 to {MAX_PACKAGE_BYTES}")
    sha = args.get("sha256")
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        raise ValueError("sha256: 64 lower-case hex digits")
    signature = args.get("signature")
    try:
        raw = base64.b64decode(signature, validate=True) if isinstance(signature, str) else b""
    except (binascii.Error, ValueError):
        raw = b""
    if not 0 < len(raw) <= MAX_SIGNATURE_BYTES:
        raise ValueError(f"signature: the detached signature in base64, at most "
                         f"{MAX_SIGNATURE_BYTES} bytes")
    window = args.get("window_s", 0)
    if isinstance(window, bool) or not isinstance(window, int) or not 0 <= window <= MAX_WINDOW_S:
        raise ValueError(f"window_s: seconds, from 0 to {MAX_WINDOW_S}")
    retry = args.get("retry", False)
    if not isinstance(retry, bool):
        raise ValueError("retry: true or false")
    return {"version": version, "url": url, "size": size, "sha256": sha,
            "signature": signature, "window_s": window, "retry": retry}


def order(args: dict) -> Order:
    clean = order_args(args)
    return Order(clean["version"], clean["url"], clean["size"], clean["sha256"],
                 base64.b64decode(clean["signature"]), clean["window_s"], clean["retry"])


def space_needed(size: int) -> int:
    return 3 * size + SPACE_MARGIN_BYTES


def refusal(o: Order, *, installed: str, history: list, free_bytes: int) -> str | None:
    """Why this order does not go ahead here, or None."""
    if o.version == installed:
        return f"{PACKAGE} {installed} is already installed"
    back = rolled_back(o.version, history)
    if back is not None and not o.retry:
        return (f"{o.version} was rolled back here ({back.get('reason', 'no reason kept')}); "
                "send the update again with retry to try it once more")
    if free_bytes < space_needed(o.size):
        return (f"not enough space: {free_bytes >> 20} MiB free, "
                f"{space_needed(o.size) >> 20} MiB needed for a {o.size >> 20} MiB package")
    return None


def install_delay(window_s: int, rng) -> float:
    """A random moment in the window: a fleet told at once does not restart at once."""
    return rng.uniform(0.0, float(window_s)) if window_s > 0 else 0.0


# -- the history both sides read -------------------------------------------------------
def rolled_back(version: str, history: list) -> dict | None:
    """The latest outcome for ``version`` that changed what is installed, if it was a
    rollback (a refusal installed nothing: an order sent again without retry, refused,
    must not make the rollback forgotten)."""
    for entry in reversed(history):
        if isinstance(entry, dict) and entry.get("to") == version \
                and entry.get("outcome") != REFUSED:
            return entry if entry.get("outcome") == ROLLED_BACK else None
    return None


def outcome_of(command_id: str, history: list) -> dict | None:
    for entry in reversed(history):
        if isinstance(entry, dict) and entry.get("id") == command_id:
            return entry
    return None


def describe(entry: dict) -> tuple[bool, str]:
    """A history entry as the command's result: (ok, the sentence)."""
    outcome, frm, to = entry.get("outcome"), entry.get("from"), entry.get("to")
    reason, took = entry.get("reason") or "", entry.get("took_s")
    took_text = f" in {took:.0f}s" if isinstance(took, (int, float)) else ""
    if outcome == COMMITTED:
        return True, f"updated from {frm} to {to}{took_text}: its link proven live"
    if outcome == ROLLED_BACK:
        return False, f"rolled back from {to} to {frm}{took_text}: {reason}"
    if outcome == FAILED:
        return False, (f"update to {to} failed and could not be undone from here: {reason}; "
                       "the screen needs a hand")
    return False, f"update to {to} refused: {reason}"


def remember(history: list, entry: dict) -> list:
    return [e for e in history if isinstance(e, dict)][-(HISTORY - 1):] + [entry]


# -- the root side's transaction -----------------------------------------------------------
@dataclass(frozen=True)
class Proof:
    """What the root side sees of the agent while it waits for the proof."""
    installed: str            # the package version dpkg has installed and configured
    fresh: bool               # the agent running now started after the install finished
    proven_live: bool         # its status says its link is proven live
    restarts: int             # automatic restarts of its unit since the install
    last_error: str = ""      # its last line at priority err since the install, if any
    outage: bool = False      # its link is down for the network's or the server's reason


# The longest the site's own outage may hold the judgment of a release back: past it,
# a version that never proved its link goes back as any other.
OUTAGE_CAP_S = 2 * 3600.0


class ProofClock:
    """When the proof's time is up. It counts from the install; where the site's
    network was out before the update (or a power cut left the proof to a boot, when
    the network comes last), the time the new agent's link is down for the network's
    or the server's reason does not count against the release: the proof time starts
    again once it is back, within OUTAGE_CAP_S."""

    def __init__(self, start: float, proof_s: float, site_down: bool):
        self.proof_s, self.site_down = proof_s, site_down
        self.deadline = start + proof_s
        self.cap = start + OUTAGE_CAP_S
        self.held_for_outage = False

    def deadline_at(self, now: float, outage: bool) -> float:
        if self.site_down and outage and now < self.cap:
            self.deadline = max(self.deadline, now + self.proof_s)
            self.held_for_outage = True
        return self.deadline


def verdict(target: str, proof: Proof, now: float, deadline: float) -> tuple[str, str]:
    """("commit" | "wait" | "rollback", why) for the transaction in PROVING."""
    if proof.installed != target:
        return "rollback", f"{target} is not what dpkg has installed ({proof.installed or 'none'})"
    if proof.fresh and proof.proven_live:
        return "commit", ""
    if proof.restarts >= MAX_CRASH_RESTARTS:
        said = f": {proof.last_error}" if proof.last_error else ""
        return "rollback", f"the new agent restarted {proof.restarts} times (a crash loop){said}"
    if now >= deadline:
        return "rollback", "its link was not proven live in time"
    return "wait", ""


def after_power_loss(phase: str) -> str:
    """What a transaction found at boot resumes with: an install cut short is undone
    (dpkg's state is whatever the cut left); a package that was installed gets its
    whole proof time again."""
    return "prove" if phase == PROVING else "rollback"


# -- the repository apt knows (status and metrics: a screen that stopped upgrading) -----
def _order(c: str) -> int:
    """dpkg's weight of one character of a version's non-digit part: ~ before the
    end, the end before letters, letters before everything else."""
    if c == "~":
        return -1
    if c.isalpha():
        return ord(c)
    return ord(c) + 256


def _compare_part(a: str, b: str) -> int:
    """dpkg's verrevcmp: alternating runs of non-digits (by _order) and digits (as
    numbers)."""
    i = j = 0
    while i < len(a) or j < len(b):
        first_diff = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) and not a[i].isdigit() else 0
            bc = _order(b[j]) if j < len(b) and not b[j].isdigit() else 0
            if ac != bc:
                return -1 if ac < bc else 1
            i, j = i + 1, j + 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            if not first_diff:
                first_diff = (a[i] > b[j]) - (a[i] < b[j])
            i, j = i + 1, j + 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first_diff:
            return first_diff
    return 0


def _split_version(v: str) -> tuple[int, str, str]:
    epoch, colon, rest = v.partition(":")
    if not colon:
        epoch, rest = "0", v
    upstream, dash, revision = rest.rpartition("-")
    if not dash:
        upstream, revision = rest, ""
    return (int(epoch) if epoch.isdigit() else 0), upstream, revision


def compare_versions(a: str, b: str) -> int:
    """-1, 0 or 1, as ``dpkg --compare-versions`` orders two Debian versions."""
    ea, ua, ra = _split_version(a)
    eb, ub, rb = _split_version(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _compare_part(ua, ub) or _compare_part(ra, rb)


def versions_in_packages(text: str, package: str = PACKAGE) -> list[str]:
    """The versions an APT ``Packages`` index (or a piece of one, whole stanzas) lists
    for ``package``; a stanza without a sane version is no version."""
    found = []
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines()
                      if ": " in line and not line.startswith(" "))
        version = fields.get("Version", "").strip()
        if fields.get("Package", "").strip() == package and _VERSION.fullmatch(version):
            found.append(version)
    return found


def newest(versions) -> str | None:
    best = None
    for v in versions:
        if best is None or compare_versions(v, best) > 0:
            best = v
    return best


def behind(installed: str, offered: str | None) -> bool | None:
    """The repository offers a version above the installed one; None: cannot say."""
    if not installed or not offered:
        return None
    return compare_versions(offered, installed) > 0
