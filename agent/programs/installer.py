"""The root side of a self-update: ``python3 -I -m agent.programs.installer``, the one thing
edge-agent-update.service runs (polkit lets the edge-agent user start that unit, and
only while [commands] allow lists ``update``: agent/programs/grants.py).

It takes the package the agent staged, trusts nothing the agent says about it (its
own copy's SHA-256, signature and control fields are checked again here), keeps a
package of the installed version to go back to, installs, and keeps the new version
only if the new agent proves its link live within [update] proof_timeout_s; otherwise,
or on a crash loop, it reinstalls the version it replaced, without the server's help.
Each phase is written durably before it is entered, so a power cut anywhere leaves a
record the next boot finishes (the unit is also wanted at boot): an install cut short
is undone, a package fully installed gets its proof time again. The outcome goes into
a history the agent reads and reports (agent/update/rules.py).

The agent's state directory is the agent's: everything in it is opened one component
at a time without following a link, and copied out before it is looked at.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time

from ..config import load as config_mod
from ..base import status_file as status
from ..base.fsutil import atomic_write, read_bounded, read_json
from ..base.reasons import OUTAGE_REASONS
from ..base.vocabulary import MAX_COMMAND_ID
from ..base.logs import clean, early
from ..update import records, rules
from ..update.repack import RepackError, repack
from ..update.signature import KEYS_DIR, SignatureError, verify

AGENT_UNIT = "edge-agent.service"
DPKG_TIMEOUT_S = 900
DPKG_TRIES = 6            # dpkg's lock held (apt, unattended-upgrades): 10 s, 20 s, ...
POLL_S = 1.0
INCOMING = "incoming.deb"
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
       "DEBIAN_FRONTEND": "noninteractive"}


class Refused(Exception):
    """Nothing was changed: the package is not installed, and why."""

    def __init__(self, why: str, order_id: str | None = None):
        super().__init__(why)
        self.order_id = order_id


class Stuck(Exception):
    """A transaction that cannot finish now; it stays on record for the next run."""


def say(text: str, priority: int = 6) -> None:
    early(f"edge-agent-update: {text}", priority, sys.stdout)


# -- what the system says ---------------------------------------------------------------
def installed_version() -> str:
    """The version dpkg has fully installed, or "" (none, or half-installed)."""
    return records.installed_version(fully=True)


def deb_fields(path: str) -> dict[str, str]:
    r = subprocess.run(["dpkg-deb", "-f", path, "Package", "Version", "Architecture"],
                       capture_output=True, text=True, timeout=60, env=ENV)
    if r.returncode != 0:
        raise Refused("not a Debian package: " + (r.stderr.strip()[-200:] or "dpkg-deb failed"))
    return dict(line.split(": ", 1) for line in r.stdout.splitlines() if ": " in line)


def unit_props(*names: str) -> dict[str, str]:
    r = subprocess.run(["systemctl", "show", AGENT_UNIT, *(f"--property={n}" for n in names)],
                       capture_output=True, text=True, timeout=30, env=ENV)
    return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)


def proof(status_path: str, installed_at_us: int) -> rules.Proof:
    props = unit_props("MainPID", "NRestarts", "ExecMainStartTimestampMonotonic")
    pid = int(props.get("MainPID") or 0)
    started_us = int(props.get("ExecMainStartTimestampMonotonic") or 0)
    live = outage = False
    try:
        doc = status.read(status_path)
        link = doc.get("link") if doc.get("pid") == pid and pid > 0 else None
        live = isinstance(link, dict) and link.get("proven_live") is True
        outage = isinstance(link, dict) and down_for_outage(link)
    except status.StatusFileError:
        pass
    restarts = int(props.get("NRestarts") or 0)
    return rules.Proof(installed_version(), pid > 0 and started_us > installed_at_us, live,
                       restarts, last_error(installed_at_us) if restarts else "", outage)


def down_for_outage(link: dict) -> bool:
    """A status file's link says it is down for the network's or the server's reason.
    The file is the agent user's: any other shape says nothing."""
    reason = link.get("reason")
    return link.get("state") != "online" and isinstance(reason, str) and reason in OUTAGE_REASONS


def site_down(status_path: str) -> bool:
    """Before an install: the running agent's link is down for an outage."""
    try:
        link = status.read(status_path).get("link")
    except status.StatusFileError:
        return False
    return isinstance(link, dict) and down_for_outage(link)


