"""What each remote command does on the device: the I/O behind the command core.

Each action takes its checked arguments and returns an Outcome; ``LATER`` means the
result can only be known after the restart or reboot the action causes (the core's
``recover`` turns the ledger's record into it then). Everything a command produces in
bulk (a journal bundle, a screenshot) goes through the upload queue, so it survives an
outage and leaves the queue only when the server has it.
"""
from __future__ import annotations

import gzip
import io
import json
import logging
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol
from urllib.parse import urlparse

from ..base import children
from ..base import journal_wire
from ..base.boot import ask_logind
from ..base.steps import Job, drive
from ..config.model import Commands
from ..runtime.threads import start_worker
from ..base.logs import RECENT, under_journal
from ..update.rules import NotStaged
from ..base.upload_kinds import LOG, SCREENSHOT
from ..base.vocabulary import SCREEN_CONTROLS
from ..screen.core import Power, not_configured
from .core import LATER, Outcome
from .operator import OperatorTools

log = logging.getLogger("edge_agent.commands")


@dataclass
class ProgramFailed(Outcome):
    """A program that ran and did not exit 0, with its exit status (negative: the signal
    that ended it), which the error's words carry for a person, not for a caller."""
    returncode: int = 1

IP_MTU = 14  # linux/in.h




class NotQueued(Exception):
    """The upload queue did not take an item; the message says why, for the result."""


class Updates(Protocol):
    """What the update command needs of the part that stages an update (update/service.py,
    bound by the daemon), and the start (``recover``: the outcome of each update the
    ledger had running)."""

    def begin(self, command_id: str, args: dict) -> None: ...

    def recover(self, ids: list[str]) -> dict[str, tuple[bool, str] | None]: ...

    def stop(self) -> None: ...


class ScreenControls(Protocol):
    """What the screen's commands (restart-player, brightness, volume) ask of the
    screen part (agent/screen/controls.py, bound by the daemon): each acts, reads the
    state back and answers with it, within ``bound_s`` seconds. ``means()``: the
    commands this screen has the means for (poweroff: whether logind is there)."""

    bound_s: float

    def act(self, name: str, args: dict):
        """An Outcome's fields: ok, output, error, extra (screen/controls.py's Answer)."""

    def means(self) -> frozenset: ...


# what each of the screen's commands needs, said where a screen has no such means
NEEDS = {"restart-player": "a player unit ([screen] player_unit in agent.toml)",
         "brightness": "a backlight in sysfs or a display that speaks DDC/CI (ddcutil)",
         "volume": "a sound server (wpctl, pactl) or ALSA's amixer",
         "poweroff": "logind (systemctl poweroff)",
         "screenshot": "a way to capture the screen: xwd, grim or import on its display "
                       "and Pillow, or [commands] screenshot_command"}


