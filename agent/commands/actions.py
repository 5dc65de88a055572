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

log = logging.getLogger("edge_agent.commands")

UNIT = "edge-agent.service"
IP_MTU = 14  # linux/in.h
MAX_LOG_LINES = 20_000


@dataclass
class Outcome:
    ok: bool
    output: str | None = None
    error: str | None = None
    extra: dict = field(default_factory=dict)


LATER = Outcome(True, "the result comes after the restart it causes")


class Actions:
    def __init__(self, config, snapshot: Callable[[], dict],
                 link_socket: Callable[[], socket.socket | None],
                 request_restart: Callable[[], None],
                 enqueue: Callable[[str, bytes], str | None]):
        self.config = config
        self.snapshot = snapshot
        self.link_socket = link_socket
        self.request_restart = request_restart
        self.enqueue = enqueue
        self.timeout_s = config.command_timeout_s

    def run(self, name: str, args: dict) -> Outcome:
        return getattr(self, name.replace("-", "_"))(args)

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
        from ..logs import RECENT, under_journal
        if not under_journal():
            lines = [dict(x) for x in list(RECENT.lines)
                     if x["ts"] >= since and x["priority"] <= args["priority"]]
            return self._bundle(lines, "this process's memory (not running under journald)")
        cmd = ["journalctl", "--no-pager", "-o", "json", "-u", UNIT, f"--since=@{since:.0f}",
               "-p", str(args["priority"])]
        try:
            r = subprocess.run(cmd, capture_output=True, timeout=self.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as e:
            return Outcome(False, error=f"journalctl: {type(e).__name__}: {e}"[:300])
        if r.returncode != 0:
            return Outcome(False, error=f"journalctl exited {r.returncode}: "
                                        f"{r.stderr.decode(errors='replace').strip()[:300]}")
        lines = []
        for raw in r.stdout.splitlines()[-MAX_LOG_LINES:]:
            try:
                entry = json.loads(raw)
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
        upload_id = self.enqueue("log", bundle)
        if upload_id is None:
            return Outcome(False, error="the upload queue did not take the bundle (full, or "
                                        "the same bundle was sent in the last hour)")
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
        upload_id = self.enqueue("screenshot", image)
        if upload_id is None:
            return Outcome(False, error="the upload queue did not take the screenshot")
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

    # -- helpers ------------------------------------------------------------------
    def _shell(self, command: str):
        try:
            r = subprocess.run(shlex.split(command), capture_output=True, timeout=self.timeout_s)
        except (OSError, ValueError, subprocess.TimeoutExpired) as e:
            return Outcome(False, error=f"{command.split()[0] if command.split() else command}: "
                                        f"{type(e).__name__}: {e}"[:300])
        if r.returncode != 0:
            return Outcome(False, error=f"exited {r.returncode}: "
                                        f"{r.stderr.decode(errors='replace').strip()[:300]}")
        return r

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