def last_error(since_us: int) -> str:
    """The agent's last line at priority err or worse in this boot after the monotonic
    ``since_us``: why a release crash-loops, for the fleet. Cleaned and bounded: it is
    the agent's words, and the agent's user may be anyone's by then."""
    try:
        r = subprocess.run(["journalctl", f"--unit={AGENT_UNIT}", "--boot", "--priority=err",
                            "--lines=20", "--output=json", "--output-fields=MESSAGE",
                            "--no-pager", "--quiet"], capture_output=True, timeout=30, env=ENV)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    said = ""
    for line in r.stdout.splitlines()[-20:]:
        try:
            entry = json.loads(line)
            if int(entry.get("__MONOTONIC_TIMESTAMP", 0)) > since_us \
                    and isinstance(entry.get("MESSAGE"), str):
                said = entry["MESSAGE"]
        except (ValueError, TypeError, AttributeError):
            continue
    return clean(said, 300)


def dpkg_install(path: str) -> str | None:
    """dpkg -i; what went wrong, or None. In a session of its own: on a timeout the
    maintainer scripts it started go with it. No --force-conf* option: the package
    ships no conffile (the operator's agent.toml is theirs, never the package's), so
    there is no question to answer, and one that came back would fail here, seen,
    with stdin closed, rather than be answered blind."""
    child = subprocess.Popen(["dpkg", "-i", path],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True)
    try:
        out, err = child.communicate(timeout=DPKG_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        return f"dpkg took more than {DPKG_TIMEOUT_S}s"
    if child.returncode != 0:
        lines = (err.strip() or out.strip()).splitlines()
        errors = [line for line in lines if line.startswith("dpkg: error")]
        said = (errors or lines[-1:] or [""])[-1]
        return f"dpkg exited {child.returncode}: {said[:200]}"
    return None


def dpkg_locked(failed: str) -> bool:
    """dpkg refused because another one holds its lock (apt, unattended-upgrades)."""
    return "lock" in failed.split(": ", 1)[-1]


def dpkg_install_patiently(path: str) -> str | None:
    """dpkg_install, waiting out another dpkg's lock (10 s, 20 s, ... 60 s)."""
    for attempt in range(DPKG_TRIES):
        if attempt:
            time.sleep(10 * attempt)
        failed = dpkg_install(path)
        if failed is None or not dpkg_locked(failed):
            return failed
    return failed


def older(version: str, than: str) -> bool:
    return subprocess.run(["dpkg", "--compare-versions", version, "lt", than],
                          capture_output=True, timeout=30, env=ENV).returncode == 0


# -- the agent's staging directory, read without trusting it ---------------------------------
def _open_dir(parent: int | None, name: str) -> int:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(name, flags, dir_fd=parent) if parent is not None else os.open(name, flags)


def staged(state_dir: str) -> tuple[int, dict] | None:
    """The staging directory (a descriptor) and the order in it, or None."""
    try:
        top = _open_dir(None, state_dir)
    except FileNotFoundError:
        return None
    try:
        fd = _open_dir(top, rules.STAGING)
    except FileNotFoundError:
        return None
    except OSError as e:   # a link (ELOOP), not a directory
        raise Refused(f"the staging directory is not a directory ({e.strerror})") from None
    finally:
        os.close(top)
    try:
        doc = read_json(rules.ORDER_FILE, rules.MAX_RECORD_BYTES, dir_fd=fd)
        if not isinstance(doc, dict) or not isinstance(doc.get("id"), str) \
                or not 0 < len(doc["id"]) <= MAX_COMMAND_ID:
            raise ValueError("no id")
        try:
            rules.order_args({k: v for k, v in doc.items() if k != "id"})
        except ValueError as e:
            os.close(fd)
            raise Refused(f"the staged order is not valid ({e})", doc["id"]) from None
        return fd, doc
    except FileNotFoundError:
        os.close(fd)
        return None
    except (OSError, ValueError) as e:
        os.close(fd)
        raise Refused(f"the staged order is not valid ({type(e).__name__})") from None


def _copy_out(dir_fd: int, name: str, dest: str, size: int) -> str:
    """Copies the staged file into root's directory; its SHA-256."""
    digest = hashlib.sha256()
    src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    with os.fdopen(src, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"the staged {name} is not a regular file")
        # a hard link (where fs.protected_hardlinks=0) is a file someone else made
        # appear here: only a file of the staging directory's owner, linked once
        owner = os.fstat(dir_fd).st_uid
        if st.st_nlink != 1 or st.st_uid != owner:
            raise Refused(f"the staged {name} has {st.st_nlink} links and owner uid "
                          f"{st.st_uid}: only the agent's own file, linked once, is taken")
        copied = 0
        with open(dest, "wb") as out:
            for chunk in iter(lambda: f.read(1 << 16), b""):
                copied += len(chunk)
                if copied > size:
                    raise Refused(f"the staged package is larger than the order's {size} bytes")
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
    if copied != size:
        raise Refused(f"the staged package is {copied} bytes, the order says {size}")
    return digest.hexdigest()


# -- the transaction ---------------------------------------------------------------------------
class Installer:
    def __init__(self, root_dir: str, state_dir: str, status_path: str, keys_dir: str,
                 proof_timeout_s: float, allow_downgrade: bool = False,
                 update_allowed: str | None = None):
        """``update_allowed``: the source of root's configuration whose [commands] allow
        lists update, or None: then a new order is refused (what a power cut left is
        still finished)."""
        self.root_dir, self.state_dir = root_dir, state_dir
        self.status_path, self.keys_dir = status_path, keys_dir
        self.proof_timeout_s = proof_timeout_s
        self.allow_downgrade = allow_downgrade
        self.update_allowed = update_allowed
        self.t0 = time.monotonic()

    def path(self, name: str) -> str:
        return os.path.join(self.root_dir, name)

    def history(self) -> list:
        return records.read_history(self.root_dir)

    def transaction(self) -> dict | None:
        try:
            doc = read_json(self.path(rules.TRANSACTION_FILE), rules.MAX_RECORD_BYTES)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            # damaged by the cut itself: nothing says which version is wanted; undo
            return {"id": f"damaged-{time.time_ns()}", "from": "", "to": "",
                    "phase": rules.INSTALLING}
        return doc if isinstance(doc, dict) else None

    def _write(self, name: str, doc) -> None:
        atomic_write(self.path(name), json.dumps(doc, sort_keys=True).encode(), 0o644)

    def _phase(self, tx: dict, phase: str, **more) -> dict:
        tx = {**tx, "phase": phase, **more}
        self._write(rules.TRANSACTION_FILE, tx)
        return tx

    def _finish(self, tx: dict, outcome: str, reason: str = "") -> None:
        entry = {"id": tx["id"], "from": tx.get("from", ""), "to": tx.get("to", ""),
                 "outcome": outcome, "reason": reason, "at": round(time.time(), 3)}
        if tx.get("timed", True):
            entry["took_s"] = round(time.monotonic() - self.t0, 1)
        # the outcome first, durably: a cut after it is tidied up by resume(), and the
        # package to go back to is never replaced before the outcome says committed
        self._write(rules.HISTORY_FILE, rules.remember(self.history(), entry))
        self._tidy(outcome)
        level = 6 if outcome == rules.COMMITTED else 3
        say(f"{outcome}: {rules.describe(entry)[1]}", level)

    def _tidy(self, outcome: str) -> None:
        """After the outcome is kept: the committed package becomes the one to go back
        to, and the transaction goes."""
        incoming = self.path(INCOMING)
        if outcome == rules.COMMITTED and os.path.exists(incoming):
            os.replace(incoming, self.path(rules.KEPT_PACKAGE))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(incoming)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(rules.TRANSACTION_FILE))
        dfd = os.open(self.root_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    # an order from the agent
    def install(self, fd: int, order_doc: dict) -> None:
        cid = order_doc["id"]
        if rules.outcome_of(cid, self.history()) is not None:
            say(f"order {cid} was already carried out")
            return
        order = rules.order({k: v for k, v in order_doc.items() if k != "id"})
        current = installed_version()
        # the site's outage before the update is not the release's to answer for
        tx = {"id": cid, "from": current, "to": order.version,
              "site_down": site_down(self.status_path)}
        try:
            self._check_and_keep(fd, order, current)
        except (Refused, SignatureError, RepackError, OSError, ValueError,
                subprocess.SubprocessError) as e:
            self._finish(tx, rules.REFUSED, str(e)[:300] or type(e).__name__)
            return
        say(f"installing {rules.PACKAGE} {order.version} over {current}")
        tx = self._phase(tx, rules.INSTALLING)
        # the package's postinst restarts the agent: any agent started from here on
        began_us = time.monotonic_ns() // 1000
        failed = dpkg_install_patiently(self.path(INCOMING))
        if failed is not None:
            if installed_version() == current:
                self._finish(tx, rules.REFUSED, f"nothing changed: {failed}")
            else:
                self.rollback(tx, f"the install failed: {failed}")
            return
        self.prove(self._phase(tx, rules.PROVING), began_us)

    def _check_and_keep(self, fd: int, order: rules.Order, current: str) -> None:
        # root's own gates, from root's copy of the configuration: the agent's user can
        # stage an order whatever the agent's side decided
        if self.update_allowed is None:
            raise Refused("[commands] allow does not list update: no update is installed")
        if not current:
            raise Refused(f"{rules.PACKAGE} is not fully installed: no version to go back to")
        if not self.allow_downgrade and older(order.version, current):
            raise Refused(f"{order.version} is older than the installed {current} "
                          "([update] allow_downgrade is off)")
        st = os.statvfs(self.root_dir)
        refused = rules.refusal(order, installed=current, history=self.history(),
                                free_bytes=st.f_bavail * st.f_frsize)
        if refused:
            raise Refused(refused)
        incoming = self.path(INCOMING)
        if _copy_out(fd, rules.PACKAGE_FILE, incoming, order.size) != order.sha256:
            raise Refused("the staged package does not match the order's SHA-256")
        signature = read_bounded(rules.SIGNATURE_FILE, rules.MAX_SIGNATURE_BYTES, dir_fd=fd)
        os.chmod(incoming, 0o644)   # for gpgv, which parses it as nobody, not as root
        key = verify(incoming, signature, self.keys_dir, as_user="nobody")
        fields = deb_fields(incoming)
        if fields.get("Package") != rules.PACKAGE or fields.get("Version") != order.version:
            raise Refused(f"the package is {fields.get('Package')} {fields.get('Version')}, "
                          f"not {rules.PACKAGE} {order.version}")
        if fields.get("Architecture") not in ("all", _dpkg_arch()):
            raise Refused(f"the package is for {fields.get('Architecture')}")
        say(f"{rules.PACKAGE} {order.version}: signature good (key {key}), checksum good")
        kept = self.path(rules.KEPT_PACKAGE)
        try:
            have = deb_fields(kept).get("Version") if os.path.exists(kept) else None
        except Refused:
            have = None
        if have != current:
            tmp = self.path(".kept.deb")
            version = repack(rules.PACKAGE, tmp, self.root_dir)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, kept)
            say(f"kept {rules.PACKAGE} {version}, rebuilt from dpkg's record, to go back to")

    def prove(self, tx: dict, installed_at_us: int) -> None:
        clock = rules.ProofClock(time.monotonic(), self.proof_timeout_s,
                                 bool(tx.get("site_down")))
        say(f"waiting up to {self.proof_timeout_s:.0f}s for {tx['to']} to prove its link"
            + (" (more while the site's network is out)" if clock.site_down else ""))
        held = False
        while True:
            seen = proof(self.status_path, installed_at_us)
            now = time.monotonic()
            deadline = clock.deadline_at(now, seen.outage)
            if clock.held_for_outage and not held:
                held = True
                say(f"the site's network is out: {tx['to']} is judged once it is back")
            action, why = rules.verdict(tx["to"], seen, now, deadline)
            if action == "commit":
                self._finish(tx, rules.COMMITTED)
                return
            if action == "rollback":
                self.rollback(tx, why)
                return
            time.sleep(POLL_S)

    def rollback(self, tx: dict, reason: str) -> None:
        tx = self._phase(tx, rules.ROLLING_BACK, reason=reason)
        say(f"rolling back from {tx.get('to')} to {tx.get('from')}: {reason}", 3)
        failed = dpkg_install_patiently(self.path(rules.KEPT_PACKAGE))
        if failed is None:
            self._finish(tx, rules.ROLLED_BACK, reason)
            return
        # the record stays: the unit fails, systemd starts it again (Restart=on-failure),
        # and so does the next boot
        raise Stuck(f"the rollback's reinstall failed: {failed}")

    # at boot, or a second start: a transaction that did not finish
    def resume(self, tx: dict) -> None:
        done = rules.outcome_of(str(tx.get("id")), self.history())
        if done is not None:   # cut after the outcome was kept: only the tidying is left
            self._tidy(str(done.get("outcome")))
            return
        tx = {**tx, "timed": False,   # the monotonic clock did not survive the cut
              "resumes": int(tx.get("resumes", 0) or 0) + 1}
        if tx["resumes"] > rules.MAX_RESUMES:
            # each run failed to finish it: said once, and no more dpkg every 30 s
            self._finish(tx, rules.FAILED, f"{tx.get('reason') or tx.get('phase')}; given up "
                                           f"after {rules.MAX_RESUMES} tries")
            return
        self._write(rules.TRANSACTION_FILE, tx)
        if rules.after_power_loss(str(tx.get("phase"))) == "prove" and tx.get("to"):
            say(f"resuming the proof of {tx['to']} after a restart")
            # at boot the network comes last: its outage is the site's, not the release's
            self.prove({**tx, "site_down": True}, 0)
        else:
            self.rollback(tx, tx.get("reason") or f"interrupted while {tx.get('phase')}")