class Actions:
    def __init__(self, section: Commands, server_url: str, snapshot: Callable[[], dict],
                 link_socket: Callable[[], socket.socket | None],
                 request_restart: Callable[[], None],
                 enqueue: Callable[[str, bytes], str], updater: "Updates | None" = None,
                 configure: Callable[[dict], tuple[bool, str]] | None = None,
                 undeliverable: Callable[[str], str | None] = lambda kind: None,
                 power: Power | None = None, controls: ScreenControls | None = None,
                 server_far: Callable[[float], float | None] = lambda when: None,
                 shoot: Callable[[], tuple[bytes | None, str]] | None = None):
        """``enqueue(kind, payload)`` returns the item's id or raises NotQueued. The
        ``updater`` settles an update's result itself, later (its own callback).
        ``configure(args)`` stages a revision of settings (agent/settings/): (staged,
        the result's words).
        ``undeliverable(kind)`` says why the link's profile cannot carry an upload of
        that kind, or None: a bundle nobody can deliver is not made at all.
        ``power``: the display's owner (agent/screen/power.py), which turns it for a
        display command and reads it back; ``controls`` act for the screen's commands
        and read back.
        ``shoot()``: the screen captured full size, as a JPEG, by the picture check's
        means (agent/screen/part.py), or (None, why not): the screenshot where no
        ``screenshot_command`` is set."""
        self.shoot = shoot
        self.undeliverable = undeliverable
        self.power = power
        self.controls = controls
        # what one command may take beyond the configured command's bound
        self.read_back_s = max(power.bound_s if power is not None else 0.0,
                               controls.bound_s if controls is not None else 0.0)
        self.section = section
        self.server_url = server_url
        self.snapshot = snapshot
        self.link_socket = link_socket
        self.request_restart = request_restart
        self.enqueue = enqueue
        self.updater = updater
        self._configure = configure
        self.timeout_s = section.timeout_s
        self._lock = threading.Lock()
        # the programs the command runs now (the display's are its owner's)
        self._children: set[subprocess.Popen] = set()
        self._stopping = False
        self.operator = OperatorTools(section.timeout_s, self._start, self._release, self._run,
                                      server_far=server_far)
        # every name of core.COMMANDS, and nothing else, runs here (update's also takes
        # its command's id: run())
        self.commands: dict[str, Callable[..., Outcome]] = {
            "diagnostics": self.diagnostics, "logs": self.logs, "screenshot": self.screenshot,
            "display": self.display, "restart-agent": self.restart_agent, "reboot": self.reboot,
            "update": self.update, "configure": self.configure, "poweroff": self.poweroff,
            "shell": self.operator.shell, "set-time": self.operator.set_time,
            "set-timezone": self.operator.set_timezone,
            **{name: self._screen_control(name) for name in SCREEN_CONTROLS}}

    def run(self, name: str, args: dict, command_id: str = "") -> Outcome:
        action = self.commands[name]
        # an update's result comes long after this returns: it needs its command's id
        return action(args, command_id) if name == "update" else action(args)

    def steps(self, name: str, args: dict) -> Job | None:
        """The command as a job (base/steps.py) that the commands thread drives a look
        at a time, where it is one (``display``: its waits are a program's and the
        display's settle, not work); None: it runs whole on the executor."""
        return self.display_steps(args) if name == "display" else None

    # -- the commands -------------------------------------------------------------
    def diagnostics(self, args: dict) -> Outcome:
        doc = self.snapshot()
        host = urlparse(self.server_url).hostname or ""
        report = {"status": {k: doc.get(k) for k in ("version", "device_id", "link", "uploads",
                                                     "events")},
                  "journal": doc.get("journal", [])[-5:],
                  "dns": _resolve(host, 3.0), "path_mtu": self._path_mtu()}
        return Outcome(True, json.dumps(report, sort_keys=True, default=str))

    def logs(self, args: dict) -> Outcome:
        refusal = self.undeliverable(LOG)
        if refusal:
            return Outcome(False, error=refusal)
        since = time.time() - args["since_s"]
        bundle = Bundle()
        if not under_journal():
            for x in list(RECENT.lines):
                if x["ts"] >= since and x["priority"] <= args["priority"]:
                    bundle.add(x)
            return self._queue_bundle(bundle, "this process's memory (not running under "
                                              "journald)")
        # not journalctl itself: the agent is not in systemd-journal, the gate reads
        # this unit's lines and no other's (agent/programs/journal_wire.py); its reply is read a
        # line at a time into the compressed bundle, never held whole
        try:
            request = journal_wire.Request(int(since), args["priority"], journal_wire.MAX_LINES)
            reply = journal_wire.ask(request, self.timeout_s)
            try:
                for line in reply.lines():
                    bundle.add_journal_entry(line)
            finally:
                reply.close()
        except journal_wire.GateError as e:
            return Outcome(False, error=f"journal: {e}"[:300])
        bundle.dropped += reply.dropped
        return self._queue_bundle(bundle, "the journal")

    def _queue_bundle(self, bundle: "Bundle", source: str) -> Outcome:
        data = bundle.finish()
        try:
            upload_id = self.enqueue(LOG, data)
        except NotQueued as e:
            return Outcome(False, error=f"the bundle was not queued: {e}")
        dropped = f"; {bundle.dropped} older lines left out" if bundle.dropped else ""
        return Outcome(True, f"{bundle.lines} lines from {source} queued as upload {upload_id} "
                             f"({len(data)} bytes, gzip, one JSON object a line{dropped})",
                       extra={"upload_id": upload_id, "lines": bundle.lines, "source": source,
                              "dropped": bundle.dropped})

    def screenshot(self, args: dict) -> Outcome:
        """``[commands] screenshot_command``'s image where it is set, else the screen
        full size by the picture check's means (``shoot``)."""
        command = self.section.screenshot_command
        if command:
            r = self._shell(command)
            if isinstance(r, Outcome):
                return r
            image = r.stdout
            if not (image.startswith(b"\xff\xd8") or image.startswith(b"\x89PNG")):
                return Outcome(False, error="the screenshot command printed no JPEG or PNG "
                                            "image")
        elif self.shoot is None:
            return Outcome(False, error=f"screenshot: this screen has no means: it needs "
                                        f"{NEEDS['screenshot']}")
        else:
            image, why = self.shoot()
            if image is None:
                return Outcome(False, error=f"screenshot: {why}"[:300])
        try:
            upload_id = self.enqueue(SCREENSHOT, image)
        except NotQueued as e:
            return Outcome(False, error=f"the screenshot was not queued: {e}")
        return Outcome(True, f"screenshot of {len(image)} bytes queued as upload {upload_id}",
                       extra={"upload_id": upload_id})

    def display(self, args: dict) -> Outcome:
        return drive(self.display_steps(args))

    def display_steps(self, args: dict) -> Job:
        if self.power is None:
            return Outcome(False, error=not_configured(args["state"]))
        turned = yield from self.power.turning(args["state"])
        if turned.error:
            return Outcome(False, error=turned.error)
        # ok: the command ran; whether the display is seen in that state is "confirmed"
        return Outcome(True, turned.said(), extra=turned.fields())

    def _screen_control(self, name: str) -> Callable[[dict], Outcome]:
        def act(args: dict) -> Outcome:
            if self.controls is None:
                return Outcome(False, error=f"{name}: this screen has no means: it needs "
                                            f"{NEEDS[name]}")
            done = self.controls.act(name, args)
            return Outcome(done.ok, done.output, done.error, dict(done.extra))
        return act

    def configure(self, args: dict) -> Outcome:
        if self._configure is None:
            return Outcome(False, error="this agent takes no settings from the fleet")
        staged, text = self._configure(args)
        return Outcome(True, text) if staged else Outcome(False, error=text)

    def restart_agent(self, args: dict) -> Outcome:
        self.request_restart()
        return LATER

    def reboot(self, args: dict) -> Outcome:
        return self._logind("reboot")

    def poweroff(self, args: dict) -> Outcome:
        # the screen stays dark until someone powers it on: its result, like a
        # reboot's, is told at the next start (commands/core.py's recover)
        return self._logind("poweroff")

    def _logind(self, verb: str) -> Outcome:
        """The reboot or power-off asked of logind; LATER once asked (the next start
        tells what came of it: commands/core.py's recover). A systemctl ended by a signal
        is LATER too: the device going down stops the agent's unit, and systemd signals
        its whole control group at once, a systemctl that was answered but had not exited
        yet with it. Reported as refused, a reboot that happened was a failure to the
        fleet. If it was the agent's own stop instead, the next start finds the same boot
        and says the command was interrupted."""
        signalled = False

        def run(argv: list[str]) -> str:
            nonlocal signalled
            r = self._run(argv)
            signalled = isinstance(r, ProgramFailed) and r.returncode < 0
            return (r.error or "failed") if isinstance(r, Outcome) else ""
        why = ask_logind(verb, run)
        if why and signalled:
            log.info("%s: %s; what came of it is told at the next start", verb, why)
            return LATER
        return Outcome(False, error=why) if why else LATER

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
            running = list(self._children)
        for child in running:
            children.kill_group(child)
        if self.updater is not None:
            self.updater.stop()

    # -- helpers ------------------------------------------------------------------
    def _shell(self, command: str):
        """The configured command's output, or an Outcome saying why it failed in
        children.failure's words: never its command line."""
        argv, why = children.split(command)
        return Outcome(False, error=why) if why else self._run(argv)

    def _start(self, argv: list[str], merge_stderr: bool = False):
        """``argv`` started, its process group killed on stop (the caller bounds it in
        time and calls _release), or an Outcome saying why not."""
        try:
            with self._lock:
                if self._stopping:
                    return Outcome(False, error="not run: the agent is stopping")
                # its process group is killed on timeout and on stop
                child = children.spawn(argv, merge_stderr=merge_stderr)
                self._children.add(child)
        except OSError as e:
            return Outcome(False, error=children.failure(argv, error=e))
        return child

    def _release(self, child) -> None:
        with self._lock:
            self._children.discard(child)

    def _run(self, argv: list[str]):
        """``argv``'s output, bounded and killed on stop, or an Outcome saying why not."""
        child = self._start(argv)
        if isinstance(child, Outcome):
            return child
        try:
            stdout, stderr = children.finish(child, self.timeout_s)
        except subprocess.TimeoutExpired:
            return Outcome(False, error=children.failure(argv, timeout_s=self.timeout_s))
        finally:
            self._release(child)
        if child.returncode != 0:
            return ProgramFailed(False, error=children.failure(argv, exited=child.returncode,
                                                               stderr=stderr),
                                 returncode=child.returncode)
        return subprocess.CompletedProcess(argv, child.returncode, stdout, stderr)

    def _path_mtu(self) -> int | None:
        sock = self.link_socket()
        if sock is None:
            return None
        try:
            return sock.getsockopt(socket.IPPROTO_IP, IP_MTU)
        except OSError:
            return None


