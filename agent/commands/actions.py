"""What each remote command does on the device: the I/O behind the command core.

Each action takes its checked arguments and returns an Outcome; ``LATER`` means the
result can only be known after the restart or reboot the action causes (the core's
``recover`` turns the ledger's record into it then). Everything a command produces in
bulk (a journal bundle, a screenshot) goes through the upload queue, so it survives an
outage and leaves the queue only when the server has it.
"""
from __future__ import annotations

import gzip
import json
import logging
import shlex
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import urlparse

from .. import children, journal_gate
from ..logs import RECENT, under_journal
from ..update.service import NotStaged, Updater
from ..upload_kinds import LOG, SCREENSHOT

log = logging.getLogger("edge_agent.commands")

IP_MTU = 14  # linux/in.h


@dataclass
class Outcome:
    ok: bool
    output: str | None = None
    error: str | None = None
    extra: dict = field(default_factory=dict)


LATER = Outcome(True, "the result comes after the restart it causes")


class NotQueued(Exception):
    """The upload queue did not take an item; the message says why, for the result."""


class Actions:
    def __init__(self, config, snapshot: Callable[[], dict],
                 link_socket: Callable[[], socket.socket | None],
                 request_restart: Callable[[], None],
                 enqueue: Callable[[str, bytes], str], updater: Updater | None = None,
                 configure: Callable[[dict], Outcome] | None = None):
        """``enqueue(kind, payload)`` returns the item's id or raises NotQueued. The
        ``updater`` settles an update's result itself, later (its own callback).
        ``configure`` applies a revision of settings (agent/settings/)."""
        self.config = config
        self.snapshot = snapshot
        self.link_socket = link_socket
        self.request_restart = request_restart
        self.enqueue = enqueue
        self.updater = updater
        self._configure = configure
        self.timeout_s = config.command_timeout_s
        self._lock = threading.Lock()
        self._child: subprocess.Popen | None = None   # the configured command running now
        self._stopping = False
        # every name of core.COMMANDS, and nothing else, runs here
        self.commands: dict[str, Callable[[dict], Outcome]] = {
            "diagnostics": self.diagnostics, "logs": self.logs, "screenshot": self.screenshot,
            "display": self.display, "restart-agent": self.restart_agent, "reboot": self.reboot,
            "update": self.update, "configure": self.configure}

    def run(self, name: str, args: dict, command_id: str = "") -> Outcome:
        action = self.commands[name]
        # an update's result comes long after this returns: it needs its command's id
        return action(args, command_id) if name == "update" else action(args)

    # -- the commands -------------------------------------------------------------
    def diagnostics(self, args: dict) -> Outcome:
        doc = self.snapshot()
        host = urlparse(self.config.server_url).hostname or ""
        report = {"status": {k: doc.get(k) for k in ("version", "device_id", "link", "uploads",
                                                     "events")},
                  "journal": doc.get("journal", [])[-5:],
                  "dns": _resolve(host, 3.0), "path_mtu": self._path_mtu()}
        return Outcome(True, json.dumps(report, sort_keys=True, default=str))

    def logs(self, args: dict) -> Outcome:
        since = time.time() - args["since_s"]
        if not under_journal():
            lines = [dict(x) for x in list(RECENT.lines)
                     if x["ts"] >= since and x["priority"] <= args["priority"]]
            return self._bundle(lines, "this process's memory (not running under journald)")
        # not journalctl itself: the agent is not in systemd-journal, the gate reads
        # this unit's lines and no other's (agent/journal_gate.py)
        try:
            request = journal_gate.Request(int(since), args["priority"], journal_gate.MAX_LINES)
            raw = journal_gate.fetch(request, self.timeout_s)
        except journal_gate.GateError as e:
            return Outcome(False, error=f"journal: {e}"[:300])
        lines = []
        for line in raw.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            message = entry.get("MESSAGE")
            if isinstance(message, list):  # journald's encoding of non-UTF-8 bytes
                message = bytes(message).decode(errors="replace")
            lines.append({"ts": int(entry.get("__REALTIME_TIMESTAMP", 0)) / 1e6,
                          "priority": int(entry.get("PRIORITY", 6)), "pid": entry.get("_PID"),
                          "message": message})
        return self._bundle(lines, "the journal")

    def _bundle(self, lines: list[dict], source: str) -> Outcome:
        bundle = gzip.compress("\n".join(json.dumps(x) for x in lines).encode(), 6)
        try:
            upload_id = self.enqueue(LOG, bundle)
        except NotQueued as e:
            return Outcome(False, error=f"the bundle was not queued: {e}")
        return Outcome(True, f"{len(lines)} lines from {source} queued as upload {upload_id} "
                             f"({len(bundle)} bytes, gzip, one JSON object a line)",
                       extra={"upload_id": upload_id, "lines": len(lines), "source": source})

    def screenshot(self, args: dict) -> Outcome:
        command = self.config.screenshot_command
        if not command:
            return Outcome(False, error="no screenshot command configured "
                                        "([commands] screenshot_command in agent.toml)")
        r = self._shell(command)
        if isinstance(r, Outcome):
            return r
        image = r.stdout
        if not (image.startswith(b"\xff\xd8") or image.startswith(b"\x89PNG")):
            return Outcome(False, error="the screenshot command printed no JPEG or PNG image")
        try:
            upload_id = self.enqueue(SCREENSHOT, image)
        except NotQueued as e:
            return Outcome(False, error=f"the screenshot was not queued: {e}")
        return Outcome(True, f"screenshot of {len(image)} bytes queued as upload {upload_id}",
                       extra={"upload_id": upload_id})

    def display(self, args: dict) -> Outcome:
        command = (self.config.display_on_command if args["state"] == "on"
                   else self.config.display_off_command)
        if not command:
            return Outcome(False, error=f"no display_{args['state']}_command configured "
                                        "([commands] in agent.toml)")
        r = self._shell(command)
        return r if isinstance(r, Outcome) else Outcome(True, f"display {args['state']}")

    def configure(self, args: dict) -> Outcome:
        if self._configure is None:
            return Outcome(False, error="this agent takes no settings from the fleet")
        return self._configure(args)

    def restart_agent(self, args: dict) -> Outcome:
        self.request_restart()
        return LATER

    def reboot(self, args: dict) -> Outcome:
        # logind does the reboot; polkit lets the edge-agent user ask for exactly this
        # (/usr/share/polkit-1/rules.d/50-edge-agent.rules), so the sandbox stays shut
        try:
            r = subprocess.run(["systemctl", "reboot", "--no-ask-password"], capture_output=True,
                               timeout=self.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as e:
            return Outcome(False, error=f"systemctl reboot: {type(e).__name__}: {e}"[:300])
        if r.returncode != 0:
            return Outcome(False, error="systemctl reboot refused: "
                                        + r.stderr.decode(errors="replace").strip()[:300])
        return LATER

    def update(self, args: dict, command_id: str = "") -> Outcome:
        if self.updater is None:
            return Outcome(False, error="self-update is not available here")
        try:
            self.updater.begin(command_id, args)
        except NotStaged as e:
            return Outcome(False, error=str(e))
        return LATER   # the updater settles it: refused, committed or rolled back

    def stop(self) -> None:
        """From any thread, on the agent's way out: the running command and everything it
        started go now (its own process group), so a stop never waits on it and nothing
        it spawned outlives the agent."""
        with self._lock:
            self._stopping = True
            child = self._child
        if child is not None:
            children.kill_group(child)
        if self.updater is not None:
            self.updater.stop()

    # -- helpers ------------------------------------------------------------------
    def _shell(self, command: str):
        program = command.split()[0] if command.split() else command
        try:
            argv = shlex.split(command)
            with self._lock:
                if self._stopping:
                    return Outcome(False, error="not run: the agent is stopping")
                # its process group is killed on timeout and on stop
                child = children.spawn(argv)
                self._child = child
        except (OSError, ValueError) as e:
            return Outcome(False, error=f"{program}: {type(e).__name__}: {e}"[:300])
        try:
            stdout, stderr = children.finish(child, self.timeout_s)
        except subprocess.TimeoutExpired as e:
            return Outcome(False, error=f"{program}: {type(e).__name__}: {e}"[:300])
        finally:
            with self._lock:
                self._child = None
        if child.returncode != 0:
            return Outcome(False, error=f"exited {child.returncode}: "
                                        f"{stderr.decode(errors='replace').strip()[:300]}")
        return subprocess.CompletedProcess(argv, child.returncode, stdout, stderr)

    def _path_mtu(self) -> int | None:
        sock = self.link_socket()
        if sock is None:
            return None
        try:
            return sock.getsockopt(socket.IPPROTO_IP, IP_MTU)
        except OSError:
            return None


def _resolve(host: str, timeout: float) -> dict:
    """getaddrinfo has no timeout of its own: it gets a thread and a deadline."""
    answer: dict = {"host": host}

    def lookup():
        t0 = time.monotonic()
        try:
            infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
            answer["addresses"] = sorted({i[4][0] for i in infos})
        except OSError as e:
            answer["error"] = str(e)
        answer["ms"] = round((time.monotonic() - t0) * 1000, 1)

    t = threading.Thread(target=lookup, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        answer["error"] = f"no answer in {timeout:.0f}s"
    return answer
