"""The agent's own journal lines, through a gate: the ``logs`` command without the
systemd-journal group.

Membership of systemd-journal would let the network-facing agent read every service's
journal. Instead, edge-agent-logs.socket (mode 0600, the edge-agent user's) starts
edge-agent-logs@.service for each connection: a sandboxed process with no network and
a dynamic user in systemd-journal, which reads one request line, checks it, and
answers with ``journalctl -u edge-agent.service -o json`` for that window and nothing
else. Both ends of that exchange are here:

    request  ``<since> <priority> <lines>\\n``: ASCII decimal integers, the window's
             start in epoch seconds, the lowest priority wanted (0-7), at most how many
             lines (the newest ones)
    reply    ``ok <n>\\n`` and n bytes of journalctl's JSON lines, or ``error <text>\\n``
"""
from __future__ import annotations

import re
import socket
import subprocess
import sys
from dataclasses import dataclass

from .logs import early

SOCKET = "/run/edge-agent-logs.sock"
UNIT = "edge-agent.service"
MAX_LINES = 20_000
# what a line of the bundle carries; journalctl adds its own timestamps and cursor
FIELDS = "MESSAGE,PRIORITY,_PID"
MAX_REQUEST = 64       # bytes: the longest request that parses is 26
MAX_HEADER = 512       # bytes: "ok <n>" or "error <one line>"
JOURNALCTL_TIMEOUT_S = 50.0  # under the helper unit's RuntimeMaxSec=60s
_REQUEST = re.compile(rb"(\d{1,12}) (\d{1,3}) (\d{1,6})\n")


class GateError(Exception):
    """A one-line reason the journal lines could not be had."""


@dataclass(frozen=True)
class Request:
    since: int      # epoch seconds
    priority: int   # 0 (emerg) .. 7 (debug): this and everything more urgent
    lines: int      # the newest this many of the window

    def __post_init__(self):
        if self.priority not in range(8):
            raise GateError(f"priority: {self.priority} is not 0-7")
        if not 1 <= self.lines <= MAX_LINES:
            raise GateError(f"lines: {self.lines} is not 1-{MAX_LINES}")
        if not 0 <= self.since < 10 ** 12:
            raise GateError(f"since: {self.since} is not an epoch second")

    def encode(self) -> bytes:
        return f"{self.since} {self.priority} {self.lines}\n".encode()

    def argv(self) -> list[str]:
        """journalctl for exactly this unit and window; nothing from the request
        reaches it but three checked integers."""
        return ["journalctl", "--no-pager", "--quiet", "--output=json",
                f"--output-fields={FIELDS}", f"--unit={UNIT}", f"--since=@{self.since}",
                f"--priority={self.priority}", f"--lines={self.lines}"]


def parse_request(raw: bytes) -> Request:
    if not raw.endswith(b"\n"):
        raise GateError("request: not one line ending in a newline")
    m = _REQUEST.fullmatch(raw)
    if m is None:
        raise GateError("request: expected '<since> <priority> <lines>', decimal integers")
    return Request(*(int(g) for g in m.groups()))


def reply_ok(body: bytes) -> bytes:
    return b"ok %d\n" % len(body) + body


def reply_error(text: str) -> bytes:
    return b"error " + " ".join(text.split()).encode(errors="replace")[:MAX_HEADER - 8] + b"\n"


def parse_header(line: bytes) -> int:
    """The body's length from a reply's first line, or the gate's error as GateError."""
    if line.startswith(b"ok ") and line.endswith(b"\n") and line[3:-1].isdigit():
        return int(line[3:-1])
    if line.startswith(b"error ") and line.endswith(b"\n"):
        raise GateError(line[6:-1].decode(errors="replace"))
    raise GateError(f"the gate answered {line[:60]!r}, not a reply")


# -- the helper's side: stdin and stdout are the connection -------------------------
def serve(rfile, wfile, run=subprocess.run) -> int:
    raw = rfile.readline(MAX_REQUEST)
    try:
        request = parse_request(raw)
        try:
            r = run(request.argv(), capture_output=True, timeout=JOURNALCTL_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise GateError(f"journalctl: {type(e).__name__}: {e}") from None
        if r.returncode != 0:
            raise GateError(f"journalctl exited {r.returncode}: "
                            f"{r.stderr.decode(errors='replace').strip()[:300]}")
        wfile.write(reply_ok(r.stdout))
        status = 0
    except GateError as e:
        early(f"edge-agent-logs: refused: {e}", 4)
        wfile.write(reply_error(str(e)))
        status = 1
    wfile.flush()
    return status


# -- the agent's side ---------------------------------------------------------------
def fetch(request: Request, timeout: float, path: str | None = None) -> bytes:
    """journalctl's JSON lines for ``request``, asked of the gate at ``path``."""
    path = path or SOCKET
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            sock.sendall(request.encode())
            with sock.makefile("rb") as f:
                length = parse_header(f.readline(MAX_HEADER))
                body = f.read(length)
    except FileNotFoundError:
        raise GateError(f"{path}: no such socket (edge-agent-logs.socket not running?)") from None
    except ConnectionRefusedError:
        raise GateError(f"{path}: nobody listens (edge-agent-logs.socket stopped?)") from None
    except TimeoutError:
        raise GateError(f"{path}: no answer in {timeout:g}s") from None
    except OSError as e:
        raise GateError(f"{path}: {e.strerror or e}") from None
    if len(body) != length:
        raise GateError(f"{path}: the reply was cut short ({len(body)} of {length} bytes)")
    return body


if __name__ == "__main__":
    sys.exit(serve(sys.stdin.buffer, sys.stdout.buffer))