class Bundle:
    """A logs bundle compressed as its lines arrive: what it holds in memory is the
    compressed bundle, bounded (lines past MAX_BUNDLE_BYTES are left out and counted)."""

    MAX_BUNDLE_BYTES = 4 << 20

    def __init__(self):
        self._out = io.BytesIO()
        self._gzip = gzip.GzipFile(fileobj=self._out, mode="wb", compresslevel=6)
        self.lines = 0
        self.dropped = 0

    def add(self, entry: dict) -> None:
        if self._out.tell() >= self.MAX_BUNDLE_BYTES:
            self.dropped += 1
            return
        self._gzip.write((b"\n" if self.lines else b"") + json.dumps(entry).encode())
        self.lines += 1

    def add_journal_entry(self, line: bytes) -> None:
        """One of journalctl's JSON lines, as the bundle's fields; a line it cannot
        read is left out."""
        try:
            entry = json.loads(line)
            message = entry.get("MESSAGE")
            if isinstance(message, list):  # journald's encoding of non-UTF-8 bytes
                message = bytes(message).decode(errors="replace")
            self.add({"ts": int(entry.get("__REALTIME_TIMESTAMP", 0)) / 1e6,
                      "priority": int(entry.get("PRIORITY", 6)), "pid": entry.get("_PID"),
                      "message": message})
        except (ValueError, TypeError, AttributeError, RecursionError):
            return

    def finish(self) -> bytes:
        self._gzip.close()
        return self._out.getvalue()


def _resolve(host: str, timeout: float) -> dict:
    """getaddrinfo has no timeout of its own: it gets a thread and a deadline."""
    answer: dict = {"host": host}

    def lookup():
        t0 = time.monotonic()
        found: dict = {}
        try:
            infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
            found["addresses"] = sorted({i[4][0] for i in infos})
        except OSError as e:
            found["error"] = str(e)
        found["ms"] = round((time.monotonic() - t0) * 1000, 1)
        answer.update(found)   # in one step: never half an answer

    lookup_thread = start_worker("dns-lookup", lookup, reason="getaddrinfo has no timeout of "
                                 "its own: the diagnostics wait for it a bounded time")
    if not lookup_thread.join(timeout):
        # a dict of its own: a late answer must not change the report as it is written
        return {"host": host, "error": f"no answer in {timeout:.0f}s"}
    return answer