def _dpkg_arch() -> str:
    r = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                       timeout=30, env=ENV)
    return r.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m agent.programs.installer",
        description="Install the update edge-agent staged, or finish one a power cut left.")
    parser.add_argument("--config", default=config_mod.DEFAULT_PATH)
    parser.add_argument("--root-dir", default=rules.ROOT_DIR, help=argparse.SUPPRESS)
    parser.add_argument("--keys-dir", default=KEYS_DIR, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    allowed = None
    try:
        config = config_mod.load(args.config)
        state_dir, status_path, timeout = (config.identity.state_dir, config.status_path,
                                           config.update.proof_timeout_s)
        downgrade = config.update.allow_downgrade
        if "update" in config.commands.allow:
            allowed = (f"the fleet's settings revision {config.fleet_revision}"
                       if config.origins.get("commands.allow") == "fleet" else args.config)
    except config_mod.ConfigError as e:
        # a transaction in progress is finished on the defaults rather than left; a new
        # order is not installed on a configuration nobody can read
        say(f"{e}; using the default directories and proof time", 4)
        state_dir, status_path, timeout = "/var/lib/edge-agent", "/run/edge-agent/status.json", 180.0
        downgrade = False
    os.makedirs(args.root_dir, 0o755, exist_ok=True)
    installer = Installer(args.root_dir, state_dir, status_path, args.keys_dir, timeout,
                          downgrade, allowed)
    with open(installer.path(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            run(installer)
        except Stuck as e:
            say(str(e), 2)
            return 1
        except Exception as e:
            # a bug, or a system that will not answer (dpkg-query hanging): said, and the
            # unit fails; a transaction on record is taken up again by the next run
            say(f"{type(e).__name__}: {e}", 2)
            return 1
    return 0


def run(installer: "Installer") -> None:
    """What a power cut left first, then what the agent staged, until nothing is left
    (an order staged while this ran is taken now, not at the next boot)."""
    tx = installer.transaction()
    if tx is not None:
        installer.resume(tx)
    done: set = set()
    while True:
        try:
            found = staged(installer.state_dir)
        except Refused as e:
            say(str(e), 3)
            if e.order_id and rules.outcome_of(e.order_id, installer.history()) is None:
                installer._finish({"id": e.order_id, "from": "", "to": ""}, rules.REFUSED, str(e))
            return
        if found is None:
            return
        fd, order_doc = found
        try:
            if order_doc["id"] in done:
                return
            done.add(order_doc["id"])
            installer.install(fd, order_doc)
        except Stuck:
            raise
        except Exception as e:
            if installer.transaction() is not None \
                    or rules.outcome_of(order_doc["id"], installer.history()) is not None:
                raise   # taken up again by the next run, or already decided
            # nothing was changed: the order gets an outcome, so the agent stops waiting
            installer._finish({"id": order_doc["id"], "from": "",
                               "to": str(order_doc.get("version"))},
                              rules.REFUSED, f"internal error: {type(e).__name__}: {e}"[:300])
        finally:
            os.close(fd)

if __name__ == "__main__":
    sys.exit(main())
